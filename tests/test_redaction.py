"""Secrets stay out of what a run writes: config.yaml holds ``<redacted>``, and a resumed
run asks for them again instead of running with the marker as a key."""

import pytest

from pearl.apps.train.config import load_train_config
from pearl.config import ConfigError, dump_config
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
    assert "env.options.api_key, env.options.kwargs.hf_token are '<redacted>'" in message
    assert "env.options.api_key=... env.options.kwargs.hf_token=..." in message
    again = load_train_config(
        saved, [f"env.options.api_key={KEY}", "env.options.kwargs.hf_token=hf_0123456789"]
    )
    assert again.env.options["api_key"] == KEY
    assert again.env.options["kwargs"]["hf_token"] == "hf_0123456789"


def test_a_config_error_does_not_echo_a_secret(tmp_path):
    with pytest.raises(ConfigError) as refused:  # a misspelt section holding a key
        load_train_config(None, [f"env.option.api_key={KEY}"])
    assert KEY not in str(refused.value) and REDACTED in str(refused.value)
