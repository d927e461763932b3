"""A whole asynchronous RL run in the simulated world, under one rollout policy.

``run_policy`` drives the control plane (``pearl.control.driver``) over a ``SimWorld`` in
virtual time, replays a GPU availability trace, and records every step, reconfiguration
and role change, and where the rollout workers' time went. The cluster is PEARL's
evaluation layout: dedicated rollout GPUs (reserved + preemptible), then the training
GPUs, whose TP groups form the overlap zone that can be borrowed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from dataclasses import dataclass, field

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.decision import DecisionConfig
from pearl.control.driver import Availability, ClusterSize, ForwardingListener, RunDriver
from pearl.control.elastic import RoleDecider
from pearl.control.pipeline import PipelineConfig, StepRecord
from pearl.control.policies import Policy, Pool
from pearl.control.state import TableSnapshot, WorkerStatus, Zone
from pearl.sim.clock import run_virtual
from pearl.sim.costmodel import CostModel
from pearl.sim.network import Network
from pearl.sim.worker import SimEngineConfig, TimeUse
from pearl.sim.world import SimWorld, prior_params
from pearl.workloads.agentic import step_batch
from pearl.workloads.availability import AvailabilityTrace
from pearl.workloads.profiles import AgenticProfile


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
    keep_results: bool = False
    """Keep every step's turn outputs in ``RLRunResult.records`` (tests check them); by
    default a finished step keeps only its counts, so memory stays flat in steps."""

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
                    **_prefill_record(rec),
                    **{f"time/{k}_s": v for k, v in rec.time_breakdown.items()},
                }
            )
            previous = rec.sync_finished
        return rows


def _prefill_record(rec: StepRecord) -> dict[str, float]:
    """The step's prompt tokens computed and served from cached KV (prefix cache or a
    session's kept KV), and the hit rate: how much of the prefill work reuse saved."""
    computed, cached = rec.prefill_tokens_computed, rec.prefill_tokens_cached
    if computed is None or cached is None:  # not rolled out
        return {}
    total = computed + cached
    return {
        "rollout/prefill_tokens_computed": computed,
        "rollout/prefill_tokens_cached": cached,
        "rollout/prefix_cache_hit_rate": cached / total if total else 0.0,
    }


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


class ActiveWorkerSeconds:
    """Active rollout worker-seconds, integrated over the table's changes (what the
    workers' time breakdown is a breakdown of), and the role timeline: a table listener."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.workers = 0
        self.since = loop.time()
        self.seconds = 0.0
        self.timeline: list[dict] = []

    def integrate(self) -> None:
        now = self.loop.time()
        self.seconds += self.workers * (now - self.since)
        self.since = now

    def __call__(self, snap: TableSnapshot) -> None:
        self.integrate()
        rollout = [s for s in snap.slots if s.status is WorkerStatus.ACTIVE and not s.is_training]
        self.workers = len(rollout)
        counts: dict[str, int] = {}
        for s in rollout:
            key = f"{'overlap' if s.zone is Zone.OVERLAP else 'dedicated'}_{s.role}"
            counts[key] = counts.get(key, 0) + 1
        entry = {"t": round(self.loop.time(), 6), **dict(sorted(counts.items()))}
        timeline = self.timeline
        if timeline and timeline[-1]["t"] == entry["t"]:
            timeline[-1] = entry
        elif not timeline or {k: v for k, v in timeline[-1].items() if k != "t"} != {
            k: v for k, v in entry.items() if k != "t"
        }:
            timeline.append(entry)


class TimeBreakdown(ForwardingListener):
    """At each rollout batch's end, records where the rollout workers' time went since the
    previous one (worker-seconds per ``TimeUse``; idle with no work is what the others
    leave of the active worker-seconds), then forwards the hook."""

    def __init__(self, plane, active: ActiveWorkerSeconds) -> None:
        super().__init__(plane)
        self.active = active
        self.rows: list[dict[str, float]] = []
        self._last: dict[str, float] = {}
        self._last_active = 0.0

    async def on_rollout_finished(self, step: int, result) -> None:
        self.active.integrate()
        workers = self.plane.made
        totals = {str(u): sum(w.counters.time_s[u] for w in workers) for u in TimeUse}
        row = {u: v - self._last.get(u, 0.0) for u, v in totals.items()}
        worker_s = self.active.seconds - self._last_active
        claimed = sum(v for u, v in row.items() if u != TimeUse.IDLE_NO_WORK)
        row[str(TimeUse.IDLE_NO_WORK)] = max(0.0, worker_s - claimed)
        self.rows.append(row)
        self._last, self._last_active = totals, self.active.seconds
        await super().on_rollout_finished(step, result)


def _run_counters(plane, events: list[dict]) -> dict:
    counters = {
        "reconfigurations": sum(1 for e in events if e["kind"] in ("reassign", "shrink")),
        "role_switches": sum(len(e["roles"]) for e in events if e["kind"] == "reassign"),
        **plane.counters(),
        "trainer_busy_s": plane.trainer.busy_s,
    }
    counters["sim_iterations"] = sum(w.counters.iterations for w in plane.made)
    counters["sim_fast_forwarded_iterations"] = sum(
        w.counters.fast_forwarded_iterations for w in plane.made
    )
    counters["time_by_worker_s"] = {
        w.worker_id: {str(k): v for k, v in w.counters.time_s.items() if v} for w in plane.made
    }
    return counters


def _world(setting: RLSetting, training_base: int) -> SimWorld:
    """The simulated world of a run: workers' KV sized from GPU memory, a network of the
    nodes up to the last training GPU, the cost model's prior."""
    cost = setting.cost
    blocks = max(2, cost.kv_capacity_tokens() // setting.engine.block_size)
    engine = dataclasses.replace(setting.engine, num_kv_blocks=blocks)
    nodes = math.ceil((training_base + setting.training_gpus) / cost.gpu.gpus_per_node)
    bandwidth = cost.tp * cost.gpu.network_bandwidth_Bps
    return SimWorld(
        cost,
        engine,
        Network.for_gpu(cost.gpu, nodes),
        setting.training_gpus,
        prior_params(cost, setting.profile, setting.engine, bandwidth),
        setting.check_invariants,
    )


def _from_start(records: list[StepRecord], timeline: list[dict], t0: float) -> None:
    """Report times from the start of the run (``t0``: the initial workers are up)."""
    for rec in records:
        rec.rollout_started -= t0
        rec.rollout_finished -= t0
        rec.train_started -= t0
        rec.train_finished -= t0
        rec.sync_finished -= t0
    for entry in timeline:
        entry["t"] = round(max(0.0, entry["t"] - t0), 6)


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
    cost = setting.cost
    if policy.pool is Pool.ELASTIC and trace is None:
        raise ValueError(f"policy {policy.name} follows an availability trace; none given")
    availability = Availability.from_trace(trace) if trace is not None else Availability()
    cluster = ClusterSize(
        cost.tp,
        setting.reserved_gpus,
        setting.max_preemptible_gpus,
        setting.training_gpus,
        cost.gpu.gpus_per_node,
    )
    layout = cluster.layout_for(policy, availability.mean)
    world = _world(setting, layout.training_base)
    log = _RunLog(layout.reserved_workers * layout.tp)
    (records, counters, time_rows, timeline), _ = run_virtual(
        lambda: _simulate(setting, policy, cluster, availability, world, decider, log)
    )
    for rec, times in zip(records, time_rows, strict=False):
        rec.time_breakdown = times
    _from_start(records, timeline, log.t0)
    return RLRunResult(
        policy=policy.name,
        trace=trace.source if trace is not None else "",
        records=records,
        started_at=0.0,
        events=log.events,
        timeline=timeline,
        rollout_gpus=log.rollout_gpus,
        counters=counters,
        wall_s=time.perf_counter() - wall,
        window_s=setting.duration_s,
    )


class _RunLog:
    """The run's elastic events and rollout-GPU budget over time, in seconds from the start
    of the run (``t0``: reset once the initial workers are up)."""

    def __init__(self, reserved_gpus: int) -> None:
        self.reserved_gpus = reserved_gpus
        self.loop: asyncio.AbstractEventLoop | None = None  # the run's (set as it starts)
        self.t0 = 0.0
        self.events: list[dict] = []
        self.rollout_gpus: list[tuple[float, int]] = []

    def __call__(self, event: dict) -> None:
        assert self.loop is not None  # events come from the running simulation
        t = round(max(0.0, event.get("t", self.loop.time()) - self.t0), 6)
        self.events.append({**event, "t": t})
        if event["kind"] == "availability" and t > 0:  # the budget behind each step
            self.rollout_gpus.append((t, self.reserved_gpus + event["budget_gpus"]))


async def _simulate(
    setting: RLSetting,
    policy: Policy,
    cluster: ClusterSize,
    availability: Availability,
    world: SimWorld,
    decider: RoleDecider | None,
    log: _RunLog,
) -> tuple[list[StepRecord], dict, list[dict], list[dict]]:
    """The run in virtual time: start the initial workers, run RL steps until the deadline;
    the step records, counters, time breakdown per step and role timeline."""
    loop = log.loop = asyncio.get_running_loop()
    log.t0 = loop.time()
    driver = RunDriver(world, policy, cluster, availability, setting.decision, log, decider)
    plane = driver.plane
    active = ActiveWorkerSeconds(loop)
    plane.table.listeners.append(active)
    await driver.start()
    log.t0 = loop.time()
    log.rollout_gpus.append((0.0, log.reserved_gpus + plane.elastic.budget_gpus))
    breakdown = TimeBreakdown(plane, active)
    records = await driver.run(
        lambda i: step_batch(setting.profile, setting.seed, i),
        # Records keep only counts unless the caller inspects the turns (keep_results).
        AgentLoopConfig(
            vocab_size=setting.cost.model.vocab_size,
            keep_tokens=setting.keep_results,
            token_runs=True,
        ),
        PipelineConfig(
            num_steps=1_000_000,
            max_staleness=setting.max_staleness,
            overlap_batches=setting.overlap_batches,
            deadline_s=setting.duration_s,
            keep_results=setting.keep_results,
        ),
        listener=breakdown,
    )
    counters = _run_counters(plane, log.events)
    counters["sim_turns"] = sum(r.turns for r in records)
    for w in plane.all_workers():
        w.close()
    return records, counters, breakdown.rows, active.timeline
