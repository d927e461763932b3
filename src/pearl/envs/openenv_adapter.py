"""Any OpenEnv environment as a PEARL environment
(``env.name=pearl.envs.openenv_adapter:OpenEnvEnv``).

OpenEnv (PyPI ``openenv-core``) environments are gym-style: ``reset(seed=...)`` and
``step(Action)`` return typed ``Observation`` models carrying ``reward`` and ``done``. This
adapter keeps PEARL's protocol (text in, text out), so PEARL owns the conversation and the
tokens stay exactly the ones sampled. It maps:

- the model's reply to an ``Action``: with ``action_format: text`` the whole reply becomes the
  action's one required string field (DIPG's ``llm_response``, echo's ``message``); with
  ``json`` the reply is a JSON object (bare or in a ```json fence) of the action's fields.
  ``auto`` (default) is ``text`` when the action has exactly one required field and it is a
  string, else ``json``. A reply that does not parse or validate gets an observation saying
  the expected format and why it failed (reward 0); the episode goes on.
- an ``Observation`` to the next user message: its own fields (not ``done`` / ``reward`` /
  ``metadata``), empty ones left out; a single field as its text, several as ``name: value``
  lines (non-strings as JSON). ``observation_fields`` picks and orders them.
- reward: the observation's ``reward`` (``None`` counts as 0); done: its ``done``, or the
  ``max_turns``-th reply. Success: the episode ended with a turn whose reward is at least
  ``success_reward``.

Seeds: ``reset(seed=seed)`` when the environment's ``reset`` takes a ``seed``; held-out seeds
(``pearl.envs.base.HELDOUT_START`` and up) pass through unchanged, so they are held out only
if the environment draws its tasks from the seed. An environment whose ``reset`` takes no
seed is reset without one (``seeded`` is False): it picks its own task, so a GRPO group may
see different tasks and the held-out evaluation is not held out.

Two backends: in-process (``env``: ``package.module:Class`` of an OpenEnv ``Environment``,
``kwargs`` its constructor's arguments, ``action`` its ``Action`` class when ``step``'s
annotation does not name it), or ``base_url`` of a running OpenEnv server (served by
``openenv.core.env_server.create_app``): one WebSocket session per trajectory through
``openenv.core.GenericEnvClient``, opened at ``reset`` and ended by ``close``. The action
schema comes from the server's ``/schema``, fetched once per process and URL (the first
instance, made when the run starts: a server that is not there fails the run's start; one
that goes away later fails each trajectory's ``reset``, naming the URL). Differences from
in-process, all OpenEnv's: the server's ``max_concurrent_envs`` (1 unless set, and above 1
only for an environment marked ``SUPPORTS_CONCURRENT_SESSIONS``) must cover the
trajectories in flight, or ``reset`` fails with the server's "at capacity"; the server drops
an observation's ``metadata`` (``info["openenv_metadata"]`` is empty) and a ``seed`` its
environment's ``reset`` does not take (``seeded`` cannot tell, and is True); actions are
checked here only for their required fields, the rest by the server (a rejected one is a
malformed turn, without the server's reasons).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
from typing import Any

import pydantic

from pearl.envs.base import StepResult
from pearl.envs.registry import import_path
from pearl.errors import ConfigError

ACTION_FORMATS = ("auto", "text", "json")
# Fields of every OpenEnv Observation / Action that are bookkeeping, not content.
_OBSERVATION_BOOKKEEPING = frozenset({"done", "reward", "metadata"})
_ACTION_BOOKKEEPING = frozenset({"metadata"})
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n(.*?)\n?```$", re.DOTALL)
# The end of the RuntimeError GenericEnvClient raises when the server rejects an action.
_SERVER_REJECTED_ACTION = "(code: VALIDATION_ERROR)"
# Action schemas by server URL: fetched once per process, not once per trajectory.
_SERVER_SCHEMAS: dict[str, dict[str, Any]] = {}


class OpenEnvEnv:
    """An OpenEnv environment behind PEARL's ``reset(seed) -> str`` / ``step(text)``.

    Options (``env.options``): ``env`` + ``kwargs`` (+ ``action``), or ``base_url``;
    ``action_format``, ``observation_fields``, ``max_turns``, ``success_reward``,
    ``system_prompt`` (replaces the default one built from the action schema),
    ``instructions`` (appended to the default one).
    """

    name = "openenv"

    def __init__(
        self,
        env: str | None = None,
        kwargs: dict[str, Any] | None = None,
        action: str | None = None,
        base_url: str | None = None,
        action_format: str = "auto",
        observation_fields: list[str] | None = None,
        max_turns: int = 8,
        success_reward: float = 1.0,
        system_prompt: str | None = None,
        instructions: str = "",
    ) -> None:
        if (env is None) == (base_url is None):
            raise ValueError(
                "give exactly one of env (an OpenEnv Environment class, 'package.module:Class') "
                f"and base_url (a running OpenEnv server), got env={env!r}, base_url={base_url!r}"
            )
        if action_format not in ACTION_FORMATS:
            raise ValueError(
                f"action_format must be one of {ACTION_FORMATS}, got {action_format!r}"
            )
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if base_url is not None and (kwargs or action):
            raise ValueError("kwargs and action are for env (in-process); a server has its own")
        self.max_turns = max_turns
        self.success_reward = success_reward
        self.observation_fields = observation_fields
        self._client: Any = None
        self._base_url = base_url
        if env is not None:
            env_cls = import_path(env, "env.options.env", "Class")
            if not inspect.isclass(env_cls) or not callable(getattr(env_cls, "step", None)):
                raise ValueError(f"env {env!r} is not an OpenEnv Environment class")
            self._action_cls = _action_class(env_cls, action)
            self._schema: dict[str, Any] = self._action_cls.model_json_schema()
            try:
                self._env: Any = env_cls(**(kwargs or {}))
            except Exception as exc:  # the environment's own constructor: name it and its options
                raise ValueError(
                    f"kwargs: {env} rejected {sorted(kwargs or {})}: {type(exc).__name__}: {exc}"
                ) from exc
            self.seeded = _takes(self._env.reset, "seed")
            label = env_cls.__name__
        else:
            self._env = None
            self._action_cls = None
            self._schema = _server_action_schema(base_url)
            self.seeded = True  # the server's reset takes seed (OpenEnv's ResetRequest)
            label = f"the OpenEnv server at {base_url}"
        self.text_field = _text_field(self._schema, action_format)
        self.system_prompt = (
            system_prompt
            if system_prompt is not None
            else _default_prompt(label, self._schema, self.text_field, instructions)
        )
        self.turns = 0
        self.last_reward = 0.0
        self.done = False

    # -- the PEARL protocol ----------------------------------------------------------------

    async def reset(self, seed: int) -> str:
        self.turns, self.last_reward, self.done = 0, 0.0, False
        if self._env is not None:
            call = (lambda: self._env.reset(seed=seed)) if self.seeded else self._env.reset
            observation = _fields(await asyncio.to_thread(call))
        else:
            observation = await self._open_session(seed)
        return self.render(observation)

    async def _open_session(self, seed: int) -> dict[str, Any]:
        """A new WebSocket session on the server, reset: its first observation's fields."""
        from openenv.core import GenericEnvClient  # optional

        await self.close()  # a previous episode's session, if any
        self._client = GenericEnvClient(base_url=self._base_url)
        try:
            await self._client.connect()
            return (await self._client.reset(seed=seed)).observation
        except Exception as exc:
            # A server at capacity answers the connection with an error, then closes it:
            # the send of "reset" fails, and the reason is the message already received.
            reason = await _pending_error(self._client) or f"{type(exc).__name__}: {exc}"
            await self.close()
            raise ConnectionError(
                f"base_url: no session from the OpenEnv server at {self._base_url}: {reason}"
            ) from exc

    async def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError("step() after the episode ended")
        self.turns += 1
        capped = self.turns >= self.max_turns
        try:
            payload = self.parse(action)
        except ValueError as exc:
            self.done = capped
            return StepResult(f"{exc} {self.format_hint()}", 0.0, capped, {"malformed": True})
        if self._env is not None:
            obs = await asyncio.to_thread(self._env.step, self._action_cls(**payload))
            fields, reward, done = _fields(obs), obs.reward, obs.done
        else:
            if self._client is None:
                raise RuntimeError("step() before reset()")
            try:
                result = await self._client.step(payload)
            except RuntimeError as exc:  # the server's pydantic said no: the model's turn
                if not str(exc).endswith(_SERVER_REJECTED_ACTION):
                    raise
                self.done = capped
                message = "Your action is invalid (the server rejected it)."
                return StepResult(
                    f"{message} {self.format_hint()}", 0.0, capped, {"malformed": True}
                )
            fields, reward, done = result.observation, result.reward, result.done
        self.last_reward = float(reward or 0.0)
        self.done = bool(done) or capped
        info = {"openenv_metadata": fields.get("metadata") or {}}
        return StepResult(self.render(fields), self.last_reward, self.done, info)

    @property
    def success(self) -> bool:
        return self.done and self.last_reward >= self.success_reward

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._env is not None and callable(getattr(self._env, "close", None)):
            await asyncio.to_thread(self._env.close)

    # -- text <-> OpenEnv ------------------------------------------------------------------

    def parse(self, reply: str) -> dict[str, Any]:
        """The action's fields from the model's reply; ``ValueError`` saying what is wrong."""
        if self.text_field is not None:
            payload: dict[str, Any] = {self.text_field: reply}
        else:
            text = reply.strip()
            fenced = _FENCE.match(text)
            try:
                payload = json.loads(fenced.group(1) if fenced else text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"Your reply is not JSON ({exc.msg}).") from None
            if not isinstance(payload, dict):
                raise ValueError(f"Your reply is JSON {type(payload).__name__}, not an object.")
        if self._action_cls is None:  # a server's: its required fields here, the rest there
            missing = [f for f in self._schema.get("required", []) if f not in payload]
            if missing:
                problems = "; ".join(f"{f}: Field required" for f in missing)
                raise ValueError(f"Your action is invalid ({problems}).")
        else:  # validate here, so a bad action is the model's turn
            try:
                self._action_cls(**payload)
            except pydantic.ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'action'}: {e['msg']}" for e in exc.errors()
                )
                raise ValueError(f"Your action is invalid ({problems}).") from None
        return payload

    def format_hint(self) -> str:
        if self.text_field is not None:
            return "Reply with the action text."
        return f"Reply with one JSON object with the fields {_describe(self._schema)}."

    def render(self, observation: dict[str, Any]) -> str:
        """The next user message: the observation's own non-empty fields."""
        names = self.observation_fields or [
            k for k in observation if k not in _OBSERVATION_BOOKKEEPING
        ]
        shown = {
            k: observation.get(k) for k in names if observation.get(k) not in (None, "", [], {})
        }
        if len(shown) == 1:
            (value,) = shown.values()
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return "\n".join(
            f"{k}: {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
            for k, v in shown.items()
        )


def _fields(observation: Any) -> dict[str, Any]:
    return observation.model_dump() if hasattr(observation, "model_dump") else dict(observation)


def _takes(method: Any, parameter: str) -> bool:
    params = inspect.signature(method).parameters
    return parameter in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _action_class(env_cls: type, action: str | None) -> type:
    """The Action model: the ``action`` option, else ``step``'s annotation or the class's
    ``Environment[Action, ...]`` parameter."""

    if action is not None:
        found = import_path(action, "env.options.action", "Class")
    else:
        found = None
        try:
            found = typing.get_type_hints(env_cls.step).get("action")
        except Exception:  # unresolvable annotations: fall back to the generic parameter
            pass
        if not (inspect.isclass(found) and issubclass(found, pydantic.BaseModel)):
            found = next(
                (
                    typing.get_args(base)[0]
                    for base in getattr(env_cls, "__orig_bases__", ())
                    if typing.get_args(base)
                ),
                None,
            )
    if not (inspect.isclass(found) and issubclass(found, pydantic.BaseModel)):
        raise ConfigError(
            f"env.options.action: {env_cls.__name__}'s Action class is not in its step() "
            f"annotation; give it as 'package.module:Class' (a pydantic model), got {found!r}"
        )
    return found


def _server_action_schema(base_url: str) -> dict[str, Any]:
    """The server's action schema, from its ``/schema`` the first time this URL is seen."""
    import httpx  # optional (openenv)

    if base_url in _SERVER_SCHEMAS:
        return _SERVER_SCHEMAS[base_url]
    url = base_url.rstrip("/") + "/schema"
    try:
        response = httpx.get(url, timeout=10)
        response.raise_for_status()
        schema = response.json()["action"]
    except Exception as exc:
        raise ValueError(
            f"base_url: no OpenEnv schema at {url}: {type(exc).__name__}: {exc}"
        ) from exc
    _SERVER_SCHEMAS[base_url] = schema
    return schema


async def _pending_error(client: Any) -> str | None:
    """The error message the server sent before closing the session, if one is waiting."""
    try:
        raw = await asyncio.wait_for(client._ws.recv(), timeout=1.0)
        message = json.loads(raw)
    except Exception:  # nothing waiting, or not OpenEnv's error message: no better reason
        return None
    if isinstance(message, dict) and message.get("type") == "error":
        data = message.get("data") or {}
        return f"{data.get('message', 'error')} (code: {data.get('code', 'UNKNOWN')})"
    return None


def _text_field(schema: dict[str, Any], action_format: str) -> str | None:
    """The field a whole reply fills (text), or None (JSON)."""
    if action_format == "json":
        return None
    required = [f for f in schema.get("required", []) if f not in _ACTION_BOOKKEEPING]
    props = schema.get("properties", {})
    single = len(required) == 1 and props.get(required[0], {}).get("type") == "string"
    if single:
        return required[0]
    if action_format == "text":
        raise ValueError(
            f"action_format: text needs an action with one required string field; this one "
            f"has {_describe(schema)} (use action_format: json)"
        )
    return None


def _describe(schema: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    parts = [
        f"{name} ({spec.get('type', 'any')}{', required' if name in required else ''})"
        for name, spec in schema.get("properties", {}).items()
        if name not in _ACTION_BOOKKEEPING
    ]
    return ", ".join(parts) or "none"


def _default_prompt(label: str, schema: dict[str, Any], text_field: str | None, extra: str) -> str:
    if text_field is not None:
        how = f"Your whole reply is the action: it is sent as its {text_field!r} field."
    else:
        properties = {
            k: v for k, v in schema.get("properties", {}).items() if k not in _ACTION_BOOKKEEPING
        }
        how = (
            "Reply with one JSON object, the action, and nothing else. Its JSON schema: "
            + json.dumps({"properties": properties, "required": schema.get("required", [])})
        )
    return " ".join(p for p in (f"You act in {label}, one action per reply.", how, extra) if p)
