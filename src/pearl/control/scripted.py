"""One rollout batch on a fixed set of workers with reconfigurations at scripted times.

A mode switch (``2C`` -> ``1P1D``) or a shrink (``2C`` -> ``1C``) in the middle of a batch
goes through the same table and Inter-Scale Rebuilder as in an RL run: the workers whose
role changes hand back their in-flight turns, a leaving worker's turns are aborted, and the
agent loop resumes every cut-short turn from the tokens already generated. Both worlds
call this with their own workers, so fidelity cases can compare the two on these paths.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.interfaces import Clock, KVMover, RolloutWorker, WorkerRole
from pearl.control.rebuilder import InterScaleRebuilder
from pearl.control.rollout import BatchResult, run_rollout_batch
from pearl.control.router import Router
from pearl.control.state import SlotId, Topology, WorkerSlot, WorkerStatus, WorkerTable, Zone
from pearl.workloads.batch import RolloutBatch


@dataclass(slots=True, frozen=True)
class ScriptedChange:
    """At ``at_s`` after the batch starts, move to ``to``: the first ``to.num_workers``
    workers stay (prefill ones first, then decode, or all colocated), the rest leave."""

    at_s: float
    to: Topology

    def __post_init__(self) -> None:
        if not self.at_s >= 0:
            raise ValueError(f"a scripted change needs at_s >= 0, got {self.at_s!r}")
        if not self.to.is_valid:
            raise ValueError(f"a scripted change needs a servable topology, got {self.to}")


def roles_for(slots: Sequence[SlotId], topology: Topology) -> dict[SlotId, WorkerRole]:
    """``topology``'s roles over the first ``topology.num_workers`` of ``slots``."""
    if topology.num_workers > len(slots):
        raise ValueError(f"{topology.label} needs {topology.num_workers} workers, has {len(slots)}")
    order = (
        [WorkerRole.PREFILL] * topology.prefill
        + [WorkerRole.DECODE] * topology.decode
        + [WorkerRole.COLOCATED] * topology.colocated
    )
    return dict(zip(slots, order, strict=False))


class _Stopper:
    """The rebuilder's worker factory here: nothing starts, leaving workers are stopped."""

    def __init__(self, stop: Callable[[RolloutWorker], Awaitable[None] | None]) -> None:
        self._stop = stop

    async def start(self, slot: WorkerSlot, role: WorkerRole) -> RolloutWorker:
        raise RuntimeError("a scripted batch starts no workers")

    async def stop(self, slot_id: SlotId, worker: RolloutWorker) -> None:
        result = self._stop(worker)
        if asyncio.iscoroutine(result):
            await result


async def run_scripted_batch(
    batch: RolloutBatch,
    workers: Sequence[RolloutWorker],
    initial: Topology,
    changes: Sequence[ScriptedChange],
    kv_mover: KVMover | None,
    clock: Clock,
    config: AgentLoopConfig,
    stop: Callable[[RolloutWorker], Awaitable[None] | None],
) -> BatchResult:
    """Run ``batch`` on ``workers`` under ``initial``, applying ``changes`` in time order.
    ``workers`` must already have ``initial``'s roles; ``stop`` ends a leaving worker."""
    table = WorkerTable()
    first = roles_for(range(len(workers)), initial)
    slots = [
        table.add_slot([i], Zone.DEDICATED, first.get(i, WorkerRole.COLOCATED), WorkerStatus.ACTIVE)
        for i in range(len(workers))
    ]
    router = Router(kv_mover)
    rebuilder = InterScaleRebuilder(table, router, _Stopper(stop), lambda: 0, lambda v: 0.0)
    rebuilder.workers = dict(zip(slots, workers, strict=True))
    leaving_now = [s for i, s in enumerate(slots) if i not in first]
    if leaving_now:
        table.set_statuses({s: WorkerStatus.INACTIVE for s in leaving_now})
    rebuilder.apply_topology()
    start = clock.now()
    applied: list[float] = []

    async def script() -> None:
        for change in sorted(changes, key=lambda c: c.at_s):
            await clock.sleep(max(0.0, start + change.at_s - clock.now()))
            roles = roles_for(slots, change.to)
            leaving = [s for s in slots if s not in roles and s in rebuilder.workers]
            await rebuilder.shrink(leaving, roles)
            applied.append(clock.now())

    task = asyncio.ensure_future(script())
    try:
        result = await run_rollout_batch(batch, router, clock, config)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    result.reconfigured_at = applied
    return result
