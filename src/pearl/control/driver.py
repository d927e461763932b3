"""One driver for every program: a policy's control plane run under a world.

``pearl train`` (live world), the simulated experiment and the ablation (simulated world)
all do the same thing: size the rollout pool the policy may use, lay the cluster out,
build the ``ControlPlane``, bring the initial workers up, run the RL pipeline while the
availability trace is replayed, and collect the counters. ``RunDriver`` does it once; a
program adds only what is its own between ``start`` and ``run`` (loading weights,
evaluating) and a pipeline listener (``ForwardingListener``) for what it records.
Pure Python: no engine, simulator or Ray imports.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.composition import ClusterLayout, ControlPlane, World
from pearl.control.decision import DecisionConfig
from pearl.control.elastic import RoleDecider
from pearl.control.pipeline import PipelineConfig, StepRecord
from pearl.control.policies import Policy, Pool
from pearl.workloads.availability import AvailabilityTrace


@dataclass(slots=True, frozen=True)
class ClusterSize:
    """What a run may use: ``reserved_gpus`` always, up to ``max_preemptible_gpus`` more
    while the availability trace offers them (elastic policies), in TP groups of ``tp``
    GPUs, and ``training_gpus`` whose TP groups are the overlap zone. The training GPUs
    start on a node boundary (``gpus_per_node``)."""

    tp: int
    reserved_gpus: int
    max_preemptible_gpus: int
    training_gpus: int
    gpus_per_node: int = 1

    def layout_for(self, policy: Policy, mean_preemptible_gpus: float) -> ClusterLayout:
        """The layout ``policy`` runs on: an elastic pool keeps the reserved and preemptible
        slots; a reserved or fixed pool gets its worker count (ROLL-Large: the trace's mean)."""
        tp = self.tp
        if policy.pool is Pool.ELASTIC:
            reserved, preemptible = self.reserved_gpus // tp, self.max_preemptible_gpus // tp
        else:
            reserved = policy.pool_workers(
                self.reserved_gpus, self.max_preemptible_gpus, mean_preemptible_gpus, tp
            )
            preemptible = 0
        gpn = self.gpus_per_node
        training_base = math.ceil((reserved + preemptible) * tp / gpn) * gpn
        return ClusterLayout(tp, reserved, preemptible, self.training_gpus, training_base)


@dataclass(slots=True, frozen=True)
class Availability:
    """Preemptible GPUs over a run: ``initial`` at its start, then ``(seconds from the
    start, GPUs)`` changes; ``mean`` sizes a fixed pool (ROLL-Large). The Elastic Scheduler
    caps every count at the preemptible slots the layout has."""

    initial: int = 0
    changes: tuple[tuple[float, int], ...] = ()
    mean: float = 0.0

    @classmethod
    def from_trace(cls, trace: AvailabilityTrace) -> Availability:
        """A trace's values from its first time on, as seconds from the run's start."""
        start = trace.start_s
        later = tuple((t - start, v) for t, v in trace.changes() if t > start)
        return cls(trace.value_at(start), later, trace.mean())

    @classmethod
    def from_changes(cls, changes: Sequence[tuple[float, int]]) -> Availability:
        """From ``(seconds, GPUs)`` changes, in time order (of two changes at one time the one
        listed last holds): the count at 0 is the last change at or before 0 (none: 0); the
        mean is the step function's over [0, last change] (its last value when nothing
        changes later)."""
        ordered = sorted(changes, key=lambda change: change[0])
        initial = 0
        for t, n in ordered:
            if t <= 0:
                initial = n
        later = tuple((t, n) for t, n in ordered if t > 0)
        if not later:
            return cls(initial, (), float(initial))
        total, level, since = 0.0, initial, 0.0
        for t, n in later:
            total += level * (t - since)
            level, since = n, t
        return cls(initial, later, total / since)


class ForwardingListener:
    """A pipeline listener that forwards every hook to the Elastic Scheduler; programs
    subclass it to record what they need and call ``super()`` to keep the forwarding."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    async def on_rollout_finished(self, step: int, result: Any) -> None:
        await self.plane.elastic.on_rollout_finished(step, result)

    async def on_training_begin(self, step: int) -> None:
        await self.plane.elastic.on_training_begin(step)

    async def on_training_finished(self, step: int, weight_version: int) -> None:
        await self.plane.elastic.on_training_finished(step, weight_version)


class RunDriver:
    """One run of ``policy`` in ``world``: ``start()`` brings the initial workers up,
    ``run()`` runs the pipeline under the availability trace, ``counters()`` says what
    the control plane did."""

    def __init__(
        self,
        world: World,
        policy: Policy,
        cluster: ClusterSize,
        availability: Availability,
        decision: DecisionConfig | None = None,
        log: Callable[[dict], None] = lambda event: None,
        decider: RoleDecider | None = None,
    ) -> None:
        self.policy = policy
        self.layout = cluster.layout_for(policy, availability.mean)
        self.availability = availability
        self.plane = ControlPlane(world, policy, self.layout, decision, log, decider)

    async def start(self) -> None:
        """Bring up the reserved workers and the preemptible ones available at the start."""
        follows = self.policy.pool is Pool.ELASTIC and bool(self.plane.preemptible)
        await self.plane.start(self.availability.initial if follows else 0)

    async def run(
        self,
        batches: Callable[[int], Any],
        loop_config: AgentLoopConfig,
        config: PipelineConfig,
        listener: ForwardingListener | None = None,
        more_tasks: Callable[[int, int, int], Any] | None = None,
    ) -> list[StepRecord]:
        """The RL pipeline over ``batches`` (step -> batch) while availability changes;
        ``more_tasks`` (step, round, tasks -> batch) feeds dynamic sampling."""
        self.plane.make_pipeline(batches, loop_config, config, listener, more_tasks)
        follows = self.policy.pool is Pool.ELASTIC and bool(self.plane.preemptible)
        return await self.plane.run(self.availability.changes if follows else ())

    def counters(self) -> dict[str, Any]:
        return self.plane.counters()
