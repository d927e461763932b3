"""Where the live actors run: a private single-machine Ray runtime bound to loopback, or an
existing Ray cluster the user joins (``cluster.ray_address``); how rollout workers and the
trainer are placed on its nodes (Ray's own resources and scheduling strategies); and which
node each actor runs on, for the run folder."""

from __future__ import annotations

import dataclasses
import logging
import os
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
    import ray

    if ray.is_initialized():
        return
    if address is not None:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
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
        import ray

        options: dict[str, Any] = {"num_cpus": 1, "resources": dict(self.trainer_resources)}
        if not self.trainer_resources:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(here, soft=False)
        return options


def actor_location() -> dict[str, Any]:
    """Called inside an actor: the node it runs on (Ray's node id and address) and its pid."""
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
    }
