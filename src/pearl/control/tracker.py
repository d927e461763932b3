"""Runtime tracker: refits the decision model's parameters from what workers report.

Inputs are observations a real deployment has: per-iteration batch shapes and
durations reported by workers, and per-turn telemetry of finished trajectories
(appended tokens, generated tokens, kept tokens, environment time, when decoding
ran). Nothing reads the simulator's cost model. Parameters are smoothed across
steps with exponential moving averages, as are the costs of toggling borrowed GPUs.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from pearl.control.agent_loop import TrajectoryResult
from pearl.control.makespan import WorkloadParams


@dataclass(slots=True, frozen=True)
class IterationObservation:
    """One engine iteration as a worker measured it (or ``iterations`` identical ones,
    ``seconds`` each, as a worker that reports decode stretches in bulk sees them)."""

    decode_sequences: int
    prefill_tokens: int
    seconds: float
    decode_context_tokens: int = 0  # sum of the decoding sequences' contexts (0: unknown)
    iterations: int = 1


@dataclass(slots=True, frozen=True)
class FittedParameter:
    """One refitted parameter: its value, how many samples it came from, and whether this
    step's data could identify it (``fit``) or it kept the prior / last good fit (``kept``)."""

    value: float
    samples: int
    source: str = "fit"

    def to_dict(self) -> dict:
        return {"value": self.value, "samples": self.samples, "source": self.source}


MIN_DECODE_SAMPLES = 8  # decode-only iterations before A and b are fitted together
MIN_SPREAD = 0.05  # relative spread (std / mean) of the decode load that identifies b
MIN_PREFILL_SAMPLES = 3


@dataclass(slots=True, frozen=True)
class TurnObservation:
    """One finished turn of a trajectory."""

    appended_tokens: int  # observation tokens added before the turn
    generated_tokens: int
    kept_tokens: int  # of the previous turn's response, kept in this turn's context
    env_time_s: float  # environment time after the turn
    decode_s: float  # first token to last token
    kv_bytes: int = 0  # KV moved from a prefill to a decode worker for this turn
    kv_seconds: float = 0.0  # how long that move took


@dataclass(slots=True, frozen=True)
class TrajectoryObservation:
    turns: tuple[TurnObservation, ...]
    lifetime_s: float
    context_tokens: int = 0  # final context length (0: unknown)
    setup_s: float = 0.0  # environment start before the first turn


class Ema:
    """Exponential moving average; the first observation initializes it."""

    __slots__ = ("alpha", "value")

    def __init__(self, alpha: float, value: float | None = None) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"EMA alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.value = value

    def update(self, x: float) -> float:
        self.value = x if self.value is None else self.alpha * x + (1 - self.alpha) * self.value
        return self.value


class RuntimeTracker:
    """Accumulates one rollout step's observations; ``end_step`` refits ``WorkloadParams``."""

    def __init__(
        self, prior: WorkloadParams, alpha: float = 0.5, iteration_window: int = 1 << 17
    ) -> None:
        self.prior = prior
        self.alpha = alpha
        self._iterations: deque[IterationObservation] = deque(maxlen=iteration_window)
        self._trajectories: list[TrajectoryObservation] = []
        self._ema: dict[str, Ema] = {}
        self.toggle_cost_s = Ema(alpha)
        self.return_cost_s = Ema(alpha)  # the give-back part of it, before training begins
        # Observed batch makespan over the model's prediction for the dedicated workers,
        # for batches that borrowed training GPUs and batches that did not.
        self.makespan_ratio_borrowed = Ema(alpha)
        self.makespan_ratio_dedicated = Ema(alpha)
        self.params = prior
        self.fit_report: dict[str, FittedParameter] = {}
        self.steps = 0

    # -- observations --------------------------------------------------------------
    def observe_iteration(self, obs: IterationObservation) -> None:
        if obs.seconds > 0 and (obs.decode_sequences or obs.prefill_tokens):
            self._iterations.append(obs)

    def observe_trajectory(self, obs: TrajectoryObservation) -> None:
        if obs.turns:
            self._trajectories.append(obs)

    def observe_result(self, result: TrajectoryResult) -> None:
        """A finished trajectory as the agent loop saw it (tokens it appended and kept,
        environment seconds it waited, when each turn's decoding ran)."""
        turns = []
        for k, out in enumerate(result.turns):
            t = out.telemetry
            first = t.first_token_at if t.first_token_at is not None else t.finished_at
            turns.append(
                TurnObservation(
                    appended_tokens=result.appended_tokens[k],
                    generated_tokens=result.generated[k],
                    kept_tokens=result.kept_tokens[k],
                    env_time_s=result.env_s[k],
                    decode_s=max(0.0, t.finished_at - first),
                    kv_bytes=t.kv_bytes_moved,
                    kv_seconds=t.kv_transfer_s,
                )
            )
        self.observe_trajectory(
            TrajectoryObservation(
                tuple(turns),
                result.finished_at - result.started_at,
                result.context_tokens,
                result.setup_s,
            )
        )

    def observe_toggle(self, seconds: float, return_seconds: float) -> None:
        """Activation plus return cost of one borrowing round (T_toggle), and the return
        (give-back) part of it."""
        self.toggle_cost_s.update(seconds)
        self.return_cost_s.update(return_seconds)

    def observe_borrowing(
        self, makespan_s: float, predicted_dedicated_s: float, borrowed: bool
    ) -> None:
        """A finished batch's makespan against the model's dedicated-only prediction."""
        if makespan_s > 0 and predicted_dedicated_s > 0:
            ema = self.makespan_ratio_borrowed if borrowed else self.makespan_ratio_dedicated
            ema.update(makespan_s / predicted_dedicated_s)

    def measured_borrow_saving(self) -> float | None:
        """The fraction of the dedicated makespan that borrowing saved, as measured (None
        until batches with and without borrowing were both seen)."""
        b, d = self.makespan_ratio_borrowed.value, self.makespan_ratio_dedicated.value
        if b is None or d is None:
            return None
        return (d - b) / d

    # -- refit ---------------------------------------------------------------------
    def end_step(self, batch_size: int, makespan_s: float) -> WorkloadParams:
        """Refit from this step's trajectories and the recent iterations; smooth; reset.

        A parameter this step's data cannot identify keeps its value (the prior, or the
        last good fit); ``fit_report`` says, per parameter, its value, samples and source.
        """
        fitted = self._fit(batch_size, makespan_s)
        smoothed = {}
        report: dict[str, FittedParameter] = {}
        for name, fp in fitted.items():
            if fp.source != "fit":
                report[name] = fp
                continue
            ema = self._ema.setdefault(name, Ema(self.alpha))
            smoothed[name] = ema.update(fp.value)
            report[name] = FittedParameter(smoothed[name], fp.samples, "fit")
        self.params = replace(self.params, batch_trajectories=batch_size, **smoothed)
        self.fit_report = report
        self._trajectories = []
        # The next fit sees the next step's iterations only: a window reaching back into
        # this one, or holding only its tail (long contexts, few sequences), biases b.
        self._iterations.clear()
        self.steps += 1
        return self.params

    def _fit(self, batch_size: int, makespan_s: float) -> dict[str, FittedParameter]:
        out: dict[str, FittedParameter] = {}
        trajs = self._trajectories
        if trajs:
            turns = [t for tr in trajs for t in tr.turns]
            n_traj, n_turns = len(trajs), len(turns)
            # The per-turn terms follow the slowest trajectory (the makespan's critical
            # path); the batch's load enters through the per-trajectory means.
            slowest = max(trajs, key=lambda tr: tr.lifetime_s)
            slow = slowest.turns
            out["turns"] = FittedParameter(float(len(slow)), n_traj)
            out["decode_tokens_per_turn"] = FittedParameter(
                sum(t.generated_tokens for t in slow) / len(slow), len(slow)
            )
            # What a prefill worker must compute per turn: the new observation and the kept
            # response tail (a disaggregated prefill worker never decoded those tokens).
            out["appended_tokens_per_turn"] = FittedParameter(
                sum(t.appended_tokens + t.kept_tokens for t in slow) / len(slow), len(slow)
            )
            out["env_time_s"] = FittedParameter(
                slowest.setup_s + sum(t.env_time_s for t in slow), len(slow)
            )
            out["decode_tokens_per_trajectory"] = FittedParameter(
                sum(t.generated_tokens for t in turns) / n_traj, n_traj
            )
            out["prefill_tokens_per_trajectory"] = FittedParameter(
                sum(t.appended_tokens + t.kept_tokens for t in turns) / n_traj, n_traj
            )
            contexts = [tr.context_tokens for tr in trajs if tr.context_tokens > 0]
            if contexts:
                # The batch's KV at its peak, per trajectory: K x mean final context.
                out["kv_bytes_per_trajectory"] = FittedParameter(
                    self.prior.kv_bytes_per_token * sum(contexts) / len(contexts), len(contexts)
                )
            moves = [t for t in turns if t.kv_bytes > 0 and t.kv_seconds > 0]
            if moves:
                # One link's effective bandwidth, as the transfers saw it (contention included).
                out["pd_bandwidth_bytes_per_s"] = FittedParameter(
                    sum(t.kv_bytes for t in moves) / sum(t.kv_seconds for t in moves), len(moves)
                )
            if makespan_s > 0:
                decoding = sum(t.decode_s for t in turns)
                f = min(1.0, max(1e-3, decoding / (n_traj * makespan_s)))
                out["bubble_ratio"] = FittedParameter((1 - f) / f, n_turns)
        out.update(self._fit_iterations())
        return out

    def _fit_iterations(self) -> dict[str, FittedParameter]:
        """``seconds = A + b * decodes`` on decode-only iterations, then ``t_prefill`` from
        what iterations with prefill took beyond that (least squares, weighted by iterations).

        b is the per-sequence cost at this step's mean decode context: when workers report
        contexts, the fit is ``A + c * context_tokens`` and ``b = c * mean context`` (a
        decode step reads each sequence's whole KV, so contexts, not counts, explain it).
        A term is fitted only when the data identify it (enough samples; a decode load that
        varies for b) and the fit is positive; otherwise it keeps its current value.
        """
        its = list(self._iterations)
        cur = self.params
        decode = [o for o in its if o.prefill_tokens == 0 and o.decode_sequences > 0]
        by_context = bool(decode) and all(o.decode_context_tokens > 0 for o in decode)
        step, out = _fit_decode_step(
            decode, by_context, cur.decode_step_fixed_s, cur.decode_step_per_sequence_s
        )
        prefill = [o for o in its if o.prefill_tokens > 0]
        if prefill:
            out["prefill_s_per_token"] = _fit_prefill(prefill, step, cur.prefill_s_per_token)
        return out


@dataclass(slots=True, frozen=True)
class _DecodeStepCost:
    """A decode step's cost, ``seconds = fixed_s + per_load_s * load``, as fitted or kept."""

    fixed_s: float
    per_load_s: float  # b in the load's units: per context token when by_context
    by_context: bool  # the load is the decoding sequences' context tokens, not their count

    def load(self, o: IterationObservation) -> int:
        """The decode load of ``o`` in this cost's units."""
        return o.decode_context_tokens if self.by_context else o.decode_sequences


def _fit_decode_step(
    decode: list[IterationObservation], by_context: bool, A: float, b: float
) -> tuple[_DecodeStepCost, dict[str, FittedParameter]]:
    """Fit ``A + c * load`` to decode-only iterations (A alone where c is not identified)."""
    if not decode:
        return _DecodeStepCost(A, b, by_context), {}
    out: dict[str, FittedParameter] = {}
    load = np.array(
        [o.decode_context_tokens if by_context else o.decode_sequences for o in decode], float
    )
    w = np.array([o.iterations for o in decode], float)
    n = np.array([o.decode_sequences for o in decode], float)
    y = np.array([o.seconds for o in decode])
    per_seq = float(np.sum(w * load) / np.sum(w * n))  # mean context (or 1) per sequence
    c = b / per_seq  # the current b in the load's units
    samples = int(w.sum())
    mean = float(np.sum(w * load) / w.sum())
    spread = math.sqrt(float(np.sum(w * (load - mean) ** 2) / w.sum())) / mean
    fitted = False
    if len(decode) >= MIN_DECODE_SAMPLES and spread >= MIN_SPREAD:
        sw = np.sqrt(w)
        x = np.stack([np.ones_like(load), load], axis=1) * sw[:, None]
        (a_fit, c_fit), *_ = np.linalg.lstsq(x, y * sw, rcond=None)
        fitted = a_fit > 0 and c_fit > 0 and math.isfinite(a_fit + c_fit)
    if fitted:
        A, c = float(a_fit), float(c_fit)
        out["decode_step_per_sequence_s"] = FittedParameter(c * per_seq, samples)
        out["decode_step_fixed_s"] = FittedParameter(A, samples)
    else:
        # b is not identified: keep it, and fit A alone to what the steps took.
        out["decode_step_per_sequence_s"] = FittedParameter(b, samples, "kept")
        a_fit = float(np.sum(w * (y - c * load)) / w.sum())
        if a_fit > 0:
            A = a_fit
        out["decode_step_fixed_s"] = FittedParameter(A, samples, "fit" if a_fit > 0 else "kept")
    return _DecodeStepCost(A, c, by_context), out


def _fit_prefill(
    prefill: list[IterationObservation], step: _DecodeStepCost, t: float
) -> FittedParameter:
    """``t_prefill``: what iterations with prefill took beyond their decode step, per token."""
    w = np.array([o.iterations for o in prefill], float)
    p = np.array([o.prefill_tokens for o in prefill], float)
    rest = np.array(
        [
            o.seconds
            - (step.fixed_s if o.decode_sequences else 0.0)
            - step.per_load_s * step.load(o)
            for o in prefill
        ]
    )
    t_fit = float(np.sum(w * rest * p) / np.sum(w * p * p))
    ok = len(prefill) >= MIN_PREFILL_SAMPLES and t_fit > 0 and math.isfinite(t_fit)
    return FittedParameter(t_fit if ok else t, int(w.sum()), "fit" if ok else "kept")
