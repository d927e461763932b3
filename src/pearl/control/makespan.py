"""Bubble-aware makespan models: how long one rollout batch takes on a topology.

The model follows the batch's slowest trajectory (the one that finishes last): it spends
``T_env`` in its environment and, for each of its ``S`` turns, waits for its prompt's
prefill and decodes ``r`` tokens, each decode iteration costing ``A + b*c`` with ``c``
sequences decoding on its worker. What the rest of the batch does enters through load:
the prefill other trajectories put on the same GPUs, and the decode concurrency ``c``.

    colocated, N workers (each holds B/N trajectories):
        W = B*W_D/N               tokens each worker decodes in the batch
        P = B*W_P*t_prefill/N     seconds each worker spends in prefill
        c: work conservation, the worker decodes W tokens at concurrency c in the time
           prefill leaves: W*(A/c + b) = T - P   ->  c = A*W / (T - P - b*W), in [1, B/N]
        D = S*r*(A + b*c)         the slowest trajectory's decoding
        T = T_env + D + S*(dL*t_prefill + T_over) + P*D/T
            (its own prefills, and the others' prefill that lands while it decodes)

    disaggregated, N_P prefill + N_D decode workers:
        W = B*W_D/N_D, c = A*W / (T - b*W) in [1, B/N_D], D = S*r*(A + b*c)
        rho = B*W_P*t_prefill / (N_P*T)   the prefill pool's utilization
        q = dL*t_prefill*(1 + rho/(2(1 - rho))) + dL*K/BW    per turn: prefill with M/D/1
            queueing, then the KV move over one prefill -> decode link
        T = T_env + D + S*q

``T`` appears on both sides; the right side falls as ``T`` grows, so one root exists and
bisection finds it. This departs from the paper's closed forms (``paper_*`` below, kept for
comparison) in three ways, each measured against the simulator
(``benchmarks/ratio_selection.py``, docs/decision_model.md): the decode batch is not fixed at
B/N (only some trajectories decode at once, and the paper's colocated form charges all of
them on every step); ``T_env`` is not added on top of a decode path already stretched by the
bubble ratio (the paper's disaggregated form counts environment time twice); and the
concurrency is derived for each candidate instead of carrying the bubble ratio measured under
the current topology to every other one (in the paper regime the fraction of trajectories
decoding is 0.51 colocated and 0.29 at 1P7D: it depends on the topology it was measured on).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

import numpy as np

from pearl.control.state import Mode, Topology
from pearl.errors import PearlError


class DecisionError(PearlError, ValueError):
    """A decision input is out of range (a model parameter, a worker budget, a threshold)."""


@dataclass(slots=True, frozen=True)
class WorkloadParams:
    """The makespan model's parameters (symbols in brackets); refit after every step.

    Times in seconds, sizes in bytes. The per-turn fields describe the batch's slowest
    trajectory (its critical path); ``W_D`` and ``W_P`` the whole batch's load.
    """

    turns: float
    """[S] interaction turns of the slowest trajectory."""
    decode_tokens_per_turn: float
    """[r] tokens the slowest trajectory generates per turn."""
    appended_tokens_per_turn: float
    """[dL] prompt tokens the slowest trajectory needs prefilled per turn (response tail +
    observation, or more when the scaffold edits its context)."""
    bubble_ratio: float
    """[theta] ``(1 - f) / f``, f the measured fraction of trajectories decoding on average.
    Reported, not used to predict: the concurrency is derived for each candidate, since theta
    measured on one topology does not hold on another."""
    decode_step_fixed_s: float
    """[A] fixed cost of one decode iteration (weight reads, launch)."""
    decode_step_per_sequence_s: float
    """[b] marginal decode-iteration cost per extra concurrent sequence (mostly KV reads)."""
    prefill_s_per_token: float
    """[t_prefill] prefill time per token on one worker."""
    switch_overhead_s: float
    """[T_over] per-turn prefill/decode switching overhead under colocation."""
    env_time_s: float
    """[T_env] environment time of the slowest trajectory: its setup, every turn's
    environment time and its reward evaluation."""
    kv_bytes_per_token: float
    """[K] KV-cache bytes per token moved from a prefill to a decode worker."""
    pd_bandwidth_bytes_per_s: float
    """[BW] KV bandwidth of one prefill -> decode worker link (``inf``: transfer is free)."""
    kv_bytes_per_trajectory: float
    """[K_seq] KV-cache bytes one trajectory holds at its longest."""
    kv_capacity_bytes_per_worker: float
    """[H_max] KV-cache memory of one worker (``inf``: never binding)."""
    batch_trajectories: int
    """[B] trajectories in the rollout batch."""
    decode_tokens_per_trajectory: float | None = None
    """[W_D] tokens the batch's trajectories generate, on average (None: ``S*r``, every
    trajectory as long as the slowest)."""
    prefill_tokens_per_trajectory: float | None = None
    """[W_P] prompt tokens prefilled per trajectory of the batch, on average (None: ``S*dL``)."""

    def __post_init__(self) -> None:
        if self.decode_tokens_per_trajectory is None:
            object.__setattr__(
                self, "decode_tokens_per_trajectory", self.turns * self.decode_tokens_per_turn
            )
        if self.prefill_tokens_per_trajectory is None:
            object.__setattr__(
                self, "prefill_tokens_per_trajectory", self.turns * self.appended_tokens_per_turn
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
                raise DecisionError(f"WorkloadParams.{f.name} must be a number, got {value!r}")
            positive = f.name in (
                "pd_bandwidth_bytes_per_s",
                "kv_capacity_bytes_per_worker",
                "batch_trajectories",
            )
            if positive and value <= 0:  # NaN was rejected above
                raise DecisionError(f"WorkloadParams.{f.name} must be > 0, got {value!r}")
            if value < 0:
                raise DecisionError(f"WorkloadParams.{f.name} must be >= 0, got {value!r}")
            if math.isinf(value) and f.name not in (
                "pd_bandwidth_bytes_per_s",
                "kv_capacity_bytes_per_worker",
            ):
                raise DecisionError(f"WorkloadParams.{f.name} must be finite, got {value!r}")


def bubble_ratio(active_fraction: float) -> float:
    """``theta = (1 - f) / f`` from f, the average fraction of trajectories actively decoding."""
    if not 0 < active_fraction <= 1:
        raise DecisionError(f"active decoding fraction f must be in (0, 1], got {active_fraction}")
    return (1 - active_fraction) / active_fraction


@dataclass(slots=True, frozen=True)
class Prediction:
    """A topology's predicted batch makespan and its parts."""

    makespan_s: float
    decode_s: float
    """D: the slowest trajectory's decoding."""
    prefill_s: float
    """What the slowest trajectory waits for prefill over all its turns (disaggregated: with
    queueing and the KV move; colocated: its own prefills and the others' that interrupt it)."""
    concurrency: float
    """c: sequences decoding at once on a decode (colocated) worker."""
    prefill_utilization: float | None = None
    """rho: the prefill pool's busy fraction (disaggregated only)."""


def _load(p: WorkloadParams) -> tuple[float, float]:
    """``(W_D, W_P)``: set by ``__post_init__`` when not given."""
    assert p.decode_tokens_per_trajectory is not None
    assert p.prefill_tokens_per_trajectory is not None
    return p.decode_tokens_per_trajectory, p.prefill_tokens_per_trajectory


def _require_workers(what: str, n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise DecisionError(f"{what} must be an int >= 1, got {n!r}")


def _concurrency(p: WorkloadParams, decode_tokens: float, free_s: float, cap: float) -> float:
    """c such that ``decode_tokens * (A/c + b) = free_s`` (the worker decodes its tokens in
    the time it has), clamped to [1, cap]."""
    A, b = p.decode_step_fixed_s, p.decode_step_per_sequence_s
    room = free_s - b * decode_tokens
    if room <= 0:
        return cap
    return min(cap, max(1.0, A * decode_tokens / room))


def _solve(rhs) -> float:
    """The T with ``T = rhs(T)``, ``rhs`` non-increasing in T and finite for large T."""
    lo = hi = max(rhs(math.inf), 1e-9)
    while rhs(hi) > hi:
        lo, hi = hi, hi * 2
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if rhs(mid) > mid:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def colocated(p: WorkloadParams, workers: int) -> Prediction:
    """The batch on ``workers`` (N) colocated workers."""
    _require_workers("colocated workers N", workers)
    S, r, dL = p.turns, p.decode_tokens_per_turn, p.appended_tokens_per_turn
    A, b, t = p.decode_step_fixed_s, p.decode_step_per_sequence_s, p.prefill_s_per_token
    B, N = p.batch_trajectories, workers
    W_D, W_P = _load(p)
    W, P = B * W_D / N, B * W_P * t / N
    cap = max(1.0, B / N)

    def parts(T: float) -> tuple[float, float, float]:
        c = _concurrency(p, W, T - P, cap)
        D = S * r * (A + b * c)
        interrupted = P * min(1.0, D / T) if math.isfinite(T) else 0.0
        return c, D, S * (dL * t + p.switch_overhead_s) + interrupted

    def rhs(T: float) -> float:
        _, D, prefill = parts(T)
        return p.env_time_s + D + prefill

    T = _solve(rhs)
    c, D, prefill = parts(T)
    return Prediction(T, D, prefill, c)


def disaggregated(p: WorkloadParams, prefill_workers: int, decode_workers: int) -> Prediction:
    """The batch on ``prefill_workers`` (N_P) prefill and ``decode_workers`` (N_D) decode
    workers."""
    _require_workers("prefill workers N_P", prefill_workers)
    _require_workers("decode workers N_D", decode_workers)
    S, r, dL = p.turns, p.decode_tokens_per_turn, p.appended_tokens_per_turn
    A, b, t = p.decode_step_fixed_s, p.decode_step_per_sequence_s, p.prefill_s_per_token
    B, N_P, N_D = p.batch_trajectories, prefill_workers, decode_workers
    W_D, W_P = _load(p)
    W = B * W_D / N_D
    prefill_busy = B * W_P * t / N_P
    transfer = dL * p.kv_bytes_per_token / p.pd_bandwidth_bytes_per_s
    cap = max(1.0, B / N_D)

    def parts(T: float) -> tuple[float, float, float, float]:
        c = _concurrency(p, W, T, cap)
        rho = prefill_busy / T
        if rho >= 1:
            return c, S * r * (A + b * c), math.inf, rho
        wait = dL * t * (1 + rho / (2 * (1 - rho)))  # M/D/1: service plus queueing
        return c, S * r * (A + b * c), S * (wait + transfer), rho

    def rhs(T: float) -> float:
        _, D, prefill, _ = parts(T)
        return p.env_time_s + D + prefill

    T = _solve(rhs)
    c, D, prefill, rho = parts(T)
    return Prediction(T, D, prefill, c, rho)


def disaggregated_splits(p: WorkloadParams, workers: int) -> list[Prediction]:
    """``disaggregated(p, n_p, workers - n_p)`` for every ``n_p`` in ``[1, workers)``, bitwise,
    all at once: the same float operations in the same order on numpy arrays (one lane per
    split; a lane stops where its own bisection stops), ~30x faster at 1,024 workers."""
    _require_workers("workers N_k", workers)
    if workers < 2:
        return []
    S, r, dL = p.turns, p.decode_tokens_per_turn, p.appended_tokens_per_turn
    A, b, t = p.decode_step_fixed_s, p.decode_step_per_sequence_s, p.prefill_s_per_token
    B = p.batch_trajectories
    W_D, W_P = _load(p)
    N_P = np.arange(1, workers, dtype=np.float64)
    N_D = workers - N_P
    W = B * W_D / N_D
    prefill_busy = B * W_P * t / N_P
    transfer = dL * p.kv_bytes_per_token / p.pd_bandwidth_bytes_per_s
    cap = np.maximum(1.0, B / N_D)
    decode_s = S * r

    def parts(T: np.ndarray) -> tuple[np.ndarray, ...]:
        room = T - b * W  # _concurrency
        c = np.where(room <= 0, cap, np.minimum(cap, np.maximum(1.0, A * W / room)))
        rho = prefill_busy / T
        wait = dL * t * (1 + rho / (2 * (1 - rho)))
        prefill = np.where(rho >= 1, np.inf, S * (wait + transfer))
        return c, decode_s * (A + b * c), prefill, rho

    def rhs(T: np.ndarray) -> np.ndarray:
        _, D, prefill, _ = parts(T)
        return p.env_time_s + D + prefill

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lo = hi = np.maximum(rhs(np.full(len(N_P), np.inf)), 1e-9)  # _solve, lane by lane
        grow = rhs(hi) > hi
        while grow.any():
            lo, hi = np.where(grow, hi, lo), np.where(grow, hi * 2, hi)
            grow &= rhs(hi) > hi
        active = np.ones(len(N_P), dtype=bool)
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            up = rhs(mid) > mid
            lo, hi = np.where(active & up, mid, lo), np.where(active & ~up, mid, hi)
            active &= ~(hi - lo <= 1e-12 * hi)
            if not active.any():
                break
        c, D, prefill, rho = (x.tolist() for x in parts(hi))
    return [Prediction(*values) for values in zip(hi.tolist(), D, prefill, c, rho, strict=True)]


def predict(p: WorkloadParams, topology: Topology) -> Prediction:
    """The prediction for a valid topology (fully colocated, or >= 1 prefill and decode)."""
    if not topology.is_valid:
        raise DecisionError(
            f"cannot predict topology {topology}: it must be fully colocated or have "
            ">= 1 prefill and >= 1 decode worker"
        )
    if topology.mode is Mode.COLOCATED:
        return colocated(p, topology.colocated)
    return disaggregated(p, topology.prefill, topology.decode)


def predict_makespan(p: WorkloadParams, topology: Topology) -> float:
    """Predicted batch makespan of a valid topology."""
    return predict(p, topology).makespan_s


# --- The paper's closed forms (PEARL §4.3.1, Eqs. 1-3), for comparison ----------------------


def paper_makespan(p: WorkloadParams, topology: Topology) -> float:
    """The paper's ``T_coloc`` (Eq. 1) or ``T_dis = max(T_prefill, T_decode) + T_env``
    (Eqs. 2-3), with the pools' bandwidth ``BW * min(N_P, N_D)``. Kept to show, in
    ``benchmarks/ratio_selection.py``, how far they are from the simulator."""
    if not topology.is_valid:
        raise DecisionError(f"cannot predict topology {topology}")
    S, r, dL, theta = p.turns, p.decode_tokens_per_turn, p.appended_tokens_per_turn, p.bubble_ratio
    A, b, t, B = (
        p.decode_step_fixed_s,
        p.decode_step_per_sequence_s,
        p.prefill_s_per_token,
        p.batch_trajectories,
    )
    if topology.mode is Mode.COLOCATED:
        N = topology.colocated
        return S * ((B * dL / N) * t + r * (A + b * B / N) + p.switch_overhead_s) + p.env_time_s
    N_P, N_D = topology.prefill, topology.decode
    T_decode = S * r * (A + b * B / (N_D * (1 + theta))) * (1 + theta)
    BW = p.pd_bandwidth_bytes_per_s * min(N_P, N_D)
    T_prefill = S * (B * dL * t / N_P + B * dL * p.kv_bytes_per_token / BW)
    return max(T_prefill, T_decode) + p.env_time_s
