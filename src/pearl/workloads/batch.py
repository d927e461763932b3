"""A rollout batch as data: tasks, groups of trajectories (GRPO groups), turns, and the
batch's summary. What the control plane needs of a workload; the generator
(``pearl.workloads.agentic``) and trace files (``pearl.workloads.traces``) make them.

A trajectory is a list of turns; in turn ``k`` the environment appends
``observation_tokens`` to the context (turn 0's observation is the task's initial
prompt), the policy generates ``response_tokens``, and ``response_tokens_kept`` of them
stay in the context of the next turn (all of them unless thinking is stripped); then
the environment works for ``env_latency_s`` before the next observation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from pearl.errors import WorkloadError


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
