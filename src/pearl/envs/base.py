"""The environment API: ``reset(seed)`` gives the first observation, ``step(action)`` answers
an action with an observation, a reward and whether the episode is over.

Environments are text in, text out and never raise on what the model writes: a malformed
action gets an observation that explains the expected format. Seeds pick the task; each
environment splits its seeds into a training and a held-out range, so a success rate on
held-out seeds measures tasks the trainer never saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

Split = Literal["train", "heldout", "train-more"]

# Seeds [0, HELDOUT_START) train; [HELDOUT_START, ...) are held out.
HELDOUT_START = 1_000_000


def split_seed(split: Split, index: int) -> int:
    """The seed of the ``index``-th task of ``split``."""
    if index < 0:
        raise ValueError(f"task index must be >= 0, got {index}")
    if split == "train":
        if index >= HELDOUT_START:
            raise ValueError(f"train task index must be < {HELDOUT_START}, got {index}")
        return index
    if split == "heldout":
        return HELDOUT_START + index
    if split == "train-more":  # dynamic sampling's extra rounds, past the held-out tasks
        return 2 * HELDOUT_START + index
    raise ValueError(f"split must be 'train', 'heldout' or 'train-more', got {split!r}")


@dataclass(slots=True)
class StepResult:
    observation: str
    reward: float
    done: bool
    info: dict = field(default_factory=dict)


class Environment(Protocol):
    """One episode's environment (a fresh instance per trajectory)."""

    name: str
    system_prompt: str
    max_turns: int
    demonstration: tuple[tuple[str, str], ...]
    """Messages ``(role, text)`` shown before the task: a worked example of the format."""

    async def reset(self, seed: int) -> str:
        """Start the task ``seed``; return the first observation (the user's message)."""

    async def step(self, action: str) -> StepResult:
        """Answer the model's ``action`` (its whole reply for the turn)."""

    @property
    def success(self) -> bool:
        """Whether the episode solved the task (for success rates)."""
