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
from pearl.control.decision import WorkloadParams


@dataclass(slots=True, frozen=True)
class IterationObservation:
    """One engine iteration as a worker measured it."""

    decode_sequences: int
    prefill_tokens: int
    seconds: float


@dataclass(slots=True, frozen=True)
class TurnObservation:
    """One finished turn of a trajectory."""

    appended_tokens: int  # observation tokens added before the turn
    generated_tokens: int
    kept_tokens: int  # of the previous turn's response, kept in this turn's context
    env_time_s: float  # environment time after the turn
    decode_s: float  # first token to last token


@dataclass(slots=True, frozen=True)
class TrajectoryObservation:
    turns: tuple[TurnObservation, ...]
    lifetime_s: float
    context_tokens: int = 0  # final context length (0: unknown)


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
        self, prior: WorkloadParams, alpha: float = 0.5, iteration_window: int = 4096
    ) -> None:
        self.prior = prior
        self.alpha = alpha
        self._iterations: deque[IterationObservation] = deque(maxlen=iteration_window)
        self._trajectories: list[TrajectoryObservation] = []
        self._ema: dict[str, Ema] = {}
        self.toggle_cost_s = Ema(alpha)
        self.step_time_borrowed_s = Ema(alpha)
        self.step_time_dedicated_s = Ema(alpha)
        self.params = prior
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
                    generated_tokens=len(out.token_ids),
                    kept_tokens=result.kept_tokens[k],
                    env_time_s=result.env_s[k],
                    decode_s=max(0.0, t.finished_at - first),
                )
            )
        self.observe_trajectory(
            TrajectoryObservation(
                tuple(turns), result.finished_at - result.started_at, result.context_tokens
            )
        )

    def observe_toggle(self, seconds: float) -> None:
        """Activation plus return cost of one borrowing round (T_toggle)."""
        self.toggle_cost_s.update(seconds)

    def observe_step_time(self, seconds: float, borrowed: bool) -> None:
        (self.step_time_borrowed_s if borrowed else self.step_time_dedicated_s).update(seconds)

    # -- refit ---------------------------------------------------------------------
    def end_step(self, batch_size: int, makespan_s: float) -> WorkloadParams:
        """Refit from this step's trajectories and the recent iterations; smooth; reset."""
        fitted = self._fit(batch_size, makespan_s)
        smoothed = {}
        for name, value in fitted.items():
            ema = self._ema.setdefault(name, Ema(self.alpha))
            smoothed[name] = ema.update(value)
        self.params = replace(self.prior, batch_trajectories=batch_size, **smoothed)
        self._trajectories = []
        self.steps += 1
        return self.params

    def _fit(self, batch_size: int, makespan_s: float) -> dict[str, float]:
        out: dict[str, float] = {}
        trajs = self._trajectories
        if trajs:
            turns = [t for tr in trajs for t in tr.turns]
            out["turns"] = float(max(len(tr.turns) for tr in trajs))
            out["decode_tokens_per_turn"] = sum(t.generated_tokens for t in turns) / len(turns)
            # What a prefill worker must compute per turn: the new observation and the kept
            # response tail (a disaggregated prefill worker never decoded those tokens).
            out["appended_tokens_per_turn"] = sum(
                t.appended_tokens + t.kept_tokens for t in turns
            ) / len(turns)
            out["env_time_s"] = max(sum(t.env_time_s for t in tr.turns) for tr in trajs)
            contexts = [tr.context_tokens for tr in trajs if tr.context_tokens > 0]
            if contexts:
                # The batch's KV at its peak, per trajectory: K x mean final context.
                out["kv_bytes_per_trajectory"] = (
                    self.prior.kv_bytes_per_token * sum(contexts) / len(contexts)
                )
            if makespan_s > 0:
                decoding = sum(t.decode_s for t in turns)
                f = min(1.0, max(1e-3, decoding / (len(trajs) * makespan_s)))
                out["bubble_ratio"] = (1 - f) / f
        out.update(self._fit_iterations())
        return out

    def _fit_iterations(self) -> dict[str, float]:
        """Least squares of ``seconds = A + b * decodes + t_prefill * prefill_tokens``."""
        its = self._iterations
        if len(its) < 3:
            return {}
        x = np.array([[1.0, o.decode_sequences, o.prefill_tokens] for o in its])
        y = np.array([o.seconds for o in its])
        if np.linalg.matrix_rank(x) < 3:
            return {}
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        a, b, t = (float(c) for c in coef)
        if not all(math.isfinite(c) for c in (a, b, t)):
            return {}
        # Negative coefficients are fitting noise; keep the physically meaningful floor.
        return {
            "decode_step_fixed_s": max(a, 1e-6),
            "decode_step_per_sequence_s": max(b, 0.0),
            "prefill_s_per_token": max(t, 1e-9),
        }
