"""``env.name: agent``: which agent program to train, and how its endpoint is served.

``env.options`` names the agent (``agent: package.module:function``, a function taking
``(seed, client, **kwargs)``: an ``async def`` runs on the run's event loop, a plain
``def`` in a thread of its own) and sets the endpoint (``pearl.agents.endpoint``) and the
per-episode limits. Checked before any actor starts: a misspelt option, a missing module
or something that cannot be called so fails here with what would be valid.

The endpoint's key is ``env.options.api_key`` or, when that is null, the environment
variable ``PEARL_AGENT_API_KEY`` (read when the options are parsed), as vLLM takes
``--api-key`` or ``VLLM_API_KEY``: a key in the environment is not in the process's
command line, which every local user can read (``ps``) and W&B would record.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pearl.agents.endpoint import LOOPBACK, is_loopback
from pearl.envs.registry import import_path
from pearl.errors import ConfigError
from pearl.redaction import redact_secrets

AGENT_ENV = "agent"  # the env.name that selects an agent program
API_KEY_ENV = "PEARL_AGENT_API_KEY"  # the endpoint's key when env.options.api_key is null
MIN_KEY_LENGTH = 8


class AgentOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str = Field(
        description="the agent: package.module:function (async def, or a plain def: a thread)"
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments for every call of the agent"
    )
    episode_timeout_s: float | None = Field(
        600.0, gt=0, description="seconds one episode may take (null: no limit)"
    )
    success_reward: float = Field(
        1.0, description="a returned number counts as success from this reward up"
    )
    host: str = Field(LOOPBACK, description="the endpoint's address (loopback by default)")
    port: int = Field(0, ge=0, le=65535, description="the endpoint's port (0: a free one)")
    api_key: str | None = Field(
        None,
        min_length=MIN_KEY_LENGTH,
        description=f"checked on every call; required off loopback (null: ${API_KEY_ENV})",
    )
    max_request_bytes: int = Field(4 << 20, ge=1024, description="the largest request body")
    served_model: str = Field(
        "pearl-policy", min_length=1, description="the model name agents pass in calls"
    )

    @model_validator(mode="after")
    def _key_off_loopback(self) -> AgentOptions:
        if not is_loopback(self.host) and not self.api_key:
            raise ValueError(
                f"host {self.host!r} is not a loopback address; serving agents beyond this "
                f"machine needs api_key (set {API_KEY_ENV} in the environment)"
            )
        return self

    @classmethod
    def parse(cls, options: dict[str, Any]) -> AgentOptions:
        """``env.options`` checked, the key taken from ``$PEARL_AGENT_API_KEY`` when
        ``api_key`` is null."""
        from_env = os.environ.get(API_KEY_ENV)
        if isinstance(options, dict) and options.get("api_key") is None and from_env:
            if len(from_env) < MIN_KEY_LENGTH:
                raise ConfigError(
                    f"{API_KEY_ENV}: the agent endpoint's key must have at least "
                    f"{MIN_KEY_LENGTH} characters (it has {len(from_env)})"
                )
            options = {**options, "api_key": from_env}
        try:
            return cls.model_validate(options)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "host"
            fields = ", ".join(cls.model_fields)
            raise ConfigError(
                f"env.options.{where}: {first['msg']} (env.name: agent takes {fields})"
            ) from None

    def load(self) -> Any:
        """The agent function, checked."""
        fn = import_path(self.agent, "env.options.agent", "function")
        if not callable(fn):
            raise ConfigError(
                f"env.options.agent: {self.agent!r} is a {type(fn).__name__}, not a function; "
                "an agent is `async def agent(seed, client, **kwargs)` (or a plain `def`) "
                "returning its reward"
            )
        try:
            inspect.signature(fn).bind(0, None, **self.kwargs)
        except TypeError as exc:
            raise ConfigError(
                f"env.options.agent: {self.agent!r} cannot be called as "
                f"agent(seed, client, **{redact_secrets(self.kwargs)!r}): {exc}"
            ) from None
        return fn
