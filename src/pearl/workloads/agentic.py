"""Agentic rollout workloads: tasks, groups of trajectories, turns, and profiles that generate them.

A rollout batch is ``num_tasks`` tasks x ``group_size`` trajectories (GRPO groups). A
trajectory is a list of turns; in turn ``k`` the environment appends
``observation_tokens`` to the context (turn 0's observation is the task's initial
prompt), the policy generates ``response_tokens``, and ``response_tokens_kept`` of them
stay in the context of the next turn (all of them unless thinking is stripped); then
the environment works for ``env_latency_s`` before the next observation.

The workload fixes every length in advance, so the simulator and a live engine see
trajectories of the *same shape*: live generation runs with ``ignore_eos`` and
``max_new_tokens = response_tokens``. Token contents come from
:func:`observation_token_ids` and friends, deterministic in (seed, task, trajectory,
turn); siblings of a group share the initial prompt token for token, and all tasks of
a workload share the system/tool prefix, so prefix caching behaves as in real runs.

Profile defaults cite the team's survey of published agentic workloads, docs/workloads.md (its
sources are named next to each value; "M" = measured in the source,
"E" = estimate built on them); every one can be overridden with
``dataclasses.replace`` or :func:`profile_from_dict`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

import numpy as np
import pydantic

from pearl.errors import ConfigError, WorkloadError

__all__ = [
    "AgenticProfile",
    "BatchSummary",
    "Choice",
    "Fixed",
    "LogNormal",
    "Mixture",
    "RolloutBatch",
    "StopReason",
    "TaskGroup",
    "Trajectory",
    "Turn",
    "Uniform",
    "UniformInt",
    "context_token_ids",
    "generate_batch",
    "get_profile",
    "observation_token_ids",
    "profile_from_dict",
    "profile_names",
    "response_token_ids",
    "scaled",
    "shared_prefix_token_ids",
    "summarize",
]


# ---------------------------------------------------------------------------
# Trajectory shape
# ---------------------------------------------------------------------------


class StopReason(StrEnum):
    """Why a trajectory ended."""

    DONE = "done"  # the agent finished (answered, submitted) before any cap
    MAX_TURNS = "max_turns"  # the scaffold's turn cap was reached
    MAX_CONTEXT = "max_context"  # the next observation or response would pass max_context_tokens


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(slots=True, frozen=True)
class Turn:
    """One turn: observation appended, response generated, part of it kept, then environment time.

    Invariants: ``observation_tokens >= 0``, ``response_tokens >= 1``,
    ``0 <= response_tokens_kept <= response_tokens``, ``env_latency_s >= 0``. When fewer
    tokens are kept, the *last* ones stay (a stripped thought precedes the action).
    """

    observation_tokens: int
    response_tokens: int
    response_tokens_kept: int
    env_latency_s: float = 0.0

    def __post_init__(self) -> None:
        for name, low in (
            ("observation_tokens", 0),
            ("response_tokens", 1),
            ("response_tokens_kept", 0),
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                raise WorkloadError(f"Turn.{name} must be an int >= {low}, got {value!r}")
        if self.response_tokens_kept > self.response_tokens:
            raise WorkloadError(
                f"Turn.response_tokens_kept ({self.response_tokens_kept}) must be <= "
                f"response_tokens ({self.response_tokens})"
            )
        if not (math.isfinite(self.env_latency_s) and self.env_latency_s >= 0):
            raise WorkloadError(
                f"Turn.env_latency_s must be a finite number >= 0, got {self.env_latency_s!r}"
            )


@dataclass(slots=True, frozen=True)
class Trajectory:
    """One rollout of a task: its turns plus environment setup and reward-evaluation time.

    ``turns[0].observation_tokens`` is the initial prompt; its first
    ``shared_prefix_tokens`` tokens (system/tool prompt) are identical across all tasks.
    """

    task_id: str
    index_in_group: int
    turns: tuple[Turn, ...]
    shared_prefix_tokens: int = 0
    env_setup_s: float = 0.0
    reward_latency_s: float = 0.0
    stop: StopReason = StopReason.DONE
    observation_window: int | None = None
    """Observations (after the prompt) older than the last ``observation_window`` are
    collapsed to their first ``collapsed_observation_tokens`` tokens, as SWE-agent's
    ``last_n_observations`` history processor does; None keeps them all."""
    collapsed_observation_tokens: int = 0

    def __post_init__(self) -> None:
        if self.observation_window is not None and not (
            _is_int(self.observation_window) and self.observation_window >= 1
        ):
            raise WorkloadError(
                f"Trajectory.observation_window must be an int >= 1 or None, "
                f"got {self.observation_window!r}"
            )
        if not _is_int(self.collapsed_observation_tokens) or self.collapsed_observation_tokens < 0:
            raise WorkloadError(
                "Trajectory.collapsed_observation_tokens must be an int >= 0, "
                f"got {self.collapsed_observation_tokens!r}"
            )
        if not isinstance(self.task_id, str) or not self.task_id:
            raise WorkloadError(f"Trajectory.task_id must be a non-empty str, got {self.task_id!r}")
        if not _is_int(self.index_in_group) or self.index_in_group < 0:
            raise WorkloadError(
                f"Trajectory.index_in_group must be an int >= 0, got {self.index_in_group!r}"
            )
        if not self.turns:
            raise WorkloadError(f"Trajectory {self.task_id}/{self.index_in_group} has no turns")
        if self.turns[0].observation_tokens < 1:
            raise WorkloadError(
                f"Trajectory {self.task_id}/{self.index_in_group}: turns[0].observation_tokens "
                "(the initial prompt) must be >= 1"
            )
        if not _is_int(self.shared_prefix_tokens) or not (
            0 <= self.shared_prefix_tokens <= self.turns[0].observation_tokens
        ):
            raise WorkloadError(
                f"Trajectory {self.task_id}/{self.index_in_group}: shared_prefix_tokens must be an "
                f"int in [0, {self.turns[0].observation_tokens}] (the prompt), "
                f"got {self.shared_prefix_tokens!r}"
            )
        for name in ("env_setup_s", "reward_latency_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise WorkloadError(
                    f"Trajectory.{name} must be a finite number >= 0, got {value!r}"
                )
        if not isinstance(self.stop, StopReason):
            object.__setattr__(self, "stop", StopReason(self.stop))

    @property
    def num_turns(self) -> int:
        """Number of turns (model calls)."""
        return len(self.turns)

    @property
    def prompt_tokens(self) -> int:
        """Length of the initial prompt (turn 0's observation)."""
        return self.turns[0].observation_tokens

    def observation_shown(self, turn_index: int, at_turn: int) -> int:
        """Tokens of turn ``turn_index``'s observation in the context of turn ``at_turn``
        (all of them, or the collapsed stub once it left the observation window)."""
        n = self.turns[turn_index].observation_tokens
        window = self.observation_window
        if turn_index == 0 or window is None or at_turn - turn_index < window:
            return n
        return min(n, self.collapsed_observation_tokens)

    def context_lengths(self) -> tuple[int, ...]:
        """Context length (prompt of the generation) before each turn's response, in order."""
        lengths = []
        context = 0
        for i, turn in enumerate(self.turns):
            if i:
                context += self.turns[i - 1].response_tokens_kept
                if self.observation_window is not None and i - self.observation_window >= 1:
                    j = i - self.observation_window  # its observation collapses now
                    context -= self.turns[j].observation_tokens - self.observation_shown(j, i)
            context += turn.observation_tokens
            lengths.append(context)
        return tuple(lengths)

    def context_before(self, turn_index: int) -> int:
        """Context length when turn ``turn_index`` starts generating (its observation included)."""
        if not 0 <= turn_index < len(self.turns):
            raise WorkloadError(
                f"turn_index {turn_index} out of range [0, {len(self.turns)}) for trajectory "
                f"{self.task_id}/{self.index_in_group}"
            )
        return self.context_lengths()[turn_index]

    @property
    def peak_context_tokens(self) -> int:
        """Longest sequence the engine holds: context before a turn plus its full response."""
        return max(
            c + t.response_tokens for c, t in zip(self.context_lengths(), self.turns, strict=True)
        )

    @property
    def final_context_tokens(self) -> int:
        """Sequence length at the end of the last turn's generation."""
        return self.context_lengths()[-1] + self.turns[-1].response_tokens

    @property
    def generated_tokens(self) -> int:
        """Total tokens the policy generates (decode work) over all turns."""
        return sum(t.response_tokens for t in self.turns)

    @property
    def appended_tokens(self) -> int:
        """Observation tokens the environment appends after the initial prompt (turns 1..)."""
        return sum(t.observation_tokens for t in self.turns[1:])

    @property
    def env_time_s(self) -> float:
        """Environment time: setup, every turn's latency, and reward evaluation."""
        return self.env_setup_s + sum(t.env_latency_s for t in self.turns) + self.reward_latency_s


@dataclass(slots=True, frozen=True)
class TaskGroup:
    """The G trajectories of one task; they share the initial prompt and diverge afterwards."""

    task_id: str
    trajectories: tuple[Trajectory, ...]

    def __post_init__(self) -> None:
        if not self.trajectories:
            raise WorkloadError(f"TaskGroup {self.task_id!r} has no trajectories")
        first = self.trajectories[0]
        for position, traj in enumerate(self.trajectories):
            if traj.task_id != self.task_id:
                raise WorkloadError(
                    f"TaskGroup {self.task_id!r}: trajectory {position} has task_id {traj.task_id!r}"
                )
            if traj.index_in_group != position:
                raise WorkloadError(
                    f"TaskGroup {self.task_id!r}: trajectory at position {position} has "
                    f"index_in_group {traj.index_in_group}; expected {position}"
                )
            if (traj.prompt_tokens, traj.shared_prefix_tokens) != (
                first.prompt_tokens,
                first.shared_prefix_tokens,
            ):
                raise WorkloadError(
                    f"TaskGroup {self.task_id!r}: trajectory {position} has prompt "
                    f"{traj.prompt_tokens} tokens (shared prefix {traj.shared_prefix_tokens}); "
                    f"siblings must share trajectory 0's {first.prompt_tokens} "
                    f"({first.shared_prefix_tokens})"
                )

    @property
    def group_size(self) -> int:
        """Number of trajectories (G)."""
        return len(self.trajectories)

    @property
    def prompt_tokens(self) -> int:
        """Length of the initial prompt all siblings share."""
        return self.trajectories[0].prompt_tokens


@dataclass(slots=True, frozen=True)
class RolloutBatch:
    """B = tasks x G trajectories generated for one rollout step, each within ``max_context_tokens``."""

    groups: tuple[TaskGroup, ...]
    max_context_tokens: int
    profile_name: str = ""
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.groups:
            raise WorkloadError("RolloutBatch has no task groups")
        if not _is_int(self.max_context_tokens) or self.max_context_tokens < 2:
            raise WorkloadError(
                f"RolloutBatch.max_context_tokens must be an int >= 2, got {self.max_context_tokens!r}"
            )
        seen: set[str] = set()
        for group in self.groups:
            if group.task_id in seen:
                raise WorkloadError(f"RolloutBatch: task_id {group.task_id!r} appears twice")
            seen.add(group.task_id)
            for traj in group.trajectories:
                if traj.peak_context_tokens > self.max_context_tokens:
                    raise WorkloadError(
                        f"RolloutBatch: trajectory {traj.task_id}/{traj.index_in_group} reaches "
                        f"{traj.peak_context_tokens} tokens, over max_context_tokens "
                        f"{self.max_context_tokens}"
                    )

    @property
    def trajectories(self) -> tuple[Trajectory, ...]:
        """All trajectories, task by task, in group order."""
        return tuple(t for g in self.groups for t in g.trajectories)

    @property
    def num_tasks(self) -> int:
        """Number of tasks (groups)."""
        return len(self.groups)

    @property
    def num_trajectories(self) -> int:
        """B, the number of trajectories."""
        return sum(g.group_size for g in self.groups)

    @property
    def group_size(self) -> int:
        """G; raises WorkloadError when groups differ in size."""
        sizes = {g.group_size for g in self.groups}
        if len(sizes) != 1:
            raise WorkloadError(f"RolloutBatch groups have different sizes {sorted(sizes)}")
        return sizes.pop()

    @property
    def generated_tokens(self) -> int:
        """Total generated tokens over the batch."""
        return sum(t.generated_tokens for t in self.trajectories)


# ---------------------------------------------------------------------------
# Distributions (small typed values; pydantic validates them only at the file edge)
# ---------------------------------------------------------------------------


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


@dataclass(slots=True, frozen=True)
class Fixed:
    """Always ``value``."""

    value: float
    kind: Literal["fixed"] = "fixed"

    def __post_init__(self) -> None:
        _check(math.isfinite(self.value), f"Fixed.value must be finite, got {self.value!r}")

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value."""
        return float(self.value)

    def scaled(self, factor: float) -> Fixed:
        """The distribution of ``factor * X``."""
        return Fixed(self.value * factor)


@dataclass(slots=True, frozen=True)
class Uniform:
    """Continuous uniform on [low, high]."""

    low: float
    high: float
    kind: Literal["uniform"] = "uniform"

    def __post_init__(self) -> None:
        _check(
            math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high,
            f"Uniform needs finite low <= high, got low={self.low!r} high={self.high!r}",
        )

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value."""
        return float(rng.uniform(self.low, self.high))

    def scaled(self, factor: float) -> Uniform:
        """The distribution of ``factor * X``."""
        return Uniform(self.low * factor, self.high * factor)


@dataclass(slots=True, frozen=True)
class UniformInt:
    """Integer uniform on [low, high], both inclusive."""

    low: int
    high: int
    kind: Literal["uniform_int"] = "uniform_int"

    def __post_init__(self) -> None:
        _check(
            _is_int(self.low) and _is_int(self.high) and self.low <= self.high,
            f"UniformInt needs int low <= high, got low={self.low!r} high={self.high!r}",
        )

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value."""
        return float(rng.integers(self.low, self.high + 1))

    def scaled(self, factor: float) -> UniformInt:
        """Approximately ``factor * X`` (bounds rounded to ints, high kept >= low)."""
        low = max(0, round(self.low * factor))
        return UniformInt(low, max(low, round(self.high * factor)))


@dataclass(slots=True, frozen=True)
class LogNormal:
    """LogNormal with the given median and log-space sigma, clipped to [low, high] (high None = open)."""

    median: float
    sigma: float
    low: float = 0.0
    high: float | None = None
    kind: Literal["lognormal"] = "lognormal"

    def __post_init__(self) -> None:
        _check(
            self.median > 0 and math.isfinite(self.median),
            f"LogNormal.median must be > 0, got {self.median!r}",
        )
        _check(
            self.sigma >= 0 and math.isfinite(self.sigma),
            f"LogNormal.sigma must be >= 0, got {self.sigma!r}",
        )
        _check(
            self.high is None or self.low <= self.high,
            f"LogNormal needs low <= high, got low={self.low!r} high={self.high!r}",
        )

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value."""
        value = self.median * math.exp(self.sigma * float(rng.standard_normal()))
        value = max(self.low, value)
        return value if self.high is None else min(self.high, value)

    def scaled(self, factor: float) -> LogNormal:
        """The distribution of ``factor * X`` (clip bounds scaled too)."""
        high = None if self.high is None else self.high * factor
        return LogNormal(self.median * factor, self.sigma, self.low * factor, high)


@dataclass(slots=True, frozen=True)
class Choice:
    """One of ``values`` with probabilities proportional to ``weights``."""

    values: tuple[float, ...]
    weights: tuple[float, ...]
    kind: Literal["choice"] = "choice"

    def __post_init__(self) -> None:
        _check(
            len(self.values) == len(self.weights) and len(self.values) > 0,
            f"Choice needs as many weights as values (>0), got {len(self.values)} values "
            f"and {len(self.weights)} weights",
        )
        _check(
            all(w >= 0 for w in self.weights) and sum(self.weights) > 0,
            f"Choice.weights must be >= 0 with a positive sum, got {self.weights!r}",
        )

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value."""
        return float(self.values[_pick(rng, self.weights)])

    def scaled(self, factor: float) -> Choice:
        """The distribution of ``factor * X``."""
        return Choice(tuple(v * factor for v in self.values), self.weights)


SimpleDist = Annotated[
    Fixed | Uniform | UniformInt | LogNormal | Choice, pydantic.Field(discriminator="kind")
]


@dataclass(slots=True, frozen=True)
class Mixture:
    """Draw from ``components[i]`` with probability proportional to ``weights[i]``."""

    components: tuple[SimpleDist, ...]
    weights: tuple[float, ...]
    kind: Literal["mixture"] = "mixture"

    def __post_init__(self) -> None:
        _check(
            len(self.components) == len(self.weights) and len(self.components) > 0,
            f"Mixture needs as many weights as components (>0), got {len(self.components)} "
            f"components and {len(self.weights)} weights",
        )
        _check(
            all(w >= 0 for w in self.weights) and sum(self.weights) > 0,
            f"Mixture.weights must be >= 0 with a positive sum, got {self.weights!r}",
        )

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value."""
        return self.components[_pick(rng, self.weights)].sample(rng)

    def scaled(self, factor: float) -> Mixture:
        """The distribution of ``factor * X``."""
        return Mixture(tuple(c.scaled(factor) for c in self.components), self.weights)


Dist = Annotated[
    Fixed | Uniform | UniformInt | LogNormal | Choice | Mixture,
    pydantic.Field(discriminator="kind"),
]


def _pick(rng: np.random.Generator, weights: Sequence[float]) -> int:
    u = float(rng.random()) * sum(weights)
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w
        if u < acc:
            return i
    return len(weights) - 1


def _tokens(dist: Any, rng: np.random.Generator, low: int, high: int | None = None) -> int:
    value = max(low, round(dist.sample(rng)))
    return value if high is None else min(high, value)


# ---------------------------------------------------------------------------
# Profiles
# ---------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class AgenticProfile:
    """The distributions a workload draws trajectories from; token counts are rounded to ints.

    Attributes:
        name: profile name, also the task-id prefix.
        max_context_tokens: a trajectory stops before its context would pass this.
        group_size: trajectories per task (G).
        num_tasks: tasks per rollout batch (B = num_tasks x group_size).
        turns: planned turns per trajectory (rounded, clipped to [min_turns, max_turns]).
        min_turns, max_turns: turn clip; reaching max_turns ends with StopReason.MAX_TURNS.
        shared_prefix_tokens: system/tool prompt identical for all tasks (same token ids).
        task_prompt_tokens: task-specific part of the initial prompt (issue, question).
        max_prompt_tokens: cap on the whole initial prompt; the task part is clipped to fit.
        response_tokens: tokens generated per turn (>= 1).
        observation_tokens: tokens the environment appends per turn after turn 0 (>= 1).
        env_latency_s: environment time after a response (tool call, retrieval, action).
        env_overhead_s: fixed per-action sandbox overhead added to every env latency.
        env_timeout_s: env latency (before the overhead) is clipped here; None = no timeout.
        env_setup_s: per-trajectory environment start (container/VM) before turn 0.
        reward_latency_s: per-trajectory reward evaluation after the last turn.
        kept_response_tokens: None keeps whole responses; otherwise thinking is stripped and
            only min(response, draw) final tokens (the action) stay in the next context.
        image_tokens: tokens of one screenshot, drawn once per task (a task has one screen
            resolution); added to the initial prompt and to every observation. None = text only.
        observation_window: keep only the last N observations whole (the prompt always);
            older ones collapse to ``collapsed_observation_tokens`` (SWE-agent's
            last_n_observations). Every collapse edits the context, so the engine re-prefills
            from the collapsed observation on. None = keep everything.
        description: one line on what the profile models and where its numbers come from.
    """

    name: str
    max_context_tokens: int
    group_size: int
    num_tasks: int
    turns: Dist
    min_turns: int
    max_turns: int
    shared_prefix_tokens: int
    task_prompt_tokens: Dist
    max_prompt_tokens: int
    response_tokens: Dist
    observation_tokens: Dist
    env_latency_s: Dist
    env_overhead_s: float = 0.0
    env_timeout_s: float | None = None
    env_setup_s: Dist = Fixed(0.0)
    reward_latency_s: Dist = Fixed(0.0)
    kept_response_tokens: Dist | None = None
    image_tokens: Dist | None = None
    observation_window: int | None = None
    collapsed_observation_tokens: int = 0
    description: str = ""

    def __post_init__(self) -> None:
        _check(bool(self.name), "AgenticProfile.name must be non-empty")
        for field in ("group_size", "num_tasks", "min_turns"):
            value = getattr(self, field)
            _check(
                _is_int(value) and value >= 1,
                f"AgenticProfile({self.name}).{field} must be an int >= 1, got {value!r}",
            )
        _check(
            _is_int(self.max_turns) and self.max_turns >= self.min_turns,
            f"AgenticProfile({self.name}).max_turns must be an int >= min_turns "
            f"({self.min_turns}), got {self.max_turns!r}",
        )
        _check(
            _is_int(self.shared_prefix_tokens) and self.shared_prefix_tokens >= 0,
            f"AgenticProfile({self.name}).shared_prefix_tokens must be an int >= 0, "
            f"got {self.shared_prefix_tokens!r}",
        )
        _check(
            _is_int(self.max_prompt_tokens) and self.max_prompt_tokens > self.shared_prefix_tokens,
            f"AgenticProfile({self.name}).max_prompt_tokens must be an int > "
            f"shared_prefix_tokens ({self.shared_prefix_tokens}), got {self.max_prompt_tokens!r}",
        )
        _check(
            _is_int(self.max_context_tokens) and self.max_context_tokens > self.max_prompt_tokens,
            f"AgenticProfile({self.name}).max_context_tokens must be an int > max_prompt_tokens "
            f"({self.max_prompt_tokens}) so turn 0 can generate, got {self.max_context_tokens!r}",
        )
        _check(
            self.env_overhead_s >= 0,
            f"AgenticProfile({self.name}).env_overhead_s must be >= 0, got {self.env_overhead_s!r}",
        )
        _check(
            self.env_timeout_s is None or self.env_timeout_s > 0,
            f"AgenticProfile({self.name}).env_timeout_s must be > 0 or None, "
            f"got {self.env_timeout_s!r}",
        )

    @property
    def batch_size(self) -> int:
        """B = num_tasks x group_size."""
        return self.num_tasks * self.group_size


def _swe(thinking: bool = False) -> AgenticProfile:
    # Every number below: docs/workloads.md, section SWE, unless marked otherwise.
    return AgenticProfile(
        name="swe_thinking" if thinking else "swe",
        # PEARL's evaluation (docs/paper.md "How it was evaluated"): 32K max trajectory, G=16, batch 64.
        max_context_tokens=32_768,
        group_size=16,
        num_tasks=4,
        # E: "turns LogNormal(median 25, sigma 0.75) clipped to [3, cap] (mean ~33)"; measured
        # means 16-64 (nebius Table 1). Cap 100: NeMo Gym SWE RL <= 100 turns, OpenHands cap 100.
        turns=LogNormal(median=25, sigma=0.75),
        min_turns=3,
        max_turns=100,
        # E: "initial prompt 1.5-3K system/tools + issue LogNormal(median 400, sigma 0.8),
        # total <= 4,096" (4,096 = DeepSWE/rLLM prompt limit, M).
        shared_prefix_tokens=2_048,
        task_prompt_tokens=LogNormal(median=400, sigma=0.8, low=1),
        max_prompt_tokens=4_096,
        # E: actions LogNormal(150, 0.8) without thinking, (900, 0.9) with, capped 2,048-8,192
        # (ROLL: 2,048 tokens per step, M).
        response_tokens=(
            LogNormal(median=900, sigma=0.9, low=1, high=8_192)
            if thinking
            else LogNormal(median=150, sigma=0.8, low=1, high=2_048)
        ),
        # With thinking the scaffold keeps only the action (Qwen3's chat template drops
        # earlier turns' thoughts); the action follows the non-thinking action length.
        kept_response_tokens=LogNormal(median=150, sigma=0.8, low=1, high=2_048)
        if thinking
        else None,
        # E: observations LogNormal(750, 1.4) truncated at 2.5-10K; tracelab appended tokens
        # per step p50 710-954, p90 3.1-6.1K, p99 10-31K (M). The 10K cap keeps p90 ~4.5K in that
        # range; 2,500 (mini-swe-agent's 10,000 chars at ~4 chars/token) is the strict scaffold.
        observation_tokens=LogNormal(median=750, sigma=1.4, low=1, high=10_000),
        # E: 0.3 s fixed (sandbox overhead 0.26-0.6 s per action, Daytona, M) + 90% commands
        # LogNormal(0.4 s, 1.0) and 10% test runs LogNormal(15 s, 1.0).
        env_overhead_s=0.3,
        env_latency_s=Mixture(
            components=(LogNormal(median=0.4, sigma=1.0), LogNormal(median=15.0, sigma=1.0)),
            weights=(0.9, 0.1),
        ),
        # M: ROLL shell timeout 360 s (mini-swe-agent: 60 s).
        env_timeout_s=360.0,
        # E: setup LogNormal(3 s, 0.7) (cold start 2-5 s, M) with a 5% cold image pull U(30, 300) s.
        env_setup_s=Mixture(
            components=(LogNormal(median=3.0, sigma=0.7), Uniform(30.0, 300.0)),
            weights=(0.95, 0.05),
        ),
        # E: reward evaluation LogNormal(30 s, 1.0), clipped at the 1,200 s test timeout (M: R2E-Gym).
        reward_latency_s=LogNormal(median=30.0, sigma=1.0, high=1_200.0),
        description="SWE-bench-like coding agent (docs/workloads.md SWE; PEARL's 32K / G16 / B64 setting)",
    )


def _gui() -> AgenticProfile:
    # Every number below: docs/workloads.md, section GUI, unless marked otherwise.
    return AgenticProfile(
        name="gui",
        max_context_tokens=32_768,  # E: PEARL's setting; 15 steps x (2.7K + text) fit.
        group_size=16,  # E: PEARL's GRPO setting.
        num_tasks=4,
        # E: steps LogNormal(median 10, sigma 0.6), cap 15 (ARPO/OSWorld training cap, M).
        turns=LogNormal(median=10, sigma=0.6),
        min_turns=1,
        max_turns=15,
        # E (not in docs/workloads.md): computer-use system prompt with the action space ~1K tokens;
        # instruction LogNormal(median 60, sigma 0.5); the first screenshot joins the prompt.
        shared_prefix_tokens=1_024,
        task_prompt_tokens=LogNormal(median=60, sigma=0.5, low=1),
        max_prompt_tokens=4_096,
        # E: action LogNormal(median 100, sigma 0.6) (median 400 with a thought).
        response_tokens=LogNormal(median=100, sigma=0.6, low=1, high=1_024),
        # M (D): Qwen2.5-VL one token per 28x28 pixels, ~1K (1280x720) to ~2.7K (1920x1080).
        # Modelled append-only: each turn appends one new screenshot + text; the scaffold's
        # 5-screenshot history window (which would drop old images) is not modelled, so late
        # contexts are over-estimated by the dropped screenshots.
        image_tokens=Uniform(1_000.0, 2_700.0),
        # E: accessibility/status text per observation besides the screenshot.
        observation_tokens=LogNormal(median=50, sigma=0.5, low=1, high=1_000),
        # E: action + screenshot 1-3 s.
        env_latency_s=Uniform(1.0, 3.0),
        # E: VM reset Uniform(10, 60) s.
        env_setup_s=Uniform(10.0, 60.0),
        # E (not in docs/workloads.md): OSWorld evaluator scripts, a few seconds.
        reward_latency_s=LogNormal(median=5.0, sigma=0.7),
        description="OSWorld-like computer-use agent (docs/workloads.md GUI)",
    )


def _search() -> AgenticProfile:
    # Every number below: docs/workloads.md, section Search, unless marked otherwise.
    return AgenticProfile(
        name="search",
        # M: Search-R1 train_grpo.sh total 4,096 tokens, start prompt 2,048.
        max_context_tokens=4_096,
        group_size=16,  # E: PEARL's GRPO setting (Search-R1 uses 5).
        num_tasks=4,
        # E: searches {0: .10, 1: .40, 2: .35, 3: .15}, turns = searches + 1.
        turns=Choice(values=(1, 2, 3, 4), weights=(0.10, 0.40, 0.35, 0.15)),
        min_turns=1,
        max_turns=4,
        # E (not in docs/workloads.md): Search-R1's instruction template ~150 tokens.
        shared_prefix_tokens=150,
        # E: prompt LogNormal(median 250, sigma 0.4) in total; split as the shared 150 plus a
        # question LogNormal(100, 0.8), which keeps the total's median 250 and p10/p90 ~186/428
        # (the suggested total gives 150/417).
        task_prompt_tokens=LogNormal(median=100, sigma=0.8, low=1),
        max_prompt_tokens=2_048,
        # E: response LogNormal(median 150, sigma 0.6) capped 500 (M: 500 per turn).
        response_tokens=LogNormal(median=150, sigma=0.6, low=1, high=500),
        # E: top-3 passages ~400 tokens, <= 500 (M).
        observation_tokens=LogNormal(median=400, sigma=0.15, low=1, high=500),
        # E: retrieval LogNormal(median 30 ms, sigma 0.5).
        env_latency_s=LogNormal(median=0.03, sigma=0.5),
        # E: exact-match reward is computed in process: no setup, negligible reward time.
        description="Search-R1-style retrieval QA (docs/workloads.md Search)",
    )


def _game() -> AgenticProfile:
    # Not in docs/workloads.md: an estimate (E) of text games / multi-turn puzzles (Sokoban,
    # FrozenLake, Wordle style), chosen to stress many short turns.
    return AgenticProfile(
        name="game",
        max_context_tokens=8_192,
        group_size=16,
        num_tasks=4,
        turns=UniformInt(10, 40),
        min_turns=1,
        max_turns=50,  # E: a scaffold cap above the natural 10-40
        shared_prefix_tokens=256,  # E: rules of the game
        task_prompt_tokens=UniformInt(50, 300),  # E: initial board/state
        max_prompt_tokens=1_024,
        response_tokens=UniformInt(5, 30),  # E: one move
        observation_tokens=UniformInt(20, 80),  # E: new state + feedback
        env_latency_s=Uniform(0.01, 0.1),  # E: in-process step, 10-100 ms
        env_setup_s=Uniform(0.05, 0.2),  # E: reset a game
        description="short-turn game (estimate): 10-40 turns of 20-80 observation, 5-30 response tokens",
    )


def scaled(
    profile: AgenticProfile,
    token_factor: float = 1.0,
    time_factor: float = 1.0,
    name: str | None = None,
) -> AgenticProfile:
    """``profile`` with every token quantity times ``token_factor`` and every time times ``time_factor``.

    Turn counts and group/batch sizes are unchanged; use ``dataclasses.replace`` for those.
    """
    _check(
        token_factor > 0 and time_factor > 0,
        f"scaled() factors must be > 0, got token_factor={token_factor} time_factor={time_factor}",
    )

    def tok(n: int) -> int:
        return max(1, round(n * token_factor))

    def opt(d: Any, f: float) -> Any:
        return None if d is None else d.scaled(f)

    shared = 0 if profile.shared_prefix_tokens == 0 else tok(profile.shared_prefix_tokens)
    max_prompt = max(shared + 1, tok(profile.max_prompt_tokens))
    return dataclasses.replace(
        profile,
        name=name or f"{profile.name}_x{token_factor:g}",
        max_context_tokens=max(max_prompt + 1, tok(profile.max_context_tokens)),
        shared_prefix_tokens=shared,
        task_prompt_tokens=profile.task_prompt_tokens.scaled(token_factor),
        max_prompt_tokens=max_prompt,
        response_tokens=profile.response_tokens.scaled(token_factor),
        observation_tokens=profile.observation_tokens.scaled(token_factor),
        kept_response_tokens=opt(profile.kept_response_tokens, token_factor),
        image_tokens=opt(profile.image_tokens, token_factor),
        env_latency_s=profile.env_latency_s.scaled(time_factor),
        env_overhead_s=profile.env_overhead_s * time_factor,
        env_timeout_s=None
        if profile.env_timeout_s is None
        else profile.env_timeout_s * time_factor,
        env_setup_s=profile.env_setup_s.scaled(time_factor),
        reward_latency_s=profile.reward_latency_s.scaled(time_factor),
    )


def _tiny() -> AgenticProfile:
    # SWE's shape at 1/16 of the tokens (contexts up to 2,048) and 1/10 of the times, with
    # 2 tasks x 4: sized for calibration on a 2-core CPU with a 5-30M parameter model.
    return dataclasses.replace(
        scaled(_swe(), token_factor=1 / 16, time_factor=1 / 10, name="tiny"),
        group_size=4,
        num_tasks=2,
        description="SWE shape scaled to 1/16 tokens (2K context), 1/10 time, 2 tasks x 4",
    )


# Fitted to the paper's characterization (docs/regime.md; benchmarks/regime.py measures
# every row). Each value is fitted to the one row named next to it; nothing else is tuned.
SWE_PAPER_TURNS_MEDIAN = 92.0  # fitted to C4 (rollout -19.2% from 16 to 32 GPUs)
SWE_PAPER_ENV_SCALE = 0.137  # fitted to C5 (216.3 s mean trajectory, one per worker)


def _swe_paper() -> AgenticProfile:
    """``swe_thinking`` in the paper's regime (docs/regime.md): what the paper does not
    state is either cited or fitted to one characterization row."""
    base = _swe(thinking=True)
    scale = SWE_PAPER_ENV_SCALE
    return dataclasses.replace(
        base,
        name="swe_paper",
        # E (docs/workloads.md): turns LogNormal(sigma 0.75) capped at 100; the median is fitted.
        turns=LogNormal(median=SWE_PAPER_TURNS_MEDIAN, sigma=0.75),
        # M: coding agents generate ~523 tokens per step (tracelab): LogNormal(350, 0.9) has
        # mean 526. Qwen3's thinking precedes the action and is stripped from later turns,
        # which keep the action (swe_thinking). Cap 8,192 as swe_thinking.
        response_tokens=LogNormal(median=350, sigma=0.9, low=1, high=8_192),
        # M: SWE-agent 0.7 keeps the last 5 observations whole and collapses older ones to
        # "Old environment output: (n lines omitted)" (~10 tokens): last_n_observations n=5.
        observation_window=5,
        collapsed_observation_tokens=10,
        # E (docs/workloads.md) tool, setup and reward latencies, all scaled by one factor fitted
        # to C5: the paper's sandboxes are faster than the suggested distributions.
        env_overhead_s=base.env_overhead_s * scale,
        env_latency_s=base.env_latency_s.scaled(scale),
        env_setup_s=base.env_setup_s.scaled(scale),
        reward_latency_s=base.reward_latency_s.scaled(scale),
        description="SWE-bench coding agent in PEARL's regime (docs/regime.md: cited or fitted "
        "to C4/C5 per parameter)",
    )


_PROFILES = {
    "swe": _swe,
    "swe_thinking": lambda: _swe(thinking=True),
    "swe_paper": _swe_paper,
    "gui": _gui,
    "search": _search,
    "game": _game,
    "tiny": _tiny,
}


def profile_names() -> tuple[str, ...]:
    """Names accepted by :func:`get_profile`."""
    return tuple(_PROFILES)


def get_profile(name: str) -> AgenticProfile:
    """The named built-in profile; raises ConfigError listing the valid names."""
    try:
        return _PROFILES[name]()
    except KeyError:
        raise ConfigError(
            f"unknown workload profile {name!r}; valid: {', '.join(_PROFILES)}"
        ) from None


_PROFILE_ADAPTER: pydantic.TypeAdapter[AgenticProfile] | None = None


def profile_from_dict(data: Mapping[str, Any], source: str = "<profile>") -> AgenticProfile:
    """Build a profile from a config mapping; ``base: <name>`` starts from a built-in and overrides.

    Distributions are mappings with a ``kind`` (fixed, uniform, uniform_int, lognormal,
    choice, mixture). Errors raise ConfigError naming ``source`` and the field path.
    """
    global _PROFILE_ADAPTER
    if _PROFILE_ADAPTER is None:
        _PROFILE_ADAPTER = pydantic.TypeAdapter(AgenticProfile)
    merged: dict[str, Any] = dict(data)
    base = merged.pop("base", None)
    if base is not None:
        merged = {**dataclasses.asdict(get_profile(str(base))), **merged}
    try:
        return _PROFILE_ADAPTER.validate_python(merged, strict=False)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise ConfigError(
            f"{source}: field {field}: {first['msg']} (got {first.get('input')!r})"
        ) from None


# ---------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------


def _rng(seed: int, *key: int) -> np.random.Generator:
    # spawn_key makes each task's and trajectory's stream independent of how many others
    # there are: task i of a 4-task batch equals task i of an 8-task batch with the same seed.
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def _trajectory(
    profile: AgenticProfile,
    rng: np.random.Generator,
    task_id: str,
    index: int,
    prompt_tokens: int,
    image_tokens: int,
) -> Trajectory:
    drawn = round(profile.turns.sample(rng))
    planned = min(profile.max_turns, max(profile.min_turns, drawn))
    env_setup_s = profile.env_setup_s.sample(rng)
    reward_latency_s = profile.reward_latency_s.sample(rng)
    max_ctx = profile.max_context_tokens
    turns: list[Turn] = []
    context = 0
    window, stub = profile.observation_window, profile.collapsed_observation_tokens
    # Only a draw the cap cut short is a turn-limit stop; one that lands on the cap finished.
    stop = StopReason.MAX_TURNS if drawn > profile.max_turns else StopReason.DONE
    for k in range(planned):
        if window is not None and k - window >= 1:  # an observation leaves the window
            old = turns[k - window].observation_tokens
            context -= old - min(old, stub)
        # Draw every quantity of a turn before deciding whether it fits, so a turn's
        # values do not depend on the context cap (changing the cap only truncates).
        if k == 0:
            observation = prompt_tokens
        else:
            observation = _tokens(profile.observation_tokens, rng, 1) + image_tokens
        response = _tokens(profile.response_tokens, rng, 1)
        kept = response
        if profile.kept_response_tokens is not None:
            kept = min(response, _tokens(profile.kept_response_tokens, rng, 1))
        latency = profile.env_latency_s.sample(rng)
        if profile.env_timeout_s is not None:
            latency = min(latency, profile.env_timeout_s)
        latency += profile.env_overhead_s

        room = max_ctx - context - observation  # tokens left to generate this turn
        if room < 1:
            stop = StopReason.MAX_CONTEXT
            break
        if response >= room:
            # Generation is cut at the cap; a truncated action is not executed.
            response = room
            kept = min(kept, response)
            turns.append(Turn(observation, response, kept, 0.0))
            stop = StopReason.MAX_CONTEXT
            break
        turns.append(Turn(observation, response, kept, latency))
        context += observation + kept
    else:
        # The last response is the answer/submission: no environment step follows
        # (its evaluation is reward_latency_s).
        turns[-1] = dataclasses.replace(turns[-1], env_latency_s=0.0)
    return Trajectory(
        task_id=task_id,
        index_in_group=index,
        turns=tuple(turns),
        shared_prefix_tokens=profile.shared_prefix_tokens,
        env_setup_s=env_setup_s,
        reward_latency_s=reward_latency_s,
        stop=stop,
        observation_window=window,
        collapsed_observation_tokens=stub,
    )


def generate_batch(
    profile: AgenticProfile,
    num_tasks: int | None = None,
    group_size: int | None = None,
    seed: int = 0,
) -> RolloutBatch:
    """Draw ``num_tasks`` x ``group_size`` trajectories (defaults: the profile's); same seed, same batch.

    Siblings share their task's initial prompt; each samples its own turns. Task ``i``
    and trajectory ``(i, j)`` do not depend on the batch's size.
    """
    num_tasks = profile.num_tasks if num_tasks is None else num_tasks
    group_size = profile.group_size if group_size is None else group_size
    _check(
        _is_int(num_tasks) and num_tasks >= 1, f"num_tasks must be an int >= 1, got {num_tasks!r}"
    )
    _check(
        _is_int(group_size) and group_size >= 1,
        f"group_size must be an int >= 1, got {group_size!r}",
    )
    _check(_is_int(seed) and seed >= 0, f"seed must be an int >= 0, got {seed!r}")
    groups = []
    for i in range(num_tasks):
        task_rng = _rng(seed, i)
        task_id = f"{profile.name}-s{seed}-t{i:04d}"
        image = 0 if profile.image_tokens is None else _tokens(profile.image_tokens, task_rng, 0)
        room = profile.max_prompt_tokens - profile.shared_prefix_tokens - image
        if room < 1:
            raise ConfigError(
                f"AgenticProfile({profile.name}): max_prompt_tokens {profile.max_prompt_tokens} "
                f"leaves no room for a task prompt after the shared prefix "
                f"({profile.shared_prefix_tokens}) and a {image}-token screenshot"
            )
        prompt = (
            profile.shared_prefix_tokens
            + _tokens(profile.task_prompt_tokens, task_rng, 1, room)
            + image
        )
        groups.append(
            TaskGroup(
                task_id,
                tuple(
                    _trajectory(profile, _rng(seed, i, j + 1), task_id, j, prompt, image)
                    for j in range(group_size)
                ),
            )
        )
    return RolloutBatch(tuple(groups), profile.max_context_tokens, profile.name, seed)


# ---------------------------------------------------------------------------
# Summary statistics
# ---------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class BatchSummary:
    """Distribution of a batch's trajectory shapes (means and percentiles over trajectories)."""

    num_trajectories: int
    turns_mean: float
    turns_p50: float
    turns_p90: float
    turns_max: int
    generated_tokens_mean: float
    appended_tokens_mean: float
    prompt_tokens_mean: float
    final_context_mean: float
    final_context_p90: float
    env_time_mean_s: float
    env_time_p50_s: float
    env_time_p90_s: float
    stop_fractions: Mapping[str, float]


def summarize(batch: RolloutBatch | Sequence[Trajectory]) -> BatchSummary:
    """Summary statistics of a batch (or any list of trajectories)."""
    trajs = batch.trajectories if isinstance(batch, RolloutBatch) else tuple(batch)
    if not trajs:
        raise WorkloadError("summarize() needs at least one trajectory")
    turns = np.array([t.num_turns for t in trajs], dtype=float)
    final = np.array([t.final_context_tokens for t in trajs], dtype=float)
    env = np.array([t.env_time_s for t in trajs], dtype=float)
    return BatchSummary(
        num_trajectories=len(trajs),
        turns_mean=float(turns.mean()),
        turns_p50=float(np.percentile(turns, 50)),
        turns_p90=float(np.percentile(turns, 90)),
        turns_max=int(turns.max()),
        generated_tokens_mean=float(np.mean([t.generated_tokens for t in trajs])),
        appended_tokens_mean=float(np.mean([t.appended_tokens for t in trajs])),
        prompt_tokens_mean=float(np.mean([t.prompt_tokens for t in trajs])),
        final_context_mean=float(final.mean()),
        final_context_p90=float(np.percentile(final, 90)),
        env_time_mean_s=float(env.mean()),
        env_time_p50_s=float(np.percentile(env, 50)),
        env_time_p90_s=float(np.percentile(env, 90)),
        stop_fractions={r.value: sum(t.stop is r for t in trajs) / len(trajs) for r in StopReason},
    )


# ---------------------------------------------------------------------------
# Token contents
# ---------------------------------------------------------------------------

_SHARED, _TASK, _OBSERVATION, _RESPONSE = 0, 1, 2, 3


def _task_key(task_id: str) -> int:
    # A stable hash (Python's hash() of a str is salted per process).
    return int.from_bytes(hashlib.blake2b(task_id.encode(), digest_size=8).digest(), "little")


def _ids(n: int, vocab_size: int, first_id: int, entropy: list[int]) -> list[int]:
    if not (_is_int(vocab_size) and _is_int(first_id) and 0 <= first_id < vocab_size):
        raise WorkloadError(
            f"token ids need ints 0 <= first_id < vocab_size, got first_id={first_id!r} "
            f"vocab_size={vocab_size!r}"
        )
    if n == 0:
        return []
    # A keyed walk through one fixed random permutation of the id range: as random-looking
    # as fresh draws, distinct keys give sequences that differ at every position, and a
    # list slice costs ~1/15 of seeding a numpy Generator per call (which was ~10% of a
    # simulated RL run).
    pool = _id_pool(vocab_size, first_id)
    digest = hashlib.blake2b(repr(entropy).encode(), digest_size=8).digest()
    start = int.from_bytes(digest, "little") % len(pool)
    out = pool[start : start + n]
    while len(out) < n:
        out += pool[: n - len(out)]
    return out


@functools.lru_cache(maxsize=4)
def _id_pool(vocab_size: int, first_id: int) -> list[int]:
    return np.random.default_rng(0).permutation(np.arange(first_id, vocab_size)).tolist()


def shared_prefix_token_ids(
    num_tokens: int, vocab_size: int, seed: int = 0, first_id: int = 0
) -> list[int]:
    """The system/tool prefix shared by every task: ``num_tokens`` ids in [first_id, vocab_size)."""
    return _ids(num_tokens, vocab_size, first_id, [seed, _SHARED])


def _turn_index(trajectory: Trajectory, turn_index: int) -> None:
    if not 0 <= turn_index < trajectory.num_turns:
        raise WorkloadError(
            f"turn_index {turn_index} out of range [0, {trajectory.num_turns}) for trajectory "
            f"{trajectory.task_id}/{trajectory.index_in_group}"
        )


def observation_token_ids(
    trajectory: Trajectory, turn_index: int, vocab_size: int, seed: int = 0, first_id: int = 0
) -> list[int]:
    """Token ids of turn ``turn_index``'s observation; turn 0 gives the task's initial prompt.

    Deterministic in (seed, task_id, index_in_group, turn); the prompt depends only on
    (seed, task_id), so siblings share it, and its shared prefix only on ``seed``.
    """
    _turn_index(trajectory, turn_index)
    n = trajectory.turns[turn_index].observation_tokens
    if turn_index == 0:
        shared = trajectory.shared_prefix_tokens
        return shared_prefix_token_ids(shared, vocab_size, seed, first_id) + _ids(
            n - shared, vocab_size, first_id, [seed, _TASK, _task_key(trajectory.task_id)]
        )
    key = [seed, _OBSERVATION, _task_key(trajectory.task_id), trajectory.index_in_group, turn_index]
    return _ids(n, vocab_size, first_id, key)


def response_token_ids(
    trajectory: Trajectory, turn_index: int, vocab_size: int, seed: int = 0, first_id: int = 0
) -> list[int]:
    """Synthetic stand-in ids for turn ``turn_index``'s response (replay without a model)."""
    _turn_index(trajectory, turn_index)
    key = [seed, _RESPONSE, _task_key(trajectory.task_id), trajectory.index_in_group, turn_index]
    return _ids(trajectory.turns[turn_index].response_tokens, vocab_size, first_id, key)


def context_token_ids(
    trajectory: Trajectory,
    turn_index: int,
    vocab_size: int,
    seed: int = 0,
    first_id: int = 0,
    responses: Sequence[Sequence[int]] | None = None,
) -> list[int]:
    """The full prompt of turn ``turn_index``'s generation: observations and kept responses so far.

    ``responses[k]`` are the ids actually generated in turn k (a live run); without them
    :func:`response_token_ids` stand in. Each kept response is its last ``response_tokens_kept`` ids.
    """
    _turn_index(trajectory, turn_index)
    ids: list[int] = []
    for k in range(turn_index + 1):
        if k:
            turn = trajectory.turns[k - 1]
            if responses is not None:
                if len(responses) < k or len(responses[k - 1]) != turn.response_tokens:
                    got = len(responses[k - 1]) if len(responses) >= k else None
                    raise WorkloadError(
                        f"responses[{k - 1}] must hold {turn.response_tokens} ids for trajectory "
                        f"{trajectory.task_id}/{trajectory.index_in_group}, got {got}"
                    )
                previous = list(responses[k - 1])
            else:
                previous = response_token_ids(trajectory, k - 1, vocab_size, seed, first_id)
            ids.extend(previous[len(previous) - turn.response_tokens_kept :])
        observation = observation_token_ids(trajectory, k, vocab_size, seed, first_id)
        ids.extend(observation[: trajectory.observation_shown(k, turn_index)])
    return ids
