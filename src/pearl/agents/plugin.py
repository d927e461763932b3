"""``env.name: agent``: which agent program to train, and how its endpoint is served.

``env.options`` names the agent (``agent: package.module:function``, a function taking
``(seed, client, **kwargs)``: an ``async def`` runs on the run's event loop, a plain
``def`` in a thread of its own) and sets the endpoint (``pearl.agents.endpoint``) and the
per-episode limits. Checked before any actor starts: a misspelt option, a missing module
or something that cannot be called so fails here with what would be valid.
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pearl.agents.endpoint import LOOPBACK, is_loopback
from pearl.envs.registry import import_path
from pearl.errors import ConfigError

AGENT_ENV = "agent"  # the env.name that selects an agent program


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
        None, min_length=8, description="checked on every call; required off loopback"
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
                "machine needs api_key"
            )
        return self

    @classmethod
    def parse(cls, options: dict[str, Any]) -> AgentOptions:
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
                f"agent(seed, client, **{self.kwargs!r}): {exc}"
            ) from None
        return fn
