"""Environments by name: entry points (the built-ins register that way), ``module:Class``
paths, and the errors a bad plug-in gets before any actor starts."""

import textwrap

import pytest

from pearl.envs import installed_envs, make_env
from pearl.envs.calculator import CalculatorEnv
from pearl.envs.guess import GuessEnv
from pearl.envs.registry import env_factory
from pearl.errors import ConfigError


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A module ``my_envs`` on sys.path with one good environment and several bad ones."""
    (tmp_path / "my_envs.py").write_text(
        textwrap.dedent(
            """
            from pearl.envs.base import StepResult

            class Echo:
                system_prompt = "Say it back."

                def __init__(self, word="hi"):
                    self.word = word
                    self.success = False

                def reset(self, seed):  # plain functions are accepted too
                    return f"Say {self.word}."

                def step(self, action):
                    self.success = self.word in action
                    return StepResult("ok", float(self.success), True)

            def not_a_class():
                return Echo()

            class NoStep:
                system_prompt = "x"
                success = False

                async def reset(self, seed):
                    return "x"

            class ToolsNoCall:
                system_prompt = "x"
                success = False
                tools = [{"name": "f"}]

                async def reset(self, seed):
                    return "x"

                async def step(self, action):
                    return StepResult("x", 0.0, True)

            class NoPrompt:
                success = False

                async def reset(self, seed):
                    return "x"

                async def step(self, action):
                    return StepResult("x", 0.0, True)
            """
        )
    )
    (tmp_path / "broken_env.py").write_text("import no_such_dependency_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_builtins_are_entry_points():
    known = installed_envs()
    assert known["calculator"].load() is CalculatorEnv and known["guess"].load() is GuessEnv
    assert isinstance(make_env("guess", high=8), GuessEnv)


def test_a_module_class_path_makes_fresh_instances(plugins):
    env = make_env("my_envs:Echo", word="yo")
    assert env.word == "yo" and env.reset(0) == "Say yo."
    make = env_factory("my_envs:Echo", {"word": "ok"})
    a, b = make(), make()
    assert a is not b and a.word == b.word == "ok"


@pytest.mark.parametrize(
    "name, message",
    [
        ("chess", r"unknown environment 'chess'; installed: .*calculator.*guess"),
        ("no_such_module_x:Env", r"module 'no_such_module_x' not found.*installed"),
        ("broken_env:Env", r"importing 'broken_env' failed: ModuleNotFoundError"),
        ("my_envs:Missing", r"has no attribute 'Missing'; it has: .*Echo"),
        ("my_envs:not_a_class", r"is a function, not a class"),
        ("my_envs:NoStep", r"has no step method"),
        ("my_envs:NoPrompt", r"system_prompt string"),
        ("my_envs:ToolsNoCall", r"declares tools but has no call_tool"),
        ("my_envs:", r"is not 'package.module:Class'"),
    ],
)
def test_bad_plugins_get_errors_that_say_what_and_where(plugins, name, message):
    with pytest.raises(ConfigError, match=message) as info:
        make_env(name)
    assert str(info.value).startswith("env.name")


def test_bad_options_name_the_environment(plugins):
    with pytest.raises(ConfigError, match=r"env.options: environment 'my_envs:Echo'.*colour"):
        env_factory("my_envs:Echo", {"colour": "red"})
    with pytest.raises(ConfigError, match=r"env.options: environment 'guess'"):
        make_env("guess", high=1)  # the environment's own ValueError
