"""The PD Decision Engine: predict the rollout-batch makespan of colocation and of every
disaggregated split (``pearl.control.makespan``), drop infeasible splits, and pick one with
mode-dependent hysteresis.

Also the intra-scale benefit gate that decides whether borrowing training GPUs pays off.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pearl.control.makespan import (
    DecisionError,
    Prediction,
    WorkloadParams,
    disaggregated_splits,
    predict,
)
from pearl.control.state import Mode, Topology

__all__ = ["DecisionError", "WorkloadParams"]  # re-exported: the engine's inputs


# --- Feasibility and candidates ------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class DecisionConfig:
    """Hysteresis thresholds (relative makespan gains) and the prefill pool's load limit."""

    mode_switch_threshold: float = 0.05
    """Colocation <-> disaggregation only if the predicted makespan drops by more than this."""
    ratio_change_threshold: float = 0.02
    """A new N_P:N_D split only if the predicted makespan drops by more than this."""
    max_prefill_utilization: float = 0.9
    """Prefill capacity: a split is feasible only if its prefill pool is busy at most this
    fraction of the predicted makespan (at 0.9 a prompt already queues 4.5x its own prefill
    time on average; above it the queue, not the model, sets the makespan)."""
    mode_hysteresis_when_forced: bool = True
    """On a forced change, still require the mode threshold to leave the current mode."""

    def __post_init__(self) -> None:
        for name in ("mode_switch_threshold", "ratio_change_threshold"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise DecisionError(f"DecisionConfig.{name} must be in [0, 1), got {value!r}")
        if not 0 < self.max_prefill_utilization <= 1:  # also rejects NaN
            raise DecisionError(
                "DecisionConfig.max_prefill_utilization must be in (0, 1], "
                f"got {self.max_prefill_utilization!r}"
            )


class Infeasibility(enum.StrEnum):
    """Why a disaggregated split is dropped."""

    KV_MEMORY = "kv_memory"  # B*K_seq > N_D*H_max: the decode pool cannot hold the batch's KV
    PREFILL_BACKLOG = "prefill_backlog"  # prefill pool cannot keep up: queues would stall decode


def split_violations(
    p: WorkloadParams, prediction: Prediction, decode_workers: int, config: DecisionConfig
) -> tuple[Infeasibility, ...]:
    """The capacity constraints a predicted split breaks (empty: feasible).

    KV: ``B*K_seq <= N_D*H_max``. Prefill: the pool must absorb the batch's prompt tokens
    without queues that stall decode: its utilization over the predicted makespan stays at
    most ``max_prefill_utilization``.
    """
    violations: list[Infeasibility] = []
    if p.batch_trajectories * p.kv_bytes_per_trajectory > (
        decode_workers * p.kv_capacity_bytes_per_worker
    ):
        violations.append(Infeasibility.KV_MEMORY)
    rho = prediction.prefill_utilization
    if rho is not None and rho > config.max_prefill_utilization:
        violations.append(Infeasibility.PREFILL_BACKLOG)
    return tuple(violations)


@dataclass(slots=True, frozen=True)
class Candidate:
    """One configuration the engine considered, with its prediction."""

    topology: Topology
    prediction: Prediction
    violations: tuple[Infeasibility, ...] = ()

    @property
    def makespan_s(self) -> float:
        return self.prediction.makespan_s

    @property
    def feasible(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict:
        """JSON-ready form for events.jsonl."""
        pred = self.prediction
        return {
            "topology": self.topology.label,
            "makespan_s": pred.makespan_s,
            "decode_s": pred.decode_s,
            "prefill_s": pred.prefill_s,
            "concurrency": pred.concurrency,
            "prefill_utilization": pred.prefill_utilization,
            "violations": [str(v) for v in self.violations],
        }


def evaluate_candidates(
    p: WorkloadParams, workers: int, config: DecisionConfig
) -> tuple[Candidate, ...]:
    """Colocation with N_k workers, then every split N_P in [1, N_k - 1] (N_D = N_k - N_P)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise DecisionError(f"available workers N_k must be an int >= 1, got {workers!r}")
    colocated = Topology.colocation(workers)
    candidates = [Candidate(colocated, predict(p, colocated))]
    # Every split's prediction at once (disaggregated_splits: bitwise what predict gives).
    for n_p, prediction in enumerate(disaggregated_splits(p, workers), start=1):
        split = Topology.split(n_p, workers - n_p)
        violations = split_violations(p, prediction, split.decode, config)
        candidates.append(Candidate(split, prediction, violations))
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
