"""Simulator fidelity: the same multi-turn workload on live engines (Ray, wall clock, real
environment sleeps) and in the simulator (fitted CPU profile, virtual time), compared per
turn and on batch makespan."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pearl.apps.calibrate import RANDOM_MODELS, fit_profile
from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.call_timer import Call, TimedWorker
from pearl.control.deployment import Deployment
from pearl.control.interfaces import AsyncioClock, TurnRequest, WorkerRole
from pearl.control.rollout import BatchResult, run_rollout_batch
from pearl.control.router import Router
from pearl.control.scripted import ScriptedChange, run_scripted_batch
from pearl.engine.config import EngineConfig
from pearl.engine.iteration_timing import Sample
from pearl.errors import EngineStateError
from pearl.live.cluster import ensure_ray
from pearl.live.server import ModelSpec
from pearl.live.vllm_setup import check_vllm_version
from pearl.live.worker import LiveKVMover, LiveWorker
from pearl.models.config import ModelConfig
from pearl.report.progress import Progress
from pearl.sim.cost_profile import CostProfile
from pearl.sim.costmodel import CostModel
from pearl.sim.fixed import simulate_fixed_rollout
from pearl.sim.shapes import ModelShape
from pearl.sim.worker import SimEngineConfig
from pearl.workloads.agentic import generate_batch
from pearl.workloads.batch import RolloutBatch
from pearl.workloads.profiles import get_profile, scaled

# The model calibration and fidelity run on (random weights, 15.7M parameters, float32).
CALIBRATION_MODEL: dict[str, Any] = RANDOM_MODELS["qwen3-16m"]

CALIBRATION_ENGINE = EngineConfig(
    block_size=16,
    num_kv_blocks=8448,
    max_num_batched_tokens=512,
    max_num_seqs=64,
    model_id="calibration",
)

logger = logging.getLogger(__name__)

BACKENDS = ("pearl", "vllm")  # the live engine the simulator is measured against
# The simulated twin of a live vLLM worker (beside the sizing its ``stats`` report): its
# calls do not wait for an iteration (``VllmServer`` answers session queries and KV
# exports from its own process, never through vLLM's engine loop), and a colocated worker
# keeps no session's KV between turns (vLLM's prefix cache serves their full blocks). KV of
# other weights is not refused: the vLLM worker drops it and recomputes it, which the
# twin does not model (it decodes on it, as before).
VLLM_TWIN: dict[str, Any] = {
    "calls_wait_for_iteration": False,
    "pin_sessions": False,
    "refuse_kv_of_other_weights": False,
}


@dataclass(slots=True, frozen=True)
class FidelityCase:
    """One workload on one deployment of at most two workers."""

    name: str
    workload: str  # "swe-cpu" or a profile name
    num_tasks: int
    group_size: int
    deployment: str
    seed: int = 0
    changes: tuple[tuple[float, str], ...] = ()
    """Reconfigurations mid-batch: (seconds after the start, deployment after), e.g.
    ``((3.0, "1P1D"),)`` a mode switch, ``((3.0, "1C"),)`` a shrink."""

    def scripted(self) -> list[ScriptedChange]:
        return [ScriptedChange(at, Deployment.parse(to).topology) for at, to in self.changes]

    def batch(self) -> RolloutBatch:
        if self.workload == "swe-cpu":
            # SWE's shape at 1/16 of the tokens; environment times shrunk so compute matters.
            profile = scaled(
                get_profile("swe"), token_factor=1 / 16, time_factor=1 / 200, name="swe-cpu"
            )
        else:
            profile = get_profile(self.workload)
        return generate_batch(
            profile, num_tasks=self.num_tasks, group_size=self.group_size, seed=self.seed
        )


DEFAULT_CASES = (
    FidelityCase("swe-cpu 8 traj, 1 colocated", "swe-cpu", 2, 4, "1C"),
    FidelityCase("swe-cpu 8 traj, 2 colocated", "swe-cpu", 2, 4, "2C"),
    FidelityCase("swe-cpu 8 traj, 1P1D", "swe-cpu", 2, 4, "1P1D"),
    FidelityCase("swe-cpu 16 traj, 2 colocated", "swe-cpu", 4, 4, "2C", seed=1),
    FidelityCase("game 8 traj, 2 colocated", "game", 1, 8, "2C"),
    FidelityCase("game 8 traj, 1P1D", "game", 1, 8, "1P1D"),
    FidelityCase(
        "swe-cpu 8 traj, 2C -> 1P1D at 3 s", "swe-cpu", 2, 4, "2C", seed=2, changes=((3.0, "1P1D"),)
    ),
    FidelityCase(
        "swe-cpu 8 traj, 2C -> 1C at 3 s", "swe-cpu", 2, 4, "2C", seed=2, changes=((3.0, "1C"),)
    ),
)


@dataclass(slots=True)
class CaseResult:
    case: FidelityCase
    live_makespans_s: list[float]  # one per live repeat of the case
    sim_makespan_s: float
    turn_errors: list[float]  # per turn: sim latency vs the live repeats' mean, relative
    live_turn_latency_s: float
    sim_turn_latency_s: float

    @property
    def live_makespan_s(self) -> float:
        """Mean over the live repeats."""
        return statistics.fmean(self.live_makespans_s)

    @property
    def live_spread(self) -> float:
        """(max - min) / mean of the live repeats: the noise the error must be read against."""
        runs = self.live_makespans_s
        return (max(runs) - min(runs)) / self.live_makespan_s

    @property
    def makespan_error(self) -> float:
        """Simulated makespan against the live mean, relative."""
        return (self.sim_makespan_s - self.live_makespan_s) / self.live_makespan_s

    def row(self) -> dict[str, Any]:
        return {
            "case": self.case.name,
            "deployment": self.case.deployment,
            "seed": self.case.seed,
            "live_repeats": len(self.live_makespans_s),
            "live_makespans_s": self.live_makespans_s,
            "live_makespan_s": self.live_makespan_s,
            "live_stdev_s": statistics.stdev(self.live_makespans_s)
            if len(self.live_makespans_s) > 1
            else 0.0,
            "live_spread": self.live_spread,
            "sim_makespan_s": self.sim_makespan_s,
            "makespan_error": self.makespan_error,
            "median_abs_turn_error": statistics.median(abs(e) for e in self.turn_errors),
            "live_mean_turn_s": self.live_turn_latency_s,
            "sim_mean_turn_s": self.sim_turn_latency_s,
        }


def sim_cost(profile: CostProfile, model_config: dict[str, Any]) -> CostModel:
    shape = profile.adapt_model(ModelShape.from_hf_config(model_config, "calibration"))
    gpu = profile.gpu
    if gpu is None:
        raise ValueError("a fidelity run needs a profile with a fitted GPU (run calibration first)")
    return CostModel(gpu, shape, tp=1, constants=profile.constants)


def run_sim_case(
    case: FidelityCase,
    cost: CostModel,
    engine: EngineConfig,
    vocab: int,
    link_latency_s: float,
    request_overhead_s: float = 0.0,
    rpc_overhead_s: float = 0.0,
    wrap: Callable[[Any], Any] | None = None,
    on_iteration: Callable | None = None,
    twin: Mapping[str, Any] | None = None,
    phase_costs: list[CostModel] | None = None,
):
    """The case simulated once; ``wrap``, ``on_iteration`` and ``phase_costs`` (the cost
    model from each of the case's changes on) as in
    :func:`pearl.sim.fixed.simulate_fixed_rollout`; ``twin``: ``SimEngineConfig`` fields
    of the live backend's twin (``VLLM_TWIN`` for vLLM; default: our live worker's)."""
    cfg = SimEngineConfig.mirroring(
        engine,
        max_model_len=CALIBRATION_MODEL["max_position_embeddings"],
        request_overhead_s=request_overhead_s,
        rpc_overhead_s=rpc_overhead_s,
        **(twin or {}),
    )
    report = simulate_fixed_rollout(
        case.batch(),
        cost,
        Deployment.parse(case.deployment),
        cfg,
        vocab_size=vocab,
        size_kv_from_memory=False,
        link_latency_s=link_latency_s,
        changes=case.scripted(),
        wrap=wrap,
        on_iteration=on_iteration,
        phase_costs=phase_costs or (),
    )
    return report.result


async def _live_workers(
    deployment: Deployment, model, engine: EngineConfig, backend: str = "pearl"
):

    workers = [
        LiveWorker(f"w{i}", model, engine, WorkerRole.COLOCATED, backend=backend)
        for i in range(deployment.num_workers)
    ]
    await asyncio.gather(*(w.ready() for w in workers))
    # Warm up each process (first iterations pay one-off allocation costs), then assign roles.
    for w in workers:
        await w.generate(TurnRequest("warmup", "warmup", list(range(1, 200)), 16))
        await w.release_session("warmup")
    if not deployment.colocated:
        for w in workers[: deployment.prefill]:
            await w.set_role(WorkerRole.PREFILL)
        for w in workers[deployment.prefill :]:
            await w.set_role(WorkerRole.DECODE)
    return workers


def run_live_case(
    case: FidelityCase,
    model,
    engine: EngineConfig,
    vocab: int,
    wrap: Callable[[Any], Any] | None = None,
    backend: str = "pearl",
) -> tuple[BatchResult, list]:
    """The case on live workers of ``backend``; also every worker's iteration log (shapes
    and seconds). ``wrap`` replaces each worker handle the router sees (e.g. a timing
    proxy)."""
    return run_live_batch(
        case.batch(),
        Deployment.parse(case.deployment),
        model,
        engine,
        vocab,
        case.scripted(),
        wrap,
        backend,
    )


def run_live_batch(
    batch: RolloutBatch,
    deployment: Deployment,
    model,
    engine: EngineConfig,
    vocab: int,
    changes: list[ScriptedChange] | tuple = (),
    wrap: Callable[[Any], Any] | None = None,
    backend: str = "pearl",
) -> tuple[BatchResult, list]:
    """``batch`` on fresh live workers of ``deployment`` (reconfigured by ``changes``) of
    ``backend``'s engine; also every worker's iteration log."""

    async def main() -> tuple[BatchResult, list]:
        workers = await _live_workers(deployment, model, engine, backend)
        seen = [wrap(w) for w in workers] if wrap is not None else workers
        router = Router(LiveKVMover())
        if deployment.colocated:
            router.set_topology(colocated=seen)
        else:
            router.set_topology(
                prefill=seen[: deployment.prefill], decode=seen[deployment.prefill :]
            )
        stopped: list = []  # iteration logs of workers a shrink ended
        killed: list = []

        async def stop(handle) -> None:
            worker = workers[next(i for i, h in enumerate(seen) if h is handle)]
            stopped.append(await worker.actor.log_iterations.remote(False))
            killed.append(worker)
            worker.kill()

        try:
            await asyncio.gather(*(w.actor.log_iterations.remote(True) for w in workers))
            config = AgentLoopConfig(vocab)
            if changes:
                result = await run_scripted_batch(
                    batch,
                    seen,
                    deployment.topology,
                    list(changes),
                    router.kv_mover,
                    AsyncioClock(),
                    config,
                    stop=stop,
                )
            else:
                result = await run_rollout_batch(batch, router, AsyncioClock(), config)
            alive = [w for w in workers if all(w is not k for k in killed)]
            logs = stopped + list(
                await asyncio.gather(*(w.actor.log_iterations.remote(False) for w in alive))
            )
            return result, [it for log in logs for it in log]
        finally:
            for w in workers:
                w.kill()

    return asyncio.run(main())


def iteration_check(cost: CostModel, log: list) -> dict[str, float]:
    """Live iterations against the cost model's prediction for the same batch shapes:
    total measured / total predicted seconds, the median per-iteration ratio, and the
    seconds the engines were busy."""
    if not log:
        return {"time_ratio": 1.0, "median_ratio": 1.0, "busy_s": 0.0}
    measured = [seconds for _, _, seconds in log]
    predicted = [cost.iteration_time(prefills, decodes) for prefills, decodes, _ in log]
    ratios = [m / p for m, p in zip(measured, predicted, strict=True) if p > 0]
    return {
        "time_ratio": sum(measured) / max(1e-12, sum(predicted)),
        "median_ratio": statistics.median(ratios) if ratios else 1.0,
        "busy_s": sum(measured),
    }


def measure_transfer(
    model, engine: EngineConfig, sizes=(64, 512, 2048), backend: str = "pearl"
) -> tuple[float, float]:
    """Fit (latency s, bandwidth B/s) of an actor-to-actor KV move from a few sizes."""

    async def main() -> list[tuple[int, float]]:
        workers = await _live_workers(Deployment(prefill=1, decode=1), model, engine, backend)
        p, d = workers
        mover = LiveKVMover()
        points = []
        for i, n in enumerate(sizes):
            for rep in range(3):
                sid = f"xfer{i}-{rep}"
                await p.prefill(TurnRequest(sid, sid, [1 + (j % 50) for j in range(n)], 2))
                nbytes, seconds = await mover.move(p, d, sid, [], 0, n)
                points.append((nbytes, seconds))
        for w in workers:
            w.kill()
        return points

    points = asyncio.run(main())
    xs = [b for b, _ in points]
    ys = [s for _, s in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / max(
        1e-30, sum((x - mx) ** 2 for x in xs)
    )
    slope = max(slope, 1e-12)
    latency = max(0.0, my - slope * mx)
    return latency, 1.0 / slope


def calibrate_in_worker(
    model,
    engine: EngineConfig,
    grid: str = "default",
    repeats: int = 5,
    concurrent: int = 1,
    model_config: dict[str, Any] = CALIBRATION_MODEL,
):
    """Fit a profile from iterations timed inside live worker processes (wall clock), with
    ``concurrent`` workers profiling at once (the host's load in a deployment of that many
    workers), and measure the per-turn overhead outside the engine (RPC and driver),
    median of 20 turns on one worker."""

    async def main():
        workers = await _live_workers(Deployment(colocated=concurrent), model, engine)
        batches = await asyncio.gather(
            *(w.actor.profile.remote(grid, repeats, "wall") for w in workers)
        )
        samples = [s for batch in batches for s in batch]
        worker = workers[0]
        overheads = []
        for i in range(20):
            before = await worker.stats()
            t0 = time.monotonic()
            await worker.generate(TurnRequest(f"probe{i}", f"probe{i}", [1 + i, 2, 3, 4, 5], 1))
            elapsed = time.monotonic() - t0
            after = await worker.stats()
            busy = (after["model_time"] + after["scheduler_time"]) - (
                before["model_time"] + before["scheduler_time"]
            )
            overheads.append(max(0.0, elapsed - busy))
        rpcs = []
        for i in range(20):
            t0 = time.monotonic()
            await worker.session_length(f"probe{i}")
            rpcs.append(time.monotonic() - t0)
        for w in workers:
            w.kill()
        return samples, statistics.median(overheads), statistics.median(rpcs)

    samples, overhead, rpc = asyncio.run(main())
    shape = ModelShape.from_hf_config(model_config, "calibration", dtype_bytes=4)
    profile, report = fit_profile(samples, shape, clock="wall")
    return profile, report, (overhead, rpc), samples


# In-situ calibration: live runs of these workloads (seed CALIBRATION_SEED, which no case
# uses) on colocated workers; every iteration they run becomes a fitting sample.
CALIBRATION_WORKLOADS = (("swe-cpu", 2, 4), ("game", 1, 8))
CALIBRATION_SEED = 100
MAX_FIT_SAMPLES = 800
MIN_HELD_OUT_RUNS = 3  # per in-situ fit; see held_out_plan


@dataclass(slots=True)
class HeldOut:
    """What held-out live runs measured for one fit: the engines' iterations (fitting
    samples) and the gap of every turn call (driver-side minus engine-side seconds)."""

    samples: list = dataclasses.field(default_factory=list)
    gaps: list[float] = dataclasses.field(default_factory=list)

    def extend(self, other: HeldOut) -> None:
        self.samples += other.samples
        self.gaps += other.gaps

    def load_overheads(self, idle_overhead_s: float, idle_rpc_s: float) -> tuple[float, float]:
        """(per-turn-call overhead, per-query call cost) under the runs' load: the turn
        calls' median gap, and the idle query cost plus what load added to a turn call
        (the actor's event loop and Ray's scheduling delay every call alike)."""
        if not self.gaps:
            return idle_overhead_s, idle_rpc_s
        loaded = statistics.median(self.gaps)
        return loaded, idle_rpc_s + max(0.0, loaded - idle_overhead_s)


def held_out_samples(
    model,
    engine: EngineConfig,
    vocab: int,
    deployment: str,
    workload: str | None = None,
    backend: str = "pearl",
) -> HeldOut:
    """The iterations live engines ran in the held-out workloads (or only ``workload``'s) on
    ``deployment`` (``2C``, ``1P1D``: as deployed, the driver, Ray and the other engine
    share the host, and prefill or decode workers run their own batch shapes), as fitting
    samples, and the gaps of their turn calls."""

    out = HeldOut()
    for name, tasks, group in CALIBRATION_WORKLOADS:
        if workload is not None and name != workload:
            continue
        case = FidelityCase(
            f"calibration {name}", name, tasks, group, deployment, seed=CALIBRATION_SEED
        )
        calls: list[Call] = []
        _, log = run_live_case(
            case, model, engine, vocab, lambda w, calls=calls: TimedWorker(w, calls), backend
        )
        out.samples += [
            Sample(tuple(tuple(c) for c in prefills), tuple(decodes), seconds)
            for prefills, decodes, seconds in log
        ]
        out.gaps += [c.gap_s for c in calls if c.gap_s is not None]
    unknown = sum(1 for s in out.samples if any(c < 1 for c in s.decode_contexts))
    if unknown:  # said now, not when the fit runs after every case has run live
        raise EngineStateError(
            f"{unknown} of the {len(out.samples)} iterations {backend} logged in a held-out "
            f"run on {deployment} have a decode context < 1: the fit cannot price them"
        )
    return out


def fit_in_situ(
    samples: list, grid_samples: list, model_config: dict[str, Any] = CALIBRATION_MODEL
):
    """A profile fitted to held-out live iterations plus the grid (for shapes the runs did
    not visit); the live iterations set the fit's level (the grid was timed on an idle
    worker: faster than a loaded deployment)."""

    stride = max(1, len(samples) // MAX_FIT_SAMPLES)
    shape = ModelShape.from_hf_config(model_config, "calibration", dtype_bytes=4)
    return fit_profile(
        list(grid_samples) + samples[::stride],
        shape,
        clock="wall",
        anchor=len(grid_samples),
        set_level=True,
    )


CALIBRATIONS = ("in-situ", "grid", "grid-load")


def _in_situ_key(case: FidelityCase, deployment: str | None = None) -> str:
    """The in-situ fit a case uses on ``deployment`` (default: its first): held-out runs of
    its own workload (other seeds) on that deployment, e.g. ``1P1D/swe-cpu`` (workloads
    differ in batch shapes: one fit over both is biased toward the one with more
    iterations)."""
    return f"{_fit_key(deployment or case.deployment)}/{case.workload}"


def _phase_deployments(case: FidelityCase) -> list[str]:
    """The deployments a case runs on, in order: its first, then one per change."""
    return [case.deployment, *(to for _, to in case.changes)]


def _fit_key(deployment: str) -> str:
    """The fit a case uses: its own deployment's label (``2C``, ``1P1D``)."""
    return Deployment.parse(deployment).label


def _check_compare_args(
    cases,
    calibration: str,
    live_repeats: int,
    backend: str = "pearl",
    profile: CostProfile | None = None,
) -> None:
    """Raise ValueError for an unknown ``calibration`` or ``backend``, ``live_repeats`` < 1,
    a case that uses the calibration seed, or a calibration vLLM cannot take."""
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration {calibration!r} is not one of {', '.join(CALIBRATIONS)}")
    if live_repeats < 1:
        raise ValueError(f"live_repeats must be >= 1, got {live_repeats}")
    if any(c.seed == CALIBRATION_SEED for c in cases):
        raise ValueError(f"fidelity cases must not use the calibration seed {CALIBRATION_SEED}")
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "vllm" and (profile is not None or calibration != "in-situ"):
        raise ValueError(
            "against vLLM the cost model is fitted in situ only (--calibration in-situ): the "
            "grid is timed in our engine's worker, which vLLM's has no way to run"
        )


@dataclass(slots=True)
class _Backend:
    """The engine a comparison runs live, as set up for it (``_set_up_backend``)."""

    model: Any  # pearl.live.server.ModelSpec
    profiles: dict[str, CostProfile]  # the fits made before any in-situ one
    overhead: float  # per-turn seconds outside the engine
    rpc: float  # seconds of another worker call
    grid_samples: list
    twin: Mapping[str, Any] | None  # the simulated twin's engine settings (vLLM)
    sim_engine: EngineConfig


def _set_up_backend(
    backend: str,
    folder: str | None,
    profile: CostProfile | None,
    model_config: dict[str, Any],
    engine: EngineConfig,
    kinds: list[str],
    calibration: str,
    log: Callable[[str], None],
) -> _Backend:
    """The live engine's model and its measured overheads (logged): for vLLM, the
    random-weight model saved to ``folder`` and the worker's own sizing; for ours, the grid
    fits."""

    if backend == "vllm":
        assert folder is not None
        # vLLM loads a folder: the same random-weight model, written once for this run.
        _save_random_model(model_config, folder)
        model = ModelSpec(folder=folder)
        overhead, rpc, sizing = measure_vllm_overheads(model, engine)
        log(f"vLLM worker as sized: {sizing}; simulated twin: {VLLM_TWIN}")
        sim_engine = EngineConfig(**sizing, model_id="calibration")
        live = _Backend(model, {}, overhead, rpc, [], VLLM_TWIN, sim_engine)
    else:
        model = ModelSpec(config=model_config, seed=0)
        profiles, overhead, rpc, grid_samples = _grid_profiles(
            profile, model, engine, kinds, calibration, log
        )
        live = _Backend(model, profiles, overhead, rpc, grid_samples, None, engine)
    log(
        f"per-turn overhead outside the engine: {overhead * 1e3:.2f} ms; other worker "
        f"calls (session_length, release_session): {rpc * 1e3:.2f} ms"
    )
    return live


@contextmanager
def _model_folder(backend: str) -> Iterator[str | None]:
    """A temporary folder for the model vLLM loads (None for our engine), removed after."""
    folder = tempfile.mkdtemp(prefix="pearl-calibration-") if backend == "vllm" else None
    try:
        yield folder
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _grid_profiles(
    profile: CostProfile | None,
    model,
    engine: EngineConfig,
    kinds: list[str],
    calibration: str,
    log: Callable[[str], None],
) -> tuple[dict[str, CostProfile], float, float, list]:
    """The fits before any in-situ one (``1C``, plus ``nC`` per size with ``grid-load``), the
    idle per-turn overhead and call cost, and the grid samples (0, 0, [] given ``profile``)."""
    profiles: dict[str, CostProfile] = {}
    overhead = rpc = 0.0
    grid_samples: list = []
    if profile is None:
        log("fidelity phase 1/3: fit the cost model inside a worker process")
        fitted, report, (overhead, rpc), grid_samples = calibrate_in_worker(model, engine)
        profiles["1C"] = fitted
        log("fit from the grid inside one worker process (wall clock):")
        log(report.table())
        if calibration == "grid-load":
            for kind in kinds:
                n = Deployment.parse(kind).num_workers
                if n == 1 or f"{n}C" in profiles:
                    continue
                profiles[f"{n}C"], report, _, _ = calibrate_in_worker(model, engine, concurrent=n)
                log(f"fit from the grid timed in {n} workers at once (wall clock):")
                log(report.table())
    else:
        profiles["1C"] = profile
    return profiles, overhead, rpc, grid_samples


def held_out_plan(cases) -> list[list[tuple[str, str]]]:
    """Per case, the held-out runs that follow its live repeats, as (fit key, deployment):
    every in-situ fit a case uses (one per deployment it runs on) gets at least
    ``MIN_HELD_OUT_RUNS``, shared among the cases that use it (a fit from a single run
    carries that run's machine load: on this 2-core host one run's iterations differ from
    another's by ~10%, which set a case's error directly)."""
    users: dict[str, int] = {}
    for case in cases:
        for key in {_in_situ_key(case, d) for d in _phase_deployments(case)}:
            users[key] = users.get(key, 0) + 1
    plan = []
    for case in cases:
        runs: list[tuple[str, str]] = []
        for d in dict.fromkeys(_fit_key(d) for d in _phase_deployments(case)):
            key = _in_situ_key(case, d)
            runs += [(key, d)] * -(-MIN_HELD_OUT_RUNS // users[key])
        plan.append(runs)
    return plan


def _run_cases_live(
    cases,
    model,
    engine: EngineConfig,
    vocab: int,
    live_repeats: int,
    in_situ: bool,
    log: Callable[[str], None],
    backend: str = "pearl",
) -> tuple[list[list], dict[str, HeldOut]]:
    """Each case's ``live_repeats`` live runs, in case order, and (``in_situ``) the held-out
    runs of its fits (:func:`held_out_plan`), each after one of its live runs, keyed by
    :func:`_in_situ_key`."""
    lives_of: list[list] = []
    held_out: dict[str, HeldOut] = {}
    plan = held_out_plan(cases) if in_situ else [[] for _ in cases]
    log(
        f"fidelity phase 2/3: {len(cases)} cases live, {live_repeats} runs each"
        + (f", {sum(map(len, plan))} held-out runs between them" if in_situ else "")
    )
    with Progress(len(cases), "fidelity cases run live", logger=__name__) as bar:
        for case, runs in zip(cases, plan, strict=True):
            t0 = time.perf_counter()
            lives: list = []
            for k in range(max(live_repeats, len(runs))):
                if k < live_repeats:
                    lives.append(run_live_case(case, model, engine, vocab, backend=backend))
                if k < len(runs):
                    key, kind = runs[k]
                    held_out.setdefault(key, HeldOut()).extend(
                        held_out_samples(model, engine, vocab, kind, case.workload, backend)
                    )
            lives_of.append(lives)
            bar.advance(
                f"{case.name:32s} live x{live_repeats}, held-out x{len(runs)} done "
                f"({time.perf_counter() - t0:.0f}s)"
            )
    return lives_of, held_out


def _fit_held_out(
    held_out: dict[str, HeldOut],
    grid_samples: list,
    profiles: dict[str, CostProfile],
    overhead: float,
    rpc: float,
    log: Callable[[str], None],
) -> dict[str, tuple[float, float]]:
    """Add each held-out key's in-situ fit to ``profiles`` (in place), logging it; return each
    key's (per-turn-call overhead, other call cost) under load."""
    overheads: dict[str, tuple[float, float]] = {}
    for kind, measured in sorted(held_out.items()):
        profiles[kind], report = fit_in_situ(measured.samples, grid_samples)
        overheads[kind] = measured.load_overheads(overhead, rpc)
        log(f"fit from held-out live runs on {kind} plus the grid (wall clock):")
        log(report.table())
        log(
            f"  under load: per-turn-call overhead {overheads[kind][0] * 1e3:.2f} ms, other "
            f"calls {overheads[kind][1] * 1e3:.2f} ms"
        )
    return overheads


def _sim_costs(
    profiles: dict[str, CostProfile], bandwidth: float, model_config: dict[str, Any]
) -> dict[str, CostModel]:
    """Each fit's cost model for ``model_config``, with the measured actor-to-actor
    ``bandwidth`` as both its NVLink and network bandwidth."""
    costs = {}
    for kind, fitted in profiles.items():
        gpu = dataclasses.replace(
            fitted.gpu, nvlink_bandwidth_Bps=bandwidth, network_bandwidth_Bps=bandwidth
        )
        costs[kind] = sim_cost(dataclasses.replace(fitted, gpu=gpu), model_config)
    return costs


def _turn_errors(sim: BatchResult, lives: list) -> tuple[list[float], list[float], list[float]]:
    """Per simulated turn: relative latency error against the live repeats' mean, the live
    mean and the simulated latency (asserts both saw the same turns)."""
    sim_turns = {(t.session_id, k): o for t in sim.trajectories for k, o in enumerate(t.turns)}
    live_latency: dict[tuple[str, int], list[float]] = {}
    for live, _ in lives:
        turns = {(t.session_id, k): o for t in live.trajectories for k, o in enumerate(t.turns)}
        assert turns.keys() == sim_turns.keys(), "live and simulated runs saw different turns"
        for key, o in turns.items():
            live_latency.setdefault(key, []).append(
                o.telemetry.finished_at - o.telemetry.submitted_at
            )
    errors = []
    lat_live, lat_sim = [], []
    for key, so in sim_turns.items():
        a = statistics.fmean(live_latency[key])
        b = so.telemetry.finished_at - so.telemetry.submitted_at
        lat_live.append(a)
        lat_sim.append(b)
        errors.append((b - a) / a if a > 0 else 0.0)
    return errors, lat_live, lat_sim


def _cost_for(costs: dict[str, CostModel], case: FidelityCase, deployment: str) -> CostModel:
    """The cost model of ``case`` on ``deployment``: its in-situ fit, else the fit of the
    deployment (``grid-load``: of its size), else the grid's."""
    kind = _fit_key(deployment)
    n = Deployment.parse(kind).num_workers
    return (
        costs.get(_in_situ_key(case, deployment))
        or costs.get(kind)
        or costs.get(f"{n}C")
        or costs["1C"]
    )


def _compare_case(
    case: FidelityCase,
    lives: list,
    costs: dict[str, CostModel],
    overheads: tuple[float, float],
    engine: EngineConfig,
    vocab: int,
    latency: float,
    log: Callable[[str], None],
    twin: Mapping[str, Any] | None = None,
) -> CaseResult:
    """Simulate ``case`` once with its fits' cost models (each deployment it runs on priced
    by that deployment's fit) and ``overheads`` (per-turn call, other calls), compare with
    its live runs ``lives`` and log the comparison."""
    cost, *phases = (_cost_for(costs, case, d) for d in _phase_deployments(case))
    iterations = [it for _, log_ in lives for it in log_]
    check = iteration_check(cost, iterations)  # against its first deployment's fit
    case_overhead, case_rpc = overheads
    sim = run_sim_case(
        case, cost, engine, vocab, latency, case_overhead, case_rpc, twin=twin, phase_costs=phases
    )
    errors, lat_live, lat_sim = _turn_errors(sim, lives)
    result = CaseResult(
        case,
        [live.makespan_s for live, _ in lives],
        sim.makespan_s,
        errors,
        statistics.fmean(lat_live),
        statistics.fmean(lat_sim),
    )
    row = result.row()
    log(
        f"{case.name:32s} live {row['live_makespan_s']:7.2f}s "
        f"(x{len(lives)}, spread {100 * row['live_spread']:.0f}%)  sim {row['sim_makespan_s']:7.2f}s  "
        f"makespan err {100 * row['makespan_error']:+6.1f}%  median |turn err| "
        f"{100 * row['median_abs_turn_error']:5.1f}%"
    )
    log(
        f"{'':32s} live iterations: {len(iterations)}, {check['busy_s']:.2f} s busy, "
        f"{check['time_ratio']:.2f}x the profile's prediction (median {check['median_ratio']:.2f}x)"
    )
    return result


def compare(
    profile: CostProfile | None,
    cases=DEFAULT_CASES,
    model_config: dict[str, Any] = CALIBRATION_MODEL,
    engine: EngineConfig = CALIBRATION_ENGINE,
    log: Callable[[str], None] = logger.info,
    calibration: str = "in-situ",
    live_repeats: int = 3,
    backend: str = "pearl",
) -> list[CaseResult]:
    """Run every case live ``live_repeats`` times (on ``backend``'s engine: ours, or vLLM's
    with the simulated twin ``VLLM_TWIN`` sized as the live vLLM worker reports) and
    simulated once; return the per-case comparison against the live mean.

    With ``profile`` None the cost model is fitted here, inside worker processes:
    ``grid`` from the calibration grid timed in one worker; ``grid-load`` from the grid
    timed in n workers at once, one fit per deployment size n; ``in-situ`` (default) per
    deployment and workload from the iterations of held-out live runs of that workload (seed
    ``CALIBRATION_SEED``) on that deployment (plus the grid). The held-out runs are
    interleaved with the cases' live runs (each fit gets at least ``MIN_HELD_OUT_RUNS``,
    each after a live run of a case that uses it), so the fit samples the machine's load at
    the times the cases ran; the fits are made once every live run is done, then each case
    is simulated.
    """

    _check_compare_args(cases, calibration, live_repeats, backend, profile)
    ensure_ray(2)
    vocab = model_config["vocab_size"]
    # One fit per deployment the cases use, keyed by its label with colocated ones as "nC".
    kinds = sorted({_fit_key(c.deployment) for c in cases})
    with _model_folder(backend) as folder:
        live = _set_up_backend(
            backend, folder, profile, model_config, engine, kinds, calibration, log
        )
        in_situ = profile is None and calibration == "in-situ"
        latency, bandwidth = measure_transfer(live.model, engine, backend=backend)
        log(f"KV transfer between actors: {latency * 1e3:.2f} ms + {bandwidth / 1e6:.0f} MB/s")

        # Live: every case's repeats, each followed (in-situ) by a held-out pass on its
        # deployment.
        lives_of, held_out = _run_cases_live(
            cases, live.model, engine, vocab, live_repeats, in_situ, log, backend
        )
    log("fidelity phase 3/3: fit per deployment, then simulate each case")
    overheads = _fit_held_out(
        held_out, live.grid_samples, live.profiles, live.overhead, live.rpc, log
    )
    costs = _sim_costs(live.profiles, bandwidth, model_config)

    # Simulated: each case once, with its deployment's fit; compared with the live mean.
    results = []
    for case, lives in zip(cases, lives_of, strict=True):
        case_overheads = overheads.get(_in_situ_key(case), (live.overhead, live.rpc))
        results.append(
            _compare_case(
                case, lives, costs, case_overheads, live.sim_engine, vocab, latency, log, live.twin
            )
        )
    return results


def check_backend(backend: str) -> None:
    """``ConfigError`` (one line) if ``backend``'s engine cannot run here: for vLLM, not
    installed, or not the release its hooks were written against."""
    if backend == "vllm":
        check_vllm_version()


def _save_random_model(model_config: dict[str, Any], folder: str) -> None:
    """The random-weight model our engine builds from ``model_config`` (seed 0), saved as
    a Hugging Face folder."""
    from pearl.models.loader import build_model, save_model  # torch

    save_model(build_model(ModelConfig.from_dict(model_config), seed=0), folder)


def measure_vllm_overheads(model, engine: EngineConfig) -> tuple[float, float, dict[str, int]]:
    """On one live vLLM worker: the per-turn overhead outside its engine (a short turn's
    latency minus the iterations vLLM logged meanwhile, median of 20), a session query's
    round trip (median of 20), and how vLLM sized itself (KV blocks, token budget)."""

    async def main():
        (worker,) = await _live_workers(Deployment(colocated=1), model, engine, "vllm")
        try:
            overheads, rpcs = [], []
            for i in range(20):
                await worker.actor.log_iterations.remote(True)
                t0 = time.monotonic()
                await worker.generate(TurnRequest(f"probe{i}", f"probe{i}", [1 + i, 2, 3, 4], 1))
                elapsed = time.monotonic() - t0
                log = await worker.actor.log_iterations.remote(False)
                overheads.append(max(0.0, elapsed - sum(seconds for _, _, seconds in log)))
            for i in range(20):
                t0 = time.monotonic()
                await worker.session_length(f"probe{i}")
                rpcs.append(time.monotonic() - t0)
            stats = await worker.stats()
        finally:
            worker.kill()
        sizing = {
            k: int(stats[k])
            for k in ("block_size", "num_kv_blocks", "max_num_batched_tokens", "max_num_seqs")
        }
        return statistics.median(overheads), statistics.median(rpcs), sizing

    return asyncio.run(main())
