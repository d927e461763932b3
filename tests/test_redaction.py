"""Secrets stay out of what a run writes: config.yaml holds ``<redacted>``, and a resumed
run asks for them again instead of running with the marker as a key."""

import pytest

from pearl.config.loading import dump_config
from pearl.config.train import load_train_config
from pearl.errors import ConfigError
from pearl.redaction import REDACTED, is_secret_key, redact_secrets
from pearl.report.run_folder import RunFolder

KEY = "sk-live-0123456789abcdef"


@pytest.mark.parametrize(
    "name",
    [
        "api_key",
        "apiKey",
        "API-KEY",
        "hf_token",
        "token",
        "clientSecret",
        "password",
        "AWS_SECRET_ACCESS_KEY",
        "private_key",
        "db_passwd",
        "credentials",
        "openai_key",
        "wandb_key",
        "ssh_key",
        "openaiKey",
        "api_keys",
        "signing_key",
        "authorization",
        "Authorization",
        "proxy_authorization",
        "bearer",
        "cookie",
        "Set-Cookie",
        "session_cookies",
        "basic_auth",
    ],
)
def test_secret_names(name):
    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name",
    [
        "max_new_tokens",
        "stop_token_ids",
        "tokenizer",
        "key",
        "keys",
        "monkey",
        "run_name",
        "max_num_batched_tokens",
        "loss_norm_tokens",
        "host",
        "num_key_value_heads",
        "prompt_key",
        "response_key",
        "reward_fn_key",
        "tools_key",
        "sort_key",
        "public_key",
        "rng_key",
        "pad_token",
        "eos_token",
        "auth_mode",
        "cookie_name",
    ],
)
def test_names_that_are_not_secrets(name):
    assert not is_secret_key(name)


def test_redaction_reaches_nested_options_and_keeps_nulls():
    config = {
        "env": {"options": {"api_key": KEY, "kwargs": {"hf_token": KEY, "level": 3}}},
        "servers": [{"password": KEY, "host": "h"}],
        "other": {"token": None},
    }
    assert redact_secrets(config) == {
        "env": {"options": {"api_key": REDACTED, "kwargs": {"hf_token": REDACTED, "level": 3}}},
        "servers": [{"password": REDACTED, "host": "h"}],
        "other": {"token": None},
    }
    assert config["env"]["options"]["api_key"] == KEY  # a copy: the run keeps its key


@pytest.mark.parametrize(
    "text, shown",
    [
        ("https://user:hunter22@host/v1", "https://user:<redacted>@host/v1"),
        ("https://ghp_0123456789@github.com/o/r.git", "https://<redacted>@github.com/o/r.git"),
        ("postgresql://u:p@ss@db:5432/x", "postgresql://u:<redacted>@db:5432/x"),
        ("see redis://:pw@cache:6379 and", "see redis://:<redacted>@cache:6379 and"),
        ("http://h:8000/v1?api_key=abc&model=m", "http://h:8000/v1?api_key=<redacted>&model=m"),
        ("http://h/cb?token=abc#top", "http://h/cb?token=<redacted>#top"),
        ("ray://10.0.0.1:10001", "ray://10.0.0.1:10001"),
        ("http://h/search?q=a@b&page=2", "http://h/search?q=a@b&page=2"),
        ("alice@example.com", "alice@example.com"),
    ],
)
def test_credentials_in_urls_are_redacted_in_any_string(text, shown):
    assert redact_secrets({"base_url": text, "urls": [text]}) == {
        "base_url": shown,
        "urls": [shown],
    }


def test_a_config_whose_url_held_credentials_asks_for_it_again(tmp_path):
    saved = tmp_path / "config.yaml"
    kwargs = {"db": "postgresql://u:pw0123@db/x", "prompt_key": "question"}
    saved.write_text(
        dump_config(
            load_train_config(
                None,
                [
                    "env.name=agent",
                    "env.options.agent=pearl.agents.examples.calculator:solve",
                    f"env.options.kwargs={kwargs}",
                ],
            )
        )
    )
    assert "pw0123" not in saved.read_text() and "question" in saved.read_text()
    with pytest.raises(ConfigError, match="env.options.kwargs.db holds '<redacted>'"):
        load_train_config(saved)


def test_config_yaml_keeps_no_api_key_and_a_resume_asks_for_it_again(tmp_path):
    overrides = [
        "env.name=agent",
        "env.options.agent=pearl.agents.examples.calculator:solve",
        f"env.options.api_key={KEY}",
        "env.options.kwargs.hf_token=hf_0123456789",
        f"run.run_dir={tmp_path}",
    ]
    cfg = load_train_config(None, overrides)
    run = RunFolder(tmp_path, "agent")
    run.write_config(dump_config(cfg))  # as pearl train writes it
    run.close()
    saved = run.path / "config.yaml"
    text = saved.read_text()
    assert KEY not in text and "hf_0123456789" not in text
    assert text.count(REDACTED) == 2
    with pytest.raises(ConfigError) as refused:  # not a run with "<redacted>" as its key
        load_train_config(saved)
    message = str(refused.value)
    assert "env.options.api_key, env.options.kwargs.hf_token hold '<redacted>'" in message
    assert "(env.options.api_key=null env.options.kwargs.hf_token=..., " in message
    assert "the agent endpoint key exported as $PEARL_AGENT_API_KEY" in message
    again = load_train_config(
        saved, [f"env.options.api_key={KEY}", "env.options.kwargs.hf_token=hf_0123456789"]
    )
    assert again.env.options["api_key"] == KEY
    assert again.env.options["kwargs"]["hf_token"] == "hf_0123456789"


def test_a_config_error_does_not_echo_a_secret(tmp_path):
    with pytest.raises(ConfigError) as refused:  # a misspelt section holding a key
        load_train_config(None, [f"env.option.api_key={KEY}"])
    assert KEY not in str(refused.value) and REDACTED in str(refused.value)


def test_the_resume_command_takes_the_agent_key_from_the_environment(tmp_path, monkeypatch):
    """The command a stopped run prints: the endpoint key through ``PEARL_AGENT_API_KEY``
    (``env.options.api_key=null``), never as an override on the command line; the other
    secrets as overrides. Run as printed, it loads and serves with the key."""
    import shlex

    from pearl.agents.plugin import API_KEY_ENV, AgentOptions
    from pearl.apps.train.run import resume_command
    from pearl.config import loading as config_module

    assert config_module.AGENT_KEY_ENV == API_KEY_ENV  # the loader names it
    cfg = load_train_config(
        None,
        [
            "env.name=agent",
            "env.options.agent=pearl.agents.examples.calculator:solve",
            "env.options.host=0.0.0.0",
            f"env.options.api_key={KEY}",
            "env.options.kwargs.hf_token=hf_0123456789",
        ],
    )
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.yaml").write_text(dump_config(cfg))
    told = resume_command(cfg, folder, folder / "checkpoints" / "v4", 6)
    note, command = told.split(" with: ")
    assert f"${API_KEY_ENV}" in note and KEY not in told
    argv = shlex.split(command)
    assert argv[:6] == ["pearl", "train", "--config", str(folder / "config.yaml"), "--resume"] + [
        str(folder / "checkpoints" / "v4")
    ]
    overrides = argv[6:]
    assert overrides == [
        "run.steps=6",
        "run.run_name=run-resumed",
        "env.options.api_key=null",
        "env.options.kwargs.hf_token=...",
    ]
    overrides[-1] = "env.options.kwargs.hf_token=hf_0123456789"
    monkeypatch.setenv(API_KEY_ENV, KEY)
    again = load_train_config(folder / "config.yaml", overrides)
    assert AgentOptions.parse(again.env.options).api_key == KEY
    # a run that had its key from the environment: the command says to set it again
    from_env = load_train_config(folder / "config.yaml", overrides)
    told = resume_command(from_env, folder, folder / "checkpoints" / "v4", 6)
    assert told.startswith(f", ${API_KEY_ENV} set as in this run, with: pearl train")
    assert "api_key" not in told
