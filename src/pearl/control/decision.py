"""The PD Decision Engine: predict the rollout-batch makespan of colocation and of every
disaggregated split, drop infeasible splits, and pick one with mode-dependent hysteresis.

Also the intra-scale benefit gate that decides whether borrowing training GPUs pays off.
"""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass, fields

from pearl.control.state import Mode, Topology
from pearl.errors import PearlError


class DecisionError(PearlError, ValueError):
    """A decision input is out of range (a model parameter, a worker budget, a threshold)."""


@dataclass(slots=True, frozen=True)
class WorkloadParams:
    """The makespan model's parameters (SPEC symbols in brackets); refit after every step.

    Times in seconds, sizes in bytes. Fields are in the order S, r, dL, theta, A, b,
    t_prefill, T_over, T_env, K, BW, K_seq, H_max, B.
    """

    turns: float
    """[S] interaction turns of the slowest trajectory."""
    decode_tokens_per_turn: float
    """[r] tokens generated per turn."""
    appended_tokens_per_turn: float
    """[dL] prompt tokens appended per turn (response tail + observation) that need prefill."""
    bubble_ratio: float
    """[theta] ``(1 - f) / f``, f the average fraction of trajectories actively decoding."""
    decode_step_fixed_s: float
    """[A] fixed cost of one decode iteration (weight reads, launch)."""
    decode_step_per_sequence_s: float
    """[b] marginal decode-iteration cost per extra concurrent sequence (mostly KV reads)."""
    prefill_s_per_token: float
    """[t_prefill] prefill time per token on one worker."""
    switch_overhead_s: float
    """[T_over] per-turn prefill/decode switching overhead under colocation."""
    env_time_s: float
    """[T_env] environment time (added once to the batch makespan)."""
    kv_bytes_per_token: float
    """[K] KV-cache bytes per token moved from a prefill to a decode worker."""
    pd_bandwidth_bytes_per_s: float
    """[BW] KV bandwidth of one prefill -> decode worker link (``inf``: transfer is free).
    The pools move KV over ``min(N_P, N_D)`` such links at once."""
    kv_bytes_per_trajectory: float
    """[K_seq] KV-cache bytes one trajectory holds at its longest."""
    kv_capacity_bytes_per_worker: float
    """[H_max] KV-cache memory of one worker (``inf``: never binding)."""
    batch_trajectories: int
    """[B] trajectories in the rollout batch."""

    def __post_init__(self) -> None:
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


# --- Bubble-aware makespan models -----------------------------------------------------------


def colocated_makespan(p: WorkloadParams, workers: int) -> float:
    """Batch makespan with ``workers`` (N) colocated workers; decode batch fixed at B/N."""
    _require_workers("colocated workers N", workers)
    S, r, dL = p.turns, p.decode_tokens_per_turn, p.appended_tokens_per_turn
    A, b, t_prefill = p.decode_step_fixed_s, p.decode_step_per_sequence_s, p.prefill_s_per_token
    B, N, T_over, T_env = p.batch_trajectories, workers, p.switch_overhead_s, p.env_time_s
    # T_coloc = S * [ (B*dL/N) * t_prefill + r*(A + b*B/N) + T_over ] + T_env
    return S * ((B * dL / N) * t_prefill + r * (A + b * B / N) + T_over) + T_env


def decode_path_makespan(p: WorkloadParams, decode_workers: int) -> float:
    """Decode path of a split with ``decode_workers`` (N_D): concurrency shrunk by bubbles."""
    _require_workers("decode workers N_D", decode_workers)
    S, r, theta = p.turns, p.decode_tokens_per_turn, p.bubble_ratio
    A, b = p.decode_step_fixed_s, p.decode_step_per_sequence_s
    B, N_D = p.batch_trajectories, decode_workers
    # T_decode = S * r * (A + b*B/(N_D*(1+theta))) * (1+theta)
    return S * r * (A + b * B / (N_D * (1 + theta))) * (1 + theta)


def prefill_path_makespan(p: WorkloadParams, prefill_workers: int, decode_workers: int) -> float:
    """Prefill path of a split with ``prefill_workers`` (N_P) and ``decode_workers`` (N_D),
    plus an uncontended KV transfer over the pools' links."""
    _require_workers("prefill workers N_P", prefill_workers)
    _require_workers("decode workers N_D", decode_workers)
    S, dL, B, N_P = p.turns, p.appended_tokens_per_turn, p.batch_trajectories, prefill_workers
    t_prefill, K = p.prefill_s_per_token, p.kv_bytes_per_token
    # The paper's BW is the bandwidth between the pools; with per-link BW, that is
    # min(N_P, N_D) links moving KV at once (each worker has its own NICs).
    BW = p.pd_bandwidth_bytes_per_s * min(N_P, decode_workers)
    # T_prefill = S * ( B*dL*t_prefill/N_P + B*dL*K/BW )
    return S * (B * dL * t_prefill / N_P + B * dL * K / BW)


def disaggregated_makespan(p: WorkloadParams, prefill_workers: int, decode_workers: int) -> float:
    """``T_dis = max(T_prefill, T_decode) + T_env``."""
    T_prefill = prefill_path_makespan(p, prefill_workers, decode_workers)
    T_decode = decode_path_makespan(p, decode_workers)
    return max(T_prefill, T_decode) + p.env_time_s


def predict_makespan(p: WorkloadParams, topology: Topology) -> float:
    """Predicted batch makespan of a valid topology (``T_coloc`` or ``T_dis``)."""
    if not topology.is_valid:
        raise DecisionError(
            f"cannot predict topology {topology}: it must be fully colocated or have "
            ">= 1 prefill and >= 1 decode worker"
        )
    if topology.mode is Mode.COLOCATED:
        return colocated_makespan(p, topology.colocated)
    return disaggregated_makespan(p, topology.prefill, topology.decode)


def _require_workers(what: str, n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise DecisionError(f"{what} must be an int >= 1, got {n!r}")


# --- Feasibility and candidates ------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class DecisionConfig:
    """Hysteresis thresholds and the prefill-capacity slack (relative makespan gains)."""

    mode_switch_threshold: float = 0.05
    """Colocation <-> disaggregation only if the predicted makespan drops by more than this."""
    ratio_change_threshold: float = 0.02
    """A new N_P:N_D split only if the predicted makespan drops by more than this."""
    prefill_slack: float = 0.0
    """Prefill capacity: a split is feasible only if ``T_prefill <= (1 + slack) * T_decode``."""
    mode_hysteresis_when_forced: bool = True
    """On a forced change, still require the mode threshold to leave the current mode."""

    def __post_init__(self) -> None:
        for name in ("mode_switch_threshold", "ratio_change_threshold"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise DecisionError(f"DecisionConfig.{name} must be in [0, 1), got {value!r}")
        if not self.prefill_slack >= 0:  # also rejects NaN; inf disables the check
            raise DecisionError(
                f"DecisionConfig.prefill_slack must be >= 0 (inf disables), got {self.prefill_slack!r}"
            )


class Infeasibility(enum.StrEnum):
    """Why a disaggregated split is dropped."""

    KV_MEMORY = "kv_memory"  # B*K_seq > N_D*H_max: the decode pool cannot hold the batch's KV
    PREFILL_BACKLOG = "prefill_backlog"  # prefill pool cannot keep up: queues would stall decode


def split_violations(
    p: WorkloadParams, prefill_workers: int, decode_workers: int, config: DecisionConfig
) -> tuple[Infeasibility, ...]:
    """The capacity constraints a split breaks (empty: feasible).

    KV: ``B*K_seq <= N_D*H_max``. Prefill: the pool must absorb ``B*S*dL`` tokens per step
    without queues that stall decode; operationalized as the prefill path (compute plus KV
    transfer) keeping pace with the decode path it feeds, ``T_prefill <= (1+slack)*T_decode``.
    """
    B, K_seq, H_max, N_D = (
        p.batch_trajectories,
        p.kv_bytes_per_trajectory,
        p.kv_capacity_bytes_per_worker,
        decode_workers,
    )
    violations: list[Infeasibility] = []
    if B * K_seq > N_D * H_max:
        violations.append(Infeasibility.KV_MEMORY)
    T_prefill = prefill_path_makespan(p, prefill_workers, decode_workers)
    T_decode = decode_path_makespan(p, decode_workers)
    if T_prefill > (1 + config.prefill_slack) * T_decode:
        violations.append(Infeasibility.PREFILL_BACKLOG)
    return tuple(violations)


@dataclass(slots=True, frozen=True)
class Candidate:
    """One configuration the engine considered, with its predicted makespan."""

    topology: Topology
    makespan_s: float
    prefill_path_s: float | None = None  # T_prefill (disaggregated only)
    decode_path_s: float | None = None  # T_decode (disaggregated only)
    violations: tuple[Infeasibility, ...] = ()

    @property
    def feasible(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict:
        """JSON-ready form for events.jsonl."""
        return {
            "topology": self.topology.label,
            "makespan_s": self.makespan_s,
            "prefill_path_s": self.prefill_path_s,
            "decode_path_s": self.decode_path_s,
            "violations": [str(v) for v in self.violations],
        }


def evaluate_candidates(
    p: WorkloadParams, workers: int, config: DecisionConfig
) -> tuple[Candidate, ...]:
    """Colocation with N_k workers, then every split N_P in [1, N_k - 1] (N_D = N_k - N_P)."""
    _require_workers("available workers N_k", workers)
    candidates = [Candidate(Topology.colocation(workers), colocated_makespan(p, workers))]
    for n_p in range(1, workers):
        n_d = workers - n_p
        t_p, t_d = prefill_path_makespan(p, n_p, n_d), decode_path_makespan(p, n_d)
        candidates.append(
            Candidate(
                Topology.split(n_p, n_d),
                max(t_p, t_d) + p.env_time_s,
                prefill_path_s=t_p,
                decode_path_s=t_d,
                violations=split_violations(p, n_p, n_d, config),
            )
        )
    return tuple(candidates)


# --- The decision --------------------------------------------------------------------------


class DecisionReason(enum.StrEnum):
    """Why the target is what it is."""

    KEEP = "keep"  # current topology stays (best, or the gain is under the threshold)
    RATIO_CHANGE = "ratio_change"  # new N_P:N_D split, still disaggregated
    MODE_SWITCH = "mode_switch"  # colocation <-> disaggregation
    FORCED = "forced"  # current topology is infeasible for N_k: hysteresis cannot keep it


@dataclass(slots=True, frozen=True)
class Decision:
    """The target topology for N_k workers, why, and every candidate's prediction."""

    target: Topology
    reason: DecisionReason
    candidates: tuple[Candidate, ...]
    target_makespan_s: float
    current_makespan_s: float | None  # None when the current topology is infeasible for N_k

    @classmethod
    def of(
        cls,
        target: Candidate,
        reason: DecisionReason,
        candidates: tuple[Candidate, ...],
        incumbent: Candidate | None,
    ) -> Decision:
        """The decision for ``target`` among ``candidates``, ``incumbent`` the current one."""
        return cls(
            target=target.topology,
            reason=reason,
            candidates=candidates,
            target_makespan_s=target.makespan_s,
            current_makespan_s=incumbent.makespan_s if incumbent else None,
        )

    @property
    def changed(self) -> bool:
        return self.reason is not DecisionReason.KEEP

    @property
    def best(self) -> Candidate:
        """The model's argmin among feasible candidates (the target unless hysteresis held)."""
        return _argmin(c for c in self.candidates if c.feasible)

    def to_dict(self) -> dict:
        """JSON-ready form for events.jsonl."""
        return {
            "target": self.target.label,
            "reason": str(self.reason),
            "target_makespan_s": self.target_makespan_s,
            "current_makespan_s": self.current_makespan_s,
            "candidates": [c.to_dict() for c in self.candidates],
        }


def _argmin(candidates) -> Candidate:
    # min() keeps the first of equal makespans: colocation, then the smallest N_P.
    return min(candidates, key=lambda c: c.makespan_s)


def _gain(old_s: float, new_s: float) -> float:
    """Relative makespan improvement of ``new`` over ``old``."""
    return (old_s - new_s) / old_s if old_s > 0 else 0.0


def decide(
    p: WorkloadParams,
    workers: int,
    current: Topology | None,
    config: DecisionConfig | None = None,
) -> Decision:
    """Choose the topology for ``workers`` (N_k) available rollout workers.

    The current topology is kept unless a candidate in its mode beats it by more than
    ``ratio_change_threshold`` or one in the other mode by more than
    ``mode_switch_threshold``. If it is infeasible (``None``, not a valid mode, not summing
    to N_k, or breaking a capacity constraint) the change is forced: the best feasible
    candidate, staying in the current mode unless the other wins by the mode threshold
    (``mode_hysteresis_when_forced``). Colocation is always feasible.
    """
    config = config or DecisionConfig()
    candidates = evaluate_candidates(p, workers, config)
    feasible = [c for c in candidates if c.feasible]
    best = _argmin(feasible)
    incumbent = next(
        (c for c in feasible if current is not None and c.topology == current),
        None,
    )

    def pick(target: Candidate, reason: DecisionReason) -> Decision:
        return Decision.of(target, reason, candidates, incumbent)

    if incumbent is None:  # forced
        mode = current.mode if current is not None else None
        same_mode = [c for c in feasible if c.topology.mode is mode]
        if not (config.mode_hysteresis_when_forced and same_mode):
            return pick(best, DecisionReason.FORCED)
        anchor = _argmin(same_mode)
        if best.topology.mode is not mode and (
            _gain(anchor.makespan_s, best.makespan_s) > config.mode_switch_threshold
        ):
            return pick(best, DecisionReason.FORCED)
        return pick(anchor, DecisionReason.FORCED)

    assert current is not None  # the incumbent is the current topology
    # Options the thresholds admit; the lowest predicted makespan wins, KEEP on ties.
    options = [(incumbent, DecisionReason.KEEP)]
    same_mode = [c for c in feasible if c.topology.mode is current.mode]
    other_mode = [c for c in feasible if c.topology.mode is not current.mode]
    if same_mode:
        c = _argmin(same_mode)
        if _gain(incumbent.makespan_s, c.makespan_s) > config.ratio_change_threshold:
            options.append((c, DecisionReason.RATIO_CHANGE))
    if other_mode:
        c = _argmin(other_mode)
        if _gain(incumbent.makespan_s, c.makespan_s) > config.mode_switch_threshold:
            options.append((c, DecisionReason.MODE_SWITCH))
    target, reason = min(options, key=lambda o: o[0].makespan_s)
    return pick(target, reason)


def decide_split(
    p: WorkloadParams,
    workers: int,
    current: Topology | None,
    config: DecisionConfig | None = None,
) -> Decision:
    """Forced disaggregation: the best P:D split for ``workers`` >= 2, whatever colocation
    would predict. Feasible splits first; if none is, the split with the lowest predicted
    makespan (the caller asked for disaggregation). The current split is kept unless
    another beats it by more than ``ratio_change_threshold``."""
    if workers < 2:
        raise DecisionError(f"a P:D split needs >= 2 workers, got {workers!r}")
    config = config or DecisionConfig()
    candidates = evaluate_candidates(p, workers, config)
    splits = [c for c in candidates if c.topology.mode is Mode.DISAGGREGATED]
    best = _argmin([c for c in splits if c.feasible] or splits)
    incumbent = next((c for c in splits if c.topology == current), None)
    if incumbent is None:
        target, reason = best, DecisionReason.FORCED
    elif _gain(incumbent.makespan_s, best.makespan_s) > config.ratio_change_threshold:
        target, reason = best, DecisionReason.RATIO_CHANGE
    else:
        target, reason = incumbent, DecisionReason.KEEP
    return Decision.of(target, reason, candidates, incumbent)


# --- Intra-scale benefit gate --------------------------------------------------------------


def borrow_gate(R: float, B: float, T_ded: float, T_full: float, T_toggle: float) -> bool:
    """Borrow training GPUs only if ``(R/B) * (T_ded - T_full) > T_toggle``.

    R of B trajectories unfinished; T_ded / T_full the predicted makespan with dedicated
    workers only / with all training GPUs as overlap workers; T_toggle activation + return cost.
    """
    if not B > 0:
        raise DecisionError(f"batch size B must be > 0, got {B!r}")
    if not 0 <= R <= B:
        raise DecisionError(f"unfinished trajectories R must be in [0, B={B}], got {R!r}")
    for name, value in (("T_ded", T_ded), ("T_full", T_full), ("T_toggle", T_toggle)):
        if not value >= 0:
            raise DecisionError(f"{name} must be >= 0 seconds, got {value!r}")
    return (R / B) * (T_ded - T_full) > T_toggle
