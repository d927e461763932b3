"""Environments by name: entry points of the ``pearl.envs`` group, or ``package.module:Class``.

A package makes its environments known by declaring them in its ``pyproject.toml``::

    [project.entry-points."pearl.envs"]
    unscramble = "pearl_env_unscramble:UnscrambleEnv"

The two built-in environments register the same way (PEARL's own ``pyproject.toml``). A
name with a colon is imported directly, for a class that no installed package declares.
Whatever the source, the class is checked before any actor starts: a class, with
``reset`` / ``step`` methods, and instances with a system prompt and a ``success`` flag.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pearl.envs.tools import check_tools
from pearl.errors import ConfigError

ENTRY_POINT_GROUP = "pearl.envs"

_METHODS = ("reset", "step")


def installed_envs() -> dict[str, EntryPoint]:
    """The environments installed packages declare, by name."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def resolve_env_class(name: str) -> type:
    """The environment class ``name`` names (an entry point, or ``module:Class``)."""
    if ":" in name:
        cls = import_path(name, "env.name", "Class")
    else:
        known = installed_envs()
        if name not in known:
            choices = ", ".join(sorted(known)) or "none installed"
            raise ConfigError(
                f"env.name: unknown environment {name!r}; installed: {choices}; or give "
                f"'package.module:Class' (packages declare theirs under the "
                f"{ENTRY_POINT_GROUP!r} entry-point group)"
            )
        try:
            cls = known[name].load()
        except Exception as exc:  # the plug-in's own import failed
            raise ConfigError(
                f"env.name: environment {name!r} ({known[name].value}) failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    check_env_class(cls, name)
    return cls


def import_path(name: str, where: str, what: str) -> Any:
    """The object ``package.module:Attr`` names; ``ConfigError`` (prefixed ``where``) saying
    why not. ``what`` names the expected attribute in messages (Class, function)."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{where}: {name!r} is not 'package.module:{what}'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if not (module_name == missing or module_name.startswith(missing + ".")):  # a dependency
            raise ConfigError(
                f"{where}: importing {module_name!r} failed: ModuleNotFoundError: {exc}"
            ) from exc
        raise ConfigError(
            f"{where}: module {module_name!r} not found ({exc}); is its package installed "
            f"in this environment (pip install -e <folder>)?"
        ) from exc
    except Exception as exc:
        raise ConfigError(
            f"{where}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))
            raise ConfigError(
                f"{where}: module {module_name!r} has no attribute {attr!r}; it has: "
                f"{', '.join(public) or 'nothing public'}"
            )
        obj = getattr(obj, part)
    return obj


def check_env_class(cls: Any, name: str) -> None:
    """Raise ``ConfigError`` unless ``cls`` looks like an environment class."""
    if not inspect.isclass(cls):
        raise ConfigError(
            f"env.name: {name!r} is a {type(cls).__name__}, not a class; name the "
            f"environment's class (a fresh instance is made per trajectory)"
        )
    missing = [m for m in _METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ConfigError(
            f"env.name: {name!r} ({cls.__module__}.{cls.__qualname__}) has no "
            f"{' / '.join(missing)} method; an environment needs reset(seed) -> str and "
            f"step(action) -> StepResult (docs/environments.md)"
        )


def check_env_instance(env: Any, name: str) -> None:
    """Raise ``ConfigError`` unless a fresh instance has what the episode reads."""
    where = f"env.name: {name!r}"
    if not isinstance(getattr(env, "system_prompt", None), str):
        raise ConfigError(f"{where}: instances need a system_prompt string")
    demonstration = getattr(env, "demonstration", ())
    if not isinstance(demonstration, tuple | list) or not all(
        isinstance(m, tuple | list) and len(m) == 2 and all(isinstance(x, str) for x in m)
        for m in demonstration
    ):
        raise ConfigError(f"{where}: demonstration must be (role, text) string pairs")
    if not hasattr(type(env), "success") and not hasattr(env, "success"):
        raise ConfigError(f"{where}: instances need a success flag (property or attribute)")
    tools = getattr(env, "tools", None)
    if tools:
        try:
            check_tools(tools, "tools")
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if not callable(getattr(env, "call_tool", None)):
            raise ConfigError(f"{where}: declares tools but has no call_tool(name, arguments)")


def make_env(name: str, **options: Any) -> Any:
    """A fresh environment ``name`` with ``options`` as its constructor's arguments."""
    return _make(resolve_env_class(name), name, options)


def env_factory(name: str, options: dict[str, Any]) -> Callable[[], Any]:
    """A maker of fresh ``name`` environments: the class is resolved and one instance is
    made and checked now, so a bad name or option fails before any actor starts."""
    cls = resolve_env_class(name)
    _make(cls, name, options)
    return lambda: _make(cls, name, options)


def _make(cls: type, name: str, options: dict[str, Any]) -> Any:
    try:
        env = cls(**options)
    except TypeError as exc:  # an unknown or missing option
        raise ConfigError(f"env.options: environment {name!r}: {exc}") from None
    except ValueError as exc:  # the environment rejected an option's value
        raise ConfigError(f"env.options: environment {name!r}: {exc}") from None
    check_env_instance(env, name)
    return env
