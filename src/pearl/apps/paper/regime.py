"""The simulator against the paper's workload regime: PEARL's §3 characterization, rows C2-C8.

A simulator reproduces PEARL's numbers only if it runs in the same regime: the same
balance of prefill, decode, environment time and training time. The paper characterizes
that regime (§2.1, §3.1-3.3, §6.5.2) separately from its results; docs/regime.md lists
the rows. Workload parameters the paper does not state are fitted to these rows, one row
each; the results (Fig 2c, 5, 7, 8, Table 2) are never used to choose anything.

Every row is measured with the single-batch simulator (one rollout batch on a fixed
deployment of TP2 H800 workers) and the trainer's cost model, as the paper measured them:
Qwen3-8B with 8 training GPUs and 16 / 24 / 32 rollout GPUs (§3.1), one trajectory per
worker (C5), Qwen3-30B-A3B colocated on 16 GPUs (§3.2, C7).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from pearl.control.deployment import Deployment
from pearl.sim.costmodel import CostConstants, CostModel
from pearl.sim.fixed import FixedRolloutReport, simulate_fixed_rollout
from pearl.sim.hardware import get_gpu
from pearl.sim.shapes import load_model_shape
from pearl.sim.worker import SimEngineConfig, TimeUse
from pearl.workloads.agentic import generate_batch
from pearl.workloads.batch import RolloutBatch
from pearl.workloads.profiles import AgenticProfile

TOLERANCE = 0.15  # a row holds when the simulator is within 15% of the target
C2_TRAIN_STEP_S = 163.8  # §3.1: a GRPO step of Qwen3-8B on 8 GPUs
C4_CHANGE_16_32 = -0.192  # §3.1: rollout from 16 to 32 GPUs (-10.3% then -8.9%)
C5_TRAJECTORY_S = 216.3  # §3.1: mean trajectory, one per worker


@dataclass(slots=True, frozen=True)
class Row:
    """One characterization fact: target, what the simulator gives, and whether it holds."""

    id: str
    fact: str
    target: float
    sim: float
    unit: str = ""
    upper_bound: bool = False  # the target is a bound ("< 1%"), not a value

    @property
    def ratio(self) -> float:
        return self.sim / self.target if self.target else float("nan")

    @property
    def ok(self) -> bool:
        if self.upper_bound:
            return self.sim < self.target
        return abs(self.ratio - 1) <= TOLERANCE

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "fact": self.fact,
            "target": self.target,
            "sim": self.sim,
            "ratio": self.ratio,
            "unit": self.unit,
            "ok": self.ok,
        }


@dataclass(slots=True)
class RegimeSetting:
    """What the rows are measured on (the paper's §3 / §6.1 setting by default)."""

    profile: AgenticProfile
    engine: SimEngineConfig = field(default_factory=SimEngineConfig)
    constants: CostConstants = field(default_factory=CostConstants)
    gpu: str = "H800"
    tp: int = 2
    seed: int = 0


def _cost(s: RegimeSetting, model: str) -> CostModel:
    return CostModel(get_gpu(s.gpu), load_model_shape(model), tp=s.tp, constants=s.constants)


def _run(s: RegimeSetting, batch: RolloutBatch, model: str, workers: int) -> FixedRolloutReport:
    cost = _cost(s, model)
    return simulate_fixed_rollout(
        batch, cost, Deployment(colocated=workers), s.engine, vocab_size=cost.model.vocab_size
    )


def train_step_s(s: RegimeSetting, batch_report: FixedRolloutReport, gpus: int = 8) -> float:
    """The trainer's step on the batch a rollout produced (as the pipeline sizes it)."""
    trajs = batch_report.result.trajectories
    tokens = sum(t.context_tokens for t in trajs)
    longest = max(t.context_tokens for t in trajs)
    return _cost(s, "Qwen3-8B").train_step_time(tokens, gpus, longest)


def measure(s: RegimeSetting, log: Callable[[str], None] = lambda line: None) -> list[Row]:
    """Run the characterization experiments and return rows C2-C8."""
    batch = generate_batch(s.profile, seed=s.seed)
    runs: dict[int, FixedRolloutReport] = {}
    for gpus in (16, 24, 32):
        runs[gpus] = _run(s, batch, "Qwen3-8B", gpus // s.tp)
        log(f"  Qwen3-8B on {gpus} GPUs: rollout {runs[gpus].makespan_s:.1f} s")
    generation = _mean_alone_s(s, batch)
    log(f"  one trajectory per worker: mean {generation:.1f} s")
    moe = _run(s, batch, "Qwen3-30B-A3B", 16 // s.tp)
    log(f"  Qwen3-30B-A3B on 16 GPUs: rollout {moe.makespan_s:.1f} s")
    train = train_step_s(s, runs[16])
    r16, r24, r32 = (runs[g].makespan_s for g in (16, 24, 32))
    longest = s.profile.max_context_tokens
    re_prefill = _cost(s, "Qwen3-8B").prefill_time(min(longest, s.engine.chunked_prefill_size))
    re_prefill *= -(-longest // s.engine.chunked_prefill_size)  # chunks of the whole context
    return [
        Row("C2", "training step, Qwen3-8B on 8 GPUs", C2_TRAIN_STEP_S, train, "s"),
        Row("C3", "rollout / training at 16 GPUs", 5.7, r16 / train, "x"),
        Row("C3", "rollout / training at 32 GPUs", 4.5, r32 / train, "x"),
        Row("C4", "rollout change 16 -> 24 GPUs", -0.103, r24 / r16 - 1, ""),
        Row("C4", "rollout change 16 -> 32 GPUs", C4_CHANGE_16_32, r32 / r16 - 1, ""),
        Row("C5", "mean trajectory, one per worker", C5_TRAJECTORY_S, generation, "s"),
        Row("C6", "rollout share of end-to-end at 32 GPUs", 0.818, r32 / (r32 + train), ""),
        *_moe_rows(s, moe),
        Row(
            "C8",
            "re-prefill at max length / one trajectory's time",
            0.01,
            re_prefill / generation,
            "",
            upper_bound=True,
        ),
    ]


def _moe_rows(s: RegimeSetting, moe: FixedRolloutReport) -> list[Row]:
    """Rows C7: the token and busy-time balance of Qwen3-30B-A3B's colocated rollout."""
    time = {u: sum(w[u] for w in moe.time_breakdown) for u in TimeUse}
    prefill_s, decode_s = time[TimeUse.PREFILL], time[TimeUse.DECODE]
    mixed_s = time[TimeUse.MIXED]
    computed = moe.prefill_tokens_computed
    prompt = computed + moe.prefill_tokens_cached
    decoded = moe.generated_tokens
    return [
        Row(
            "C7",
            "prompt (cached + computed) : decode tokens (30B-A3B)",
            96.68 / 3.32,
            prompt / max(1, decoded),
            ":1",
        ),
        Row(
            "C7",
            "computed prefill : decode tokens (30B-A3B)",
            96.68 / 3.32,
            computed / max(1, decoded),
            ":1",
        ),
        Row(
            "C7",
            "prefill share of busy time (30B-A3B)",
            0.2648,
            (prefill_s + mixed_s) / max(1e-9, prefill_s + mixed_s + decode_s),
            "",
        ),
        Row(
            "C7",
            "decode tok/s per GPU between prefills (30B-A3B)",
            400.0,
            decoded / max(1e-9, decode_s) / s.tp,
            "tok/s",
        ),
    ]


# --- refitting the two fitted workload values (C4 -> turns median, C5 -> environment scale) --


@dataclass(slots=True, frozen=True)
class Fit:
    """The ``swe_paper`` values fitted to C4 and C5 under one engine and cost setting."""

    turns_median: float
    env_scale: float
    trajectory_s: float
    """C5 at the fit: mean trajectory alone on a worker (target 216.3 s)."""
    change_16_32: float
    """C4 at the fit: rollout change from 16 to 32 GPUs (target -19.2%)."""
    tried: tuple[tuple[float, float, float], ...]
    """Every median tried: (median, its environment scale, its 16 -> 32 change)."""
    train_mfu: float = 0.0
    """C2 at the fit: the trainer's model-FLOPs utilization giving a 163.8 s step on the
    fitted batch (the batch's tokens move with the turns median)."""


def mean_trajectory_s(s: RegimeSetting, profile: AgenticProfile) -> float:
    """C5: the mean trajectory of a batch run one trajectory per worker (Qwen3-8B)."""
    return _mean_alone_s(s, generate_batch(profile, seed=s.seed))


def _mean_alone_s(s: RegimeSetting, batch: RolloutBatch) -> float:
    alone = _run(s, batch, "Qwen3-8B", batch.num_trajectories)  # one trajectory per worker
    durations = [t.finished_at - t.started_at for t in alone.result.trajectories]
    return sum(durations) / len(durations)


def fit_env_scale(
    s: RegimeSetting,
    make: Callable[[float, float], AgenticProfile],
    turns_median: float,
    steps: int = 9,
    high: float = 1.0,
    target_s: float = C5_TRAJECTORY_S,
) -> tuple[float, float]:
    """Bisect the environment scale so that C5 (``target_s``, the paper's 216.3 s) holds at
    ``turns_median``: (scale, the mean trajectory at it).

    ``make(turns_median, env_scale)`` builds the profile. Longer environments make every
    trajectory longer, so C5 grows with the scale; ``steps`` halvings of [0, ``high``]."""
    lo, hi = 0.0, high
    for _ in range(steps):
        mid = (lo + hi) / 2
        if mean_trajectory_s(s, make(turns_median, mid)) < target_s:
            lo = mid
        else:
            hi = mid
    scale = round((lo + hi) / 2, 5)
    trajectory = mean_trajectory_s(s, make(turns_median, scale))
    if abs(trajectory / target_s - 1) > 0.05:  # the target lies outside [0, high]
        raise ValueError(
            f"C5 fit at turns median {turns_median:g}: no environment scale in [0, {high:g}] "
            f"gives a {target_s:g} s trajectory (got {trajectory:.1f} s at {scale:g})"
        )
    return scale, trajectory


def fit_c4_c5(
    s: RegimeSetting,
    make: Callable[[float, float], AgenticProfile],
    medians: tuple[float, ...],
    log: Callable[[str], None] = lambda line: None,
    c5_target_s: float = C5_TRAJECTORY_S,
    c2_target_s: float = C2_TRAIN_STEP_S,
) -> Fit:
    """For each turns median, fit the environment scale to C5, then read C4's 16 -> 32
    change off; keep the median whose change is closest to the paper's -19.2% (the
    procedure docs/regime.md describes for the shipped values)."""
    if not medians:
        raise ValueError("fit_c4_c5: give at least one turns median")
    tried = []
    best: Fit | None = None
    for median in medians:
        try:
            scale, trajectory = fit_env_scale(s, make, median, target_s=c5_target_s)
        except ValueError as exc:  # this median cannot meet C5 at any scale: not a candidate
            log(f"  turns median {median:g}: skipped ({exc})")
            continue
        batch = generate_batch(make(median, scale), seed=s.seed)
        r16 = _run(s, batch, "Qwen3-8B", 16 // s.tp).makespan_s
        r32 = _run(s, batch, "Qwen3-8B", 32 // s.tp).makespan_s
        change = r32 / r16 - 1
        tried.append((median, scale, change))
        log(
            f"  turns median {median:g}: env scale {scale:.4f} (C5 {trajectory:.1f} s), "
            f"16 -> 32 GPUs {change:+.1%}"
        )
        if best is None or abs(change - C4_CHANGE_16_32) < abs(best.change_16_32 - C4_CHANGE_16_32):
            best = Fit(median, scale, trajectory, change, ())
    if best is None:
        raise ValueError(f"fit_c4_c5: no turns median in {medians} meets C5")
    mfu = fit_train_mfu(s, make(best.turns_median, best.env_scale), target_s=c2_target_s)
    log(f"  trainer MFU {mfu:.4f} (C2 on the fitted batch)")
    return dataclasses.replace(best, tried=tuple(tried), train_mfu=mfu)


def fit_train_mfu(
    s: RegimeSetting, profile: AgenticProfile, target_s: float = C2_TRAIN_STEP_S
) -> float:
    """Bisect the trainer's MFU so that C2 holds (``target_s``, the paper's 163.8 s) on
    ``profile``'s batch as rolled out on 16 GPUs (the batch C3 divides by)."""
    batch = generate_batch(profile, seed=s.seed)
    report = _run(s, batch, "Qwen3-8B", 16 // s.tp)
    lo, hi = 1e-4, 1.0
    for _ in range(40):  # the step shrinks as the MFU grows
        mid = (lo + hi) / 2
        at = dataclasses.replace(s, constants=dataclasses.replace(s.constants, train_mfu=mid))
        if train_step_s(at, report) > target_s:
            lo = mid
        else:
            hi = mid
    mfu = round((lo + hi) / 2, 5)
    at = dataclasses.replace(s, constants=dataclasses.replace(s.constants, train_mfu=mfu))
    if abs(train_step_s(at, report) / target_s - 1) > 0.01:  # outside [1e-4, 1]
        raise ValueError(f"C2 fit: no trainer MFU in (0, 1] gives a {target_s:g} s step")
    return mfu
