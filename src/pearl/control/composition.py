"""The composition root: the control plane wired once, over any world.

``ControlPlane`` builds PEARL's boxes — the GPU–worker–role table, runtime tracker, router,
Inter-Scale Rebuilder, Intra-Scale Toggle Manager, role decider, Elastic Scheduler — for a
rollout policy on a cluster layout, and runs a pipeline of RL steps under an availability
trace. A ``World`` supplies what differs between the simulator and live runs: how a worker
is made and stopped, the trainer, the KV mover, latencies of starting and toggling workers,
weight-sync times and the decision model's prior. ``pearl.sim.policy_run`` and ``pearl.apps.train.run`` both
use it. Pure Python: no engine, simulator or Ray imports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.decision import DecisionConfig, WorkloadParams
from pearl.control.elastic import ElasticScheduler, RoleDecider
from pearl.control.interfaces import AsyncioClock, KVMover, RolloutWorker, Trainer, WorkerRole
from pearl.control.pipeline import (
    PipelineConfig,
    PipelineListener,
    PipelineScheduler,
    StepRecord,
    WeightSync,
)
from pearl.control.policies import Borrowing, Policy, WeightUpdate
from pearl.control.rebuilder import InterScaleRebuilder
from pearl.control.rollout_engine import EngineCapabilities, require_capabilities
from pearl.control.router import Router
from pearl.control.state import WorkerSlot, WorkerStatus, WorkerTable, Zone
from pearl.control.toggle import IntraScaleToggleManager
from pearl.control.tracker import RuntimeTracker


@dataclass(slots=True, frozen=True)
class ClusterLayout:
    """PEARL's evaluation layout: dedicated rollout workers (reserved, then preemptible) of
    ``tp`` GPUs each, then the training GPUs from ``training_base``, whose TP groups form
    the overlap zone that borrowing activates."""

    tp: int
    reserved_workers: int
    preemptible_workers: int
    training_gpus: int
    training_base: int

    def __post_init__(self) -> None:
        if self.tp < 1 or self.reserved_workers < 0 or self.preemptible_workers < 0:
            raise ValueError(f"invalid layout {self}")
        if self.training_gpus < self.tp or self.training_gpus % self.tp:
            raise ValueError(
                f"training_gpus must be a positive multiple of tp={self.tp}, got {self.training_gpus}"
            )


@dataclass(slots=True, frozen=True)
class WorldLatencies:
    """Seconds a world takes to start a worker (before admission, and admission itself) and
    to hand the overlap zone's devices from the trainer to rollout and back."""

    prepare_s: float = 0.0
    finalize_s: float = 0.0
    activate_s: float = 0.0
    deactivate_s: float = 0.0


class World(Protocol):
    """What a world supplies to the control plane."""

    latencies: WorldLatencies
    capabilities: EngineCapabilities
    """What the world's engine can do; a policy that needs more is refused at construction."""
    prior: WorkloadParams
    """The decision model's parameters before anything is measured."""

    def make_worker(
        self, worker_id: str, slot: WorkerSlot, role: WorkerRole, plane: ControlPlane
    ) -> RolloutWorker:
        """A worker for ``slot`` in ``role`` (a started process, or a simulated one)."""

    async def started(self, worker: RolloutWorker) -> None:
        """Return once ``worker`` runs; raise ``EngineStateError`` if it cannot start (its
        process died, or found no place), so the expansion that wanted it fails cleanly."""

    async def stop_worker(self, worker: RolloutWorker) -> None: ...

    def make_trainer(self, plane: ControlPlane) -> Trainer: ...

    def make_kv_mover(self, plane: ControlPlane) -> KVMover: ...

    def weight_sync_s(self, receivers: int) -> float:
        """Seconds a weight sync to ``receivers`` workers takes (simulated worlds charge it;
        live ones measure it)."""


class _Factory:
    """The rebuilder's worker factory: the world makes a worker after ``prepare_s``."""

    def __init__(self, plane: ControlPlane, prepare_s: float) -> None:
        self.plane = plane
        self.prepare_s = prepare_s
        self.started = 0
        self.stopped = 0

    async def start(self, slot: WorkerSlot, role: WorkerRole) -> RolloutWorker:
        await asyncio.sleep(self.prepare_s)
        self.started += 1
        worker = self.plane.make_worker(slot, role)
        await self.plane.world.started(worker)
        return worker

    async def stop(self, slot_id, worker) -> None:
        await self.plane.world.stop_worker(worker)
        self.stopped += 1


class ControlPlane:
    """PEARL's control plane for one run of ``policy`` on ``layout`` in ``world``."""

    def __init__(
        self,
        world: World,
        policy: Policy,
        layout: ClusterLayout,
        decision: DecisionConfig | None = None,
        log: Callable[[dict], None] = lambda event: None,
        decider: RoleDecider | None = None,
    ) -> None:
        require_capabilities(policy, world.capabilities)
        self.world = world
        self.policy = policy
        self.layout = layout
        self.log = log
        self.clock = AsyncioClock()
        table = self.table = self._lay_out_table(layout)
        self.tracker = RuntimeTracker(world.prior)
        self.made: list[RolloutWorker] = []  # every worker started (time breakdowns)
        self.router = Router(
            world.make_kv_mover(self),
            restart_interrupted=policy.weight_update is WeightUpdate.ABORT_RESTART,
        )
        self.trainer = world.make_trainer(self)
        self.factory = _Factory(self, prepare_s=0.0)  # the initial workers are up at t = 0
        self.rebuilder = InterScaleRebuilder(
            table,
            self.router,
            self.factory,
            lambda: self.trainer.weight_version,
            world.weight_sync_s,
            finalize_s=0.0,
        )
        self.toggle = self._make_toggle() if policy.borrowing is not Borrowing.OFF else None
        if decider is None:
            self.decider = RoleDecider(policy, self.tracker, decision or DecisionConfig(), log)
        else:
            self.decider = decider
            decider.tracker, decider.log = self.tracker, log
        self.pipeline: PipelineScheduler | None = None

        def progress() -> tuple[int, int]:
            assert self.pipeline is not None  # attached before the run starts
            return self.pipeline.borrow_window()

        self.elastic = ElasticScheduler(
            self.rebuilder,
            self.reserved,
            self.preemptible,
            layout.tp,
            self.clock,
            decider=self.decider,
            toggle=self.toggle,
            tracker=self.tracker,
            progress=progress,
            log=log,
        )

    def _lay_out_table(self, layout: ClusterLayout) -> WorkerTable:
        """The table's slots: reserved then preemptible dedicated workers of ``tp`` GPUs, the
        training slot over the training GPUs, and one overlap rollout slot per TP group of
        them (inactive until borrowed)."""
        tp = layout.tp
        table = WorkerTable()
        self.reserved = [
            table.add_slot(range(i * tp, (i + 1) * tp), Zone.DEDICATED, WorkerRole.COLOCATED)
            for i in range(layout.reserved_workers)
        ]
        dedicated = layout.reserved_workers + layout.preemptible_workers
        self.preemptible = [
            table.add_slot(range(i * tp, (i + 1) * tp), Zone.DEDICATED, WorkerRole.COLOCATED)
            for i in range(layout.reserved_workers, dedicated)
        ]
        train_gpus = range(layout.training_base, layout.training_base + layout.training_gpus)
        self.training = table.add_slot(
            train_gpus, Zone.OVERLAP, WorkerRole.TRAINING, WorkerStatus.ACTIVE
        )
        self.overlap = [
            table.add_slot(train_gpus[k : k + tp], Zone.OVERLAP, WorkerRole.COLOCATED)
            for k in range(0, layout.training_gpus, tp)
        ]
        return table

    def _make_toggle(self) -> IntraScaleToggleManager:
        """The Intra-Scale Toggle Manager over the overlap slots, whose worker processes are
        started once and kept (retained) across borrowing rounds."""
        snap = self.table.snapshot()
        retained = {s: self.make_worker(snap.slot(s), WorkerRole.COLOCATED) for s in self.overlap}
        lat = self.world.latencies
        return IntraScaleToggleManager(
            self.rebuilder,
            self.trainer,
            [self.training],
            retained,
            lat.activate_s,
            lat.deactivate_s,
        )

    def make_worker(self, slot: WorkerSlot, role: WorkerRole) -> RolloutWorker:
        wid = f"{'o' if slot.zone is Zone.OVERLAP else 'w'}{slot.slot_id}"
        worker = self.world.make_worker(wid, slot, role, self)
        self.made.append(worker)
        return worker

    def worker_failed(self, slot_id) -> asyncio.Future:
        """A world reports that the worker of ``slot_id`` died; the Elastic Scheduler takes
        it out and restarts the slot. Returns the handling's future (await it before
        resuming that worker's turns, so they land on the new topology)."""
        return asyncio.ensure_future(self.elastic.on_worker_failed(slot_id))

    def active_workers(self) -> list[RolloutWorker]:
        return list(self.rebuilder.workers.values())

    async def start(self, preemptible_workers: int) -> None:
        """Bring up the reserved workers and ``preemptible_workers`` preemptible ones (at
        once: the run starts when they are up); later workers take the world's latencies."""
        await self.elastic.start(preemptible_workers)
        await self.elastic.settle()
        lat = self.world.latencies
        self.factory.prepare_s, self.rebuilder.finalize_s = lat.prepare_s, lat.finalize_s

    def make_pipeline(
        self,
        batches,
        loop_config: AgentLoopConfig,
        config: PipelineConfig,
        listener: PipelineListener | None = None,
        more_tasks=None,
    ) -> PipelineScheduler:
        """The RL pipeline over this plane's router, trainer and active workers;
        ``listener`` (default: the Elastic Scheduler) gets Training Begin / Finished;
        ``more_tasks`` feeds dynamic sampling (``PipelineScheduler``)."""
        self.pipeline = PipelineScheduler(
            batches,
            self.router,
            self.trainer,
            WeightSync(
                self.active_workers,
                self.world.weight_sync_s,
                abort_in_flight=self.policy.weight_update is not WeightUpdate.CONTINUE,
            ),
            self.clock,
            loop_config,
            config,
            listener=listener or self.elastic,
            more_tasks=more_tasks,
        )
        self.pipeline.on_trajectory = self.tracker.observe_result
        return self.pipeline

    async def run(self, trace_changes: Sequence[tuple[float, int]] = ()) -> list[StepRecord]:
        """Run the pipeline while replaying availability ``(seconds from now, preemptible
        workers)`` changes; then settle, return borrowed workers and check the table."""
        if self.pipeline is None:
            raise RuntimeError("make_pipeline() first")
        replay = asyncio.ensure_future(self.elastic.replay(list(trace_changes)))
        try:
            records = await self.pipeline.run()
        finally:
            replay.cancel()
            try:
                await replay
            except asyncio.CancelledError:
                pass
        await self.elastic.settle()
        if self.toggle is not None and self.toggle.borrowed:
            await self.toggle.give_back()
        self.table.check()
        return records

    def counters(self) -> dict[str, Any]:
        router, toggle = self.router, self.toggle
        return {
            "expansions_cancelled": self.rebuilder.expansions_cancelled,
            "busy_shrinks": self.rebuilder.busy_shrinks,
            "workers_shrunk": self.rebuilder.workers_shrunk,
            "busy_workers_shrunk": self.rebuilder.busy_workers_shrunk,
            "turns_cut_by_shrinks": self.rebuilder.turns_cut_by_shrinks,
            "workers_started": self.factory.started,
            "borrow_rounds": toggle.rounds if toggle else 0,
            "borrow_skipped_by_gate": toggle.skipped_by_gate if toggle else 0,
            "turns_resumed": router.turns_resumed,
            "tokens_discarded": router.tokens_discarded,
            "turns_aborted_by_weight_updates": (
                self.pipeline.weight_sync.turns_aborted if self.pipeline else 0
            ),
            "kv_transfer_retries": router.transfer_retries,
            "sessions_moved": router.sessions_moved,
            "worker_failures": self.elastic.failures,
        }

    def all_workers(self) -> list[RolloutWorker]:
        """Active and retained (overlap) workers: what to stop at the end."""
        retained = list(self.toggle.overlap.values()) if self.toggle else []
        return list(self.rebuilder.workers.values()) + retained
