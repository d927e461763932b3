"""Where the live actors run: a private single-machine Ray runtime bound to loopback, or an
existing Ray cluster the user joins (``cluster.ray_address``); how rollout workers and the
trainer are placed on its nodes (Ray's own resources and scheduling strategies); and which
node each actor runs on, for the run folder."""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import sys
from typing import Any

from pearl.errors import ConfigError

# Ray (2.60) reads this when it is first imported: "0" makes the node's address the loopback
# one and its servers listen there only (otherwise they bind to every interface). A joined
# cluster needs the opposite (the node's reachable address), so the variable is set only on
# the way to a private runtime, never at import.
LOOPBACK_ONLY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def ensure_ray(num_cpus: int | None = None, address: str | None = None) -> None:
    """Connect this process to Ray unless it already is: ``address`` None starts a private
    single-machine runtime (no dashboard, every server on loopback, ``num_cpus`` logical
    slots); ``"auto"`` or ``"host:port"`` joins that running cluster as a driver."""
    if address is None:
        for key, value in LOOPBACK_ONLY_ENV.items():
            os.environ.setdefault(key, value)
        _private_token()
    import ray  # after ensure_ray's environment

    if ray.is_initialized():
        return
    if address is not None:
        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        except Exception as exc:
            reason = token_refusal(exc)
            if reason is None:
                raise
            raise ConfigError(
                token_refused_message("cluster.ray_address", address, reason)
            ) from None
        return
    from ray._private import ray_constants  # read only: did Ray's import see the variable?

    if ray_constants.ENABLE_RAY_CLUSTER:
        raise ConfigError(
            "ray was imported in this process before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was "
            "set, so a private runtime would listen on every network interface; set the "
            "variable before Python starts (or start PEARL before importing ray), or join a "
            "running cluster with cluster.ray_address"
        )
    ray.init(  # "local": always a new runtime, never a cluster this machine runs already
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )


AUTH_SETTINGS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _private_token() -> None:
    """A private runtime's own token, in this process's environment (which its raylet and
    workers inherit, and only its owner can read). Unset, Ray 2.52+ turns token
    authentication on for a new local runtime and writes the token to ~/.ray/auth_token with
    the umask's mode (0644: any local user could read it and join the runtime, which runs
    our code). Only before Ray's import, which reads the mode; a setting of the user's own is
    kept as it is."""
    if "ray" in sys.modules or any(name in os.environ for name in AUTH_SETTINGS):
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


# What Ray (2.52 and later) says when the cluster's token authentication refuses a driver:
# its AuthenticationError, raised directly (token mode here, no token found) or, once Ray has
# retried the head for ~20 s, as the text of the RuntimeError under its ConnectionError.
_TOKEN_REFUSED = ("AuthenticationError", "InvalidAuthToken")


def token_refusal(exc: BaseException) -> str | None:
    """Ray's reason when ``ray.init`` failed because the cluster's token authentication
    refused this driver (no token, or not the cluster's); None for any other failure."""
    seen: BaseException | None = exc
    for _ in range(8):  # the exception and what it was raised from
        if seen is None:
            break
        if type(seen).__name__ == "AuthenticationError":  # ray.exceptions' (Ray >= 2.52)
            return str(getattr(seen, "message", seen)).split(". ")[0]
        text = str(seen)
        for marker in _TOKEN_REFUSED:
            if marker in text:
                line = next(ln for ln in text.splitlines() if marker in ln)
                return line.split(marker, 1)[1].lstrip(": ").split(". ")[0]
        seen = seen.__cause__ or seen.__context__
    return None


def token_refused_message(setting: str, address: str, reason: str) -> str:
    """The one error a user sees when a cluster under token authentication refuses the
    driver: what to set, where (``setting`` is the config field that named the cluster)."""
    here = ", ".join(
        f"{name} {os.environ[name]!r}"
        if name in os.environ and name != "RAY_AUTH_TOKEN"
        else f"{name} {'set' if name in os.environ else 'unset'}"
        for name in AUTH_SETTINGS
    )
    return (
        f"{setting}={address!r}: Ray's token authentication refused this driver on the "
        f"cluster there ({reason}). For a cluster started with RAY_AUTH_MODE=token, set "
        "RAY_AUTH_MODE=token and the cluster's token, in RAY_AUTH_TOKEN or in a file named "
        "by RAY_AUTH_TOKEN_PATH (default ~/.ray/auth_token), in the environment of this "
        f"command: the same token as on every node (here: {here})"
    )


def process_death(exc: BaseException) -> bool:
    """Whether a call failed because its actor's process is gone: the actor died (killed,
    crashed, its node lost) or Ray's memory monitor killed the process in the middle of the
    call (``OutOfMemoryError``, which is not an actor error). An exception the actor's own
    code raised is not one."""
    import ray.exceptions as rex  # after ensure_ray's environment

    if isinstance(exc, rex.RayTaskError):  # the method raised (its cause's type mixed in)
        return False
    gone = (rex.RayActorError, rex.OutOfMemoryError, rex.WorkerCrashedError, rex.NodeDiedError)
    return isinstance(exc, gone)


def cpu_slots() -> float:
    """The CPU slots of the Ray instance this process is connected to (``ensure_ray``)."""
    import ray  # after ensure_ray's environment

    return float(ray.cluster_resources().get("CPU", 0))


@dataclasses.dataclass(frozen=True)
class Placement:
    """How the live actors are placed, with Ray's own mechanisms. Every actor takes one CPU
    slot; ``worker_resources`` / ``trainer_resources`` are further Ray resources they need
    (custom ones that nodes declare with ``ray start --resources``, or ``GPU``), so a user's
    node labels decide where each kind runs. Without ``trainer_resources`` the trainer runs
    on the driver's node, where the run folder (and its checkpoints) is."""

    worker_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    trainer_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    spread_workers: bool = False  # Ray's SPREAD strategy for rollout workers

    def worker_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": 1, "resources": dict(self.worker_resources)}
        if self.spread_workers:
            options["scheduling_strategy"] = "SPREAD"
        return options

    def trainer_options(self) -> dict[str, Any]:
        import ray  # after ensure_ray's environment

        options: dict[str, Any] = {"num_cpus": 1, "resources": dict(self.trainer_resources)}
        if not self.trainer_resources:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(here, soft=False)
        return options


def actor_location() -> dict[str, Any]:
    """Called inside an actor: the node it runs on (Ray's node id and address) and its pid."""
    import ray  # after ensure_ray's environment

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
    }
