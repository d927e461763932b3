"""A whole asynchronous RL run in the simulated world, under one rollout policy.

Wires the control plane (table, router, rebuilder, toggle manager, tracker, Elastic
Scheduler, pipeline) to simulated workers and a simulated trainer, replays a GPU
availability trace, and records every step, reconfiguration and role change. The
cluster is PEARL's evaluation layout: dedicated rollout GPUs (reserved + preemptible),
then the training GPUs, whose TP groups form the overlap zone that can be borrowed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from dataclasses import dataclass, field

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.composition import ClusterLayout, ControlPlane, WorldLatencies
from pearl.control.decision import DecisionConfig, WorkloadParams
from pearl.control.elastic import RoleDecider
from pearl.control.interfaces import WorkerRole
from pearl.control.pipeline import PipelineConfig, StepRecord
from pearl.control.policies import Policy, Pool
from pearl.control.state import TableSnapshot, WorkerSlot, WorkerStatus, WorkerTable, Zone
from pearl.control.tracker import IterationObservation
from pearl.sim.clock import run_virtual
from pearl.sim.costmodel import CostModel
from pearl.sim.fixed import SimKVMover
from pearl.sim.network import Network
from pearl.sim.trainer import SimulatedTrainer
from pearl.sim.worker import SimEngineConfig, SimulatedWorker, TimeUse
from pearl.workloads.agentic import AgenticProfile, generate_batch
from pearl.workloads.availability import AvailabilityTrace


@dataclass(slots=True, frozen=True)
class RLSetting:
    """Everything a run shares across policies (docs/paper.md "How it was evaluated" by default)."""

    cost: CostModel
    profile: AgenticProfile
    reserved_gpus: int = 4
    max_preemptible_gpus: int = 12
    training_gpus: int = 16
    duration_s: float = 7_200.0
    max_staleness: int = 1
    overlap_batches: bool = False
    seed: int = 0
    engine: SimEngineConfig = field(default_factory=SimEngineConfig)
    decision: DecisionConfig = field(default_factory=DecisionConfig)
    check_invariants: bool = False
    """Fail the run if a turn reaches a worker whose slot is not active in the role the turn
    is sent for, or training starts while a borrowed GPU still serves rollout."""

    def __post_init__(self) -> None:
        tp = self.cost.tp
        for name in ("reserved_gpus", "training_gpus"):
            value = getattr(self, name)
            if value < tp or value % tp:
                raise ValueError(f"{name} must be a positive multiple of TP={tp}, got {value}")
        if self.max_preemptible_gpus < 0:
            raise ValueError(f"max_preemptible_gpus must be >= 0, got {self.max_preemptible_gpus}")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")


@dataclass(slots=True)
class RLRunResult:
    policy: str
    trace: str
    records: list[StepRecord]
    started_at: float
    events: list[dict]
    timeline: list[dict]
    rollout_gpus: list[tuple[float, int]]  # (time, dedicated rollout GPUs the policy may use)
    counters: dict[str, float]
    wall_s: float
    window_s: float = math.inf  # the run's duration: steps finished by then are counted

    @property
    def counted(self) -> list[StepRecord]:
        """Steps completed (weights synced) within the window. A step that started before
        the cutoff but ended after it is left out, so where a policy's last step happens
        to fall cannot tilt its throughput."""
        return [r for r in self.records if r.sync_finished - self.started_at <= self.window_s]

    @property
    def finished_at(self) -> float:
        counted = self.counted
        return counted[-1].sync_finished if counted else self.started_at

    @property
    def total_tokens(self) -> int:
        return sum(r.rollout_tokens + r.train_tokens for r in self.counted)

    @property
    def throughput(self) -> float:
        """(rollout generated + training tokens) / time, over the counted steps."""
        elapsed = self.finished_at - self.started_at
        return self.total_tokens / elapsed if elapsed > 0 else 0.0

    def step_rows(self) -> list[dict]:
        """One row per step: timings, tokens, throughput, and the GPU budget behind it."""
        rows = []
        previous = self.started_at
        counted = self.counted
        for rec in self.records:
            duration = rec.sync_finished - previous
            rows.append(
                {
                    "step": rec.step,
                    "time_s": round(rec.sync_finished - self.started_at, 6),
                    "rollout_started_s": round(rec.rollout_started - self.started_at, 6),
                    "counted": rec in counted,
                    "timing/step": duration,
                    "timing/rollout": rec.rollout_finished - rec.rollout_started,
                    "timing/train": rec.train_finished - rec.train_started,
                    "timing/weight_sync": rec.sync_finished - rec.train_finished,
                    "performance/rollout_tokens": rec.rollout_tokens,
                    "performance/train_tokens": rec.train_tokens,
                    "performance/tokens_per_sec": (rec.rollout_tokens + rec.train_tokens) / duration
                    if duration > 0
                    else 0.0,
                    "cluster/rollout_gpus": _mean_level(
                        self.rollout_gpus, previous, rec.sync_finished
                    ),
                    "weights/oldest_version": rec.weight_versions[0],
                    **{f"time/{k}_s": v for k, v in rec.time_breakdown.items()},
                }
            )
            previous = rec.sync_finished
        return rows


def _mean_level(levels: list[tuple[float, int]], start: float, end: float) -> float:
    """Time-average of a step function given as (time, value) changes over [start, end)."""
    if end <= start or not levels:
        return float(levels[-1][1]) if levels else 0.0
    total = 0.0
    for k, (t, value) in enumerate(levels):
        nxt = levels[k + 1][0] if k + 1 < len(levels) else math.inf
        lo, hi = max(t, start), min(nxt, end)
        if hi > lo:
            total += value * (hi - lo)
    return total / (end - start)


class InvariantViolation(AssertionError):
    """The control plane broke a rule the run was asked to check."""


class _CheckedWorker(SimulatedWorker):
    """A simulated worker that checks, at every dispatch, the table row of its slot."""

    def __init__(self, *args, table: WorkerTable, slot_id: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._table, self._slot_id = table, slot_id

    def _check(self, role: WorkerRole | None) -> None:
        row = self._table.snapshot().slot(self._slot_id)
        if row.status is not WorkerStatus.ACTIVE or (role is not None and row.role is not role):
            raise InvariantViolation(
                f"turn sent to {self.worker_id} as {role or 'colocated/any'}, but slot "
                f"{self._slot_id} is {row.status} {row.role} (table version {self._table.version})"
            )

    async def generate(self, turn):
        self._check(WorkerRole.COLOCATED)
        return await super().generate(turn)

    async def prefill(self, turn):
        self._check(WorkerRole.PREFILL)
        return await super().prefill(turn)

    async def decode(self, turn):
        self._check(WorkerRole.DECODE)
        return await super().decode(turn)


class _CheckedTrainer(SimulatedTrainer):
    """Refuses to train while any overlap rollout slot holds GPUs (besides the trainer's
    own check that its device state was restored)."""

    def __init__(self, *args, table: WorkerTable, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._table = table

    async def train_step(self, batch):
        for s in self._table.snapshot().slots:
            if (
                s.zone is Zone.OVERLAP
                and not s.is_training
                and s.status is not WorkerStatus.INACTIVE
            ):
                raise InvariantViolation(
                    f"training step {batch.step} started while overlap slot {s.slot_id} is {s.status}"
                )
        return await super().train_step(batch)


class _TimeBreakdown:
    """Forwards the pipeline's hooks to the Elastic Scheduler; at each rollout batch's end
    records where the rollout workers' time went since the previous one (worker-seconds per
    ``TimeUse``; idle with no work is what the others leave of the active worker-seconds)."""

    def __init__(self, elastic, workers, integrate, active, rows) -> None:
        self.elastic, self.workers, self.integrate = elastic, workers, integrate
        self.active, self.rows = active, rows
        self._last: dict[str, float] = {}
        self._last_active = 0.0

    async def on_rollout_finished(self, step: int, result) -> None:
        self.integrate()
        totals = {str(u): sum(w.counters.time_s[u] for w in self.workers) for u in TimeUse}
        row = {u: v - self._last.get(u, 0.0) for u, v in totals.items()}
        worker_s = self.active["seconds"] - self._last_active
        claimed = sum(v for u, v in row.items() if u != TimeUse.IDLE_NO_WORK)
        row[str(TimeUse.IDLE_NO_WORK)] = max(0.0, worker_s - claimed)
        self.rows.append(row)
        self._last, self._last_active = totals, self.active["seconds"]
        await self.elastic.on_rollout_finished(step, result)

    async def on_training_begin(self, step: int) -> None:
        await self.elastic.on_training_begin(step)

    async def on_training_finished(self, step: int, weight_version: int) -> None:
        await self.elastic.on_training_finished(step, weight_version)


def prior_params(setting: RLSetting, bandwidth_Bps: float) -> WorkloadParams:
    """What the deployment knows before measuring anything: model and hardware sizes (the
    bandwidth of one prefill -> decode worker link, ``bandwidth_Bps``), and
    the cost model's iteration costs (A, b at half the profile's longest context,
    t_prefill of a full chunk), which the tracker keeps where its data cannot identify
    them. The workload fields are placeholders, replaced by the first refit (nothing is
    decided from them: the decider stays colocated until then)."""
    cost = setting.cost
    capacity_tokens = cost.kv_capacity_tokens()
    context = max(1, setting.profile.max_context_tokens // 2)
    fixed = cost.decode_time(1, 1)
    per_sequence = max(1e-9, (cost.decode_time(8, 8 * context) - cost.decode_time(1, context)) / 7)
    chunk = setting.engine.max_num_batched_tokens
    return WorkloadParams(
        turns=1,
        decode_tokens_per_turn=1,
        appended_tokens_per_turn=1,
        bubble_ratio=0,
        decode_step_fixed_s=fixed,
        decode_step_per_sequence_s=per_sequence,
        prefill_s_per_token=cost.prefill_time(chunk) / chunk,
        switch_overhead_s=0,
        env_time_s=0,
        kv_bytes_per_token=cost.kv_bytes(1),
        pd_bandwidth_bytes_per_s=bandwidth_Bps,
        kv_bytes_per_trajectory=cost.kv_bytes(setting.profile.max_context_tokens),
        kv_capacity_bytes_per_worker=max(1, cost.kv_bytes(capacity_tokens)),
        batch_trajectories=setting.profile.batch_size,
    )


class SimWorld:
    """The simulated world of a run: simulated workers on the cost model, a simulated
    trainer, KV moves over the cluster's network, the cost model's latencies."""

    def __init__(self, setting: RLSetting, network: Network, engine: SimEngineConfig) -> None:
        self.setting = setting
        self.cost = cost = setting.cost
        self.engine = engine
        lat = cost.worker_latencies()
        self.latencies = WorldLatencies(
            lat.prepare_s, lat.finalize_s, lat.activate_s, lat.deactivate_s
        )
        self.prior = prior_params(setting, cost.tp * cost.gpu.network_bandwidth_Bps)
        self.network = network
        self.gpus_of: dict[str, list[int]] = {}

    def make_worker(self, wid: str, slot: WorkerSlot, role: WorkerRole, plane) -> SimulatedWorker:
        self.gpus_of[wid] = list(slot.gpus)
        tracker = plane.tracker

        def on_iteration(worker_id, start, dt, out, iterations) -> None:
            decodes = len(out.decodes)
            prefill = sum(ch.num_tokens for ch in out.prefills)
            # A fast-forwarded stretch: contexts grow by one token per step; report the mean.
            context = sum(s.num_tokens for s in out.decodes) + decodes * (iterations - 1) // 2
            tracker.observe_iteration(
                IterationObservation(decodes, prefill, dt / iterations, context, iterations)
            )

        vocab = self.cost.model.vocab_size
        if self.setting.check_invariants:
            return _CheckedWorker(
                wid,
                self.cost,
                self.engine,
                role=role,
                vocab_size=vocab,
                on_iteration=on_iteration,
                table=plane.table,
                slot_id=slot.slot_id,
            )
        return SimulatedWorker(
            wid, self.cost, self.engine, role=role, vocab_size=vocab, on_iteration=on_iteration
        )

    async def stop_worker(self, worker: SimulatedWorker) -> None:
        worker.close()

    def make_trainer(self, plane) -> SimulatedTrainer:
        gpus = self.setting.training_gpus
        if self.setting.check_invariants:
            return _CheckedTrainer(self.cost, num_gpus=gpus, table=plane.table)
        return SimulatedTrainer(self.cost, num_gpus=gpus)

    def make_kv_mover(self, plane) -> SimKVMover:
        return SimKVMover(self.network, self.cost, self.gpus_of)

    def weight_sync_s(self, receivers: int) -> float:
        return self.cost.weight_sync_time(receivers)


def run_policy(
    setting: RLSetting,
    policy: Policy,
    trace: AvailabilityTrace | None = None,
    decider: RoleDecider | None = None,
) -> RLRunResult:
    """One RL run of ``setting.duration_s`` under ``policy``; ``trace`` gives preemptible
    GPUs over time (elastic pools) and the mean that sizes a ``fixed`` pool. ``decider``
    replaces the policy's role decisions (its tracker and log are set here)."""
    wall = time.perf_counter()
    cost, tp = setting.cost, setting.cost.tp
    gpu = cost.gpu
    if policy.pool is Pool.ELASTIC:
        if trace is None:
            raise ValueError(f"policy {policy.name} follows an availability trace; none given")
        reserved_workers = setting.reserved_gpus // tp
        preemptible_workers = setting.max_preemptible_gpus // tp
    else:
        mean = trace.mean() if trace is not None else 0.0
        reserved_workers = policy.pool_workers(
            setting.reserved_gpus, setting.max_preemptible_gpus, mean, tp
        )
        preemptible_workers = 0
    dedicated_gpus = (reserved_workers + preemptible_workers) * tp
    gpn = gpu.gpus_per_node
    training_base = math.ceil(dedicated_gpus / gpn) * gpn  # training nodes start on a node
    nodes = math.ceil((training_base + setting.training_gpus) / gpn)
    blocks = max(2, cost.kv_capacity_tokens() // setting.engine.block_size)
    engine = dataclasses.replace(setting.engine, num_kv_blocks=blocks)
    vocab = cost.model.vocab_size
    layout = ClusterLayout(
        tp, reserved_workers, preemptible_workers, setting.training_gpus, training_base
    )
    world = SimWorld(setting, Network.for_gpu(gpu, nodes), engine)

    events: list[dict] = []
    timeline: list[dict] = []
    time_rows: list[dict[str, float]] = []
    rollout_gpus: list[tuple[float, int]] = []

    async def main() -> tuple[list[StepRecord], float, dict]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()  # reset once the initial workers are up

        def log(event: dict) -> None:
            t = round(max(0.0, event.get("t", loop.time()) - t0), 6)
            events.append({**event, "t": t})
            if event["kind"] == "availability" and t > 0:  # the budget behind each step
                rollout_gpus.append((t, reserved_workers * tp + event["budget_gpus"]))

        plane = ControlPlane(world, policy, layout, setting.decision, log, decider)
        table = plane.table

        # Active rollout worker-seconds, integrated over the table's changes: what the
        # workers' time breakdown (prefill, decode, idle, ...) is a breakdown of.
        active = {"workers": 0, "since": loop.time(), "seconds": 0.0}

        def integrate() -> None:
            now = loop.time()
            active["seconds"] += active["workers"] * (now - active["since"])
            active["since"] = now

        def record(snap: TableSnapshot) -> None:
            integrate()
            active["workers"] = sum(
                1 for s in snap.slots if s.status is WorkerStatus.ACTIVE and not s.is_training
            )
            counts: dict[str, int] = {}
            for s in snap.slots:
                if s.status is WorkerStatus.ACTIVE and not s.is_training:
                    key = f"{'overlap' if s.zone is Zone.OVERLAP else 'dedicated'}_{s.role}"
                    counts[key] = counts.get(key, 0) + 1
            entry = {"t": round(loop.time(), 6), **dict(sorted(counts.items()))}
            if timeline and timeline[-1]["t"] == entry["t"]:
                timeline[-1] = entry
            elif not timeline or {k: v for k, v in timeline[-1].items() if k != "t"} != {
                k: v for k, v in entry.items() if k != "t"
            }:
                timeline.append(entry)

        table.listeners.append(record)
        follows_trace = trace is not None and bool(plane.preemptible)
        changes = list(trace.changes()) if follows_trace else []
        initial = trace.value_at(trace.start_s) if follows_trace else 0  # a constant trace too
        await plane.start(initial)
        t0 = loop.time()
        rollout_gpus.append((0.0, reserved_workers * tp + plane.elastic.budget_gpus))

        profile = setting.profile
        plane.make_pipeline(
            lambda i: generate_batch(profile, seed=setting.seed * 100_003 + i),
            AgentLoopConfig(vocab_size=vocab),
            PipelineConfig(
                num_steps=1_000_000,
                max_staleness=setting.max_staleness,
                overlap_batches=setting.overlap_batches,
                deadline_s=setting.duration_s,
            ),
            listener=_TimeBreakdown(plane.elastic, plane.made, integrate, active, time_rows),
        )
        trace_changes = [(t - trace.start_s, v) for t, v in changes if t > trace.start_s]
        records = await plane.run(trace_changes)
        counters = {
            "reconfigurations": sum(1 for e in events if e["kind"] in ("reassign", "shrink")),
            "role_switches": sum(len(e["roles"]) for e in events if e["kind"] == "reassign"),
            **plane.counters(),
            "trainer_busy_s": plane.trainer.busy_s,
        }
        counters["time_by_worker_s"] = {
            w.worker_id: {str(k): v for k, v in w.counters.time_s.items() if v} for w in plane.made
        }
        for w in plane.all_workers():
            w.close()
        return records, t0, counters

    (records, t0, counters), _ = run_virtual(main)
    for rec, times in zip(records, time_rows, strict=False):
        rec.time_breakdown = times
    # Report times from the start of the run (t0: the initial workers are up).
    for rec in records:
        rec.rollout_started -= t0
        rec.rollout_finished -= t0
        rec.train_started -= t0
        rec.train_finished -= t0
        rec.sync_finished -= t0
    for entry in timeline:
        entry["t"] = round(max(0.0, entry["t"] - t0), 6)
    return RLRunResult(
        policy=policy.name,
        trace=trace.source if trace is not None else "",
        records=records,
        started_at=0.0,
        events=events,
        timeline=timeline,
        rollout_gpus=rollout_gpus,
        counters=counters,
        wall_s=time.perf_counter() - wall,
        window_s=setting.duration_s,
    )
