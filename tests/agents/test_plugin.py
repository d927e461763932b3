"""``env.name: agent``'s options: the endpoint's key from the environment (off the command
line), and errors that do not echo a secret."""

import subprocess
import sys

import pytest

from pearl.agents.plugin import API_KEY_ENV, AgentOptions
from pearl.errors import ConfigError

KEY = "sk-live-0123456789abcdef"


async def agent(seed, client, *, turns=1):
    return 1.0


def test_the_endpoint_key_comes_from_the_environment_when_the_config_has_none(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    assert AgentOptions.parse({"agent": "m:f"}).api_key == KEY
    assert AgentOptions.parse({"agent": "m:f", "host": "0.0.0.0"}).api_key == KEY
    # a key in the config wins, as vLLM's --api-key over VLLM_API_KEY
    assert AgentOptions.parse({"agent": "m:f", "api_key": "k" * 12}).api_key == "k" * 12
    monkeypatch.setenv(API_KEY_ENV, "short")
    with pytest.raises(ConfigError, match=f"{API_KEY_ENV}: .* at least 8 characters") as short:
        AgentOptions.parse({"agent": "m:f"})
    assert "short" not in str(short.value)


def test_off_loopback_without_a_key_the_error_names_the_environment_variable(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert AgentOptions.parse({"agent": "m:f"}).api_key is None  # loopback: no key needed
    with pytest.raises(ConfigError, match=f"needs api_key \\(set {API_KEY_ENV}"):
        AgentOptions.parse({"agent": "m:f", "host": "0.0.0.0"})


def test_a_run_with_the_key_in_the_environment_keeps_it_off_argv_and_config(tmp_path):
    """A process given the key in ``PEARL_AGENT_API_KEY`` serves off loopback with it while
    its command line holds no key, and the run's config (config.yaml, W&B) has none."""
    from pearl.config.loading import dump_config
    from pearl.config.train import load_train_config

    overrides = [
        "env.name=agent",
        "env.options.agent=pearl.agents.examples.calculator:solve",
        "env.options.host=0.0.0.0",
    ]
    cfg = load_train_config(None, overrides)
    script = (
        "import sys; from pearl.agents.plugin import AgentOptions\n"
        "options = AgentOptions.parse(dict(zip(sys.argv[1::2], sys.argv[2::2])))\n"
        "print(options.api_key); print(open('/proc/self/cmdline').read())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "agent", "m:f", "host", "0.0.0.0"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", API_KEY_ENV: KEY},
        timeout=60,
        check=True,
    )
    key, cmdline = done.stdout.split("\n", 1)
    assert key == KEY and KEY not in cmdline
    assert "api_key" not in dump_config(cfg)


def test_an_agent_that_cannot_take_its_kwargs_is_named_without_their_secrets():
    kwargs = {"openai_api_key": KEY, "wandb_key": KEY, "turns": 2, "level": 3}
    with pytest.raises(ConfigError, match="cannot be called") as refused:
        AgentOptions.parse({"agent": f"{__name__}:agent", "kwargs": kwargs}).load()
    message = str(refused.value)
    assert KEY not in message
    assert "'openai_api_key': '<redacted>'" in message and "'turns': 2" in message
