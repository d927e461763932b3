"""Dynamic sampling (DAPO, arXiv:2503.14476, section 3.2): train only on groups whose
rewards differ, and roll out more tasks until a step has as many of them as it asked for.

A group whose trajectories all got the same reward has advantage 0 everywhere: it adds
nothing to GRPO's gradient, and a step made of such groups trains on nothing (on the
calculator task most groups tie once it is learned). The pipeline (``pearl.control.
pipeline``) rolls out a step's batch, counts its informative groups, and while it has fewer
than the batch's groups rolls out another round of fresh tasks with the same weights and
router (bounded by ``max_extra_rounds``); the step trains on the first informative groups
up to the batch's count. A round's size follows the informative fraction seen so far, so a
step that lacks 2 groups where half of them tie asks for 4 tasks, not a whole batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pearl.control.agent_loop import TrajectoryResult
from pearl.control.episode import ENV_FAILURES


def informative_groups(trajectories: list[TrajectoryResult]) -> list[str]:
    """The groups, in the order they first appear, whose trained samples' rewards are not
    all equal (samples of environment failures are not trained and do not count)."""
    rewards: dict[str, list[float]] = {}
    for t in trajectories:
        for s in t.samples:
            rewards.setdefault(s.group, [])
            if s.stop_reason not in ENV_FAILURES:
                rewards[s.group].append(s.reward)
    return [g for g, rs in rewards.items() if len(rs) > 1 and max(rs) > min(rs)]


def groups_of(trajectories: list[TrajectoryResult]) -> list[str]:
    seen: dict[str, None] = {}
    for t in trajectories:
        for s in t.samples:
            seen.setdefault(s.group, None)
    return list(seen)


def next_round_tasks(missing: int, informative: int, rolled: int, cap: int) -> int:
    """Tasks to roll out for ``missing`` informative groups when ``informative`` of the
    ``rolled`` groups so far were: ``missing`` over the observed fraction (a quarter when
    none was informative yet), at least ``missing``, at most ``cap``."""
    fraction = informative / rolled if informative else 0.25
    return max(missing, min(cap, math.ceil(missing / fraction)))


@dataclass(slots=True)
class SamplingRecord:
    """What dynamic sampling did for one step (``StepRecord.sampling``)."""

    target: int  # informative groups the step asked for (the batch's groups)
    rounds: int = 0  # extra rounds rolled out
    groups_rolled_out: int = 0
    groups_tied: int = 0
    kept: list[str] = field(default_factory=list)  # the groups trained on, in order

    def row(self) -> dict[str, int]:
        return {
            "groups_rolled_out": self.groups_rolled_out,
            "groups_tied": self.groups_tied,
            "groups_trained": len(self.kept),
            "extra_rounds": self.rounds,
        }
