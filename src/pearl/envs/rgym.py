"""Any reasoning-gym dataset as a multi-turn task (``env.name=reasoning_gym``).

reasoning-gym (PyPI ``reasoning-gym``) generates verifiable reasoning tasks procedurally
and scores answers with each dataset's own checker. Here the model answers inside
``<answer></answer>``; a wrong answer gets the checker's verdict as feedback and another
try, up to ``max_tries``. The reward is the checker's score (0-1; some datasets give
partial credit) of the answer that ended the episode; success is a full score.

Task ``seed`` is the dataset's item generated from random seed ``seed_offset + seed``:
training seeds (0, 1, ...) and held-out seeds (``HELDOUT_START`` and up) come from disjoint
generator seeds, so no held-out item is one the trainer was given (a small task space may
still produce the same question from two seeds).

The demonstration shows ``shots`` solved items (question, then ``<answer>`` with the
dataset's answer), generated from a third seed range that neither split draws from: small
models follow a shown format far better than a described one.

Options: ``dataset`` (a reasoning-gym name), ``config`` (that dataset's own settings,
e.g. ``{min_terms: 2, max_terms: 3}``), ``max_tries``, ``shots``, ``seed_offset``.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from pearl.envs.base import StepResult
from pearl.errors import ConfigError

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_SIZE = 1 << 31  # items are generated lazily: the size only bounds the index
_SHOTS_FROM = 1 << 30  # demonstration items: far from both splits' seeds


@functools.lru_cache(maxsize=16)
def _dataset(name: str, config_json: str, seed_offset: int) -> Any:
    try:
        import reasoning_gym  # optional
    except ImportError:
        raise ConfigError(
            "env.name=reasoning_gym needs the reasoning-gym package "
            "(pip install 'pearl-rollout[reasoning-gym]' or pip install reasoning-gym)"
        ) from None
    known = sorted(reasoning_gym.factory.DATASETS)
    if name not in known:
        raise ConfigError(
            f"dataset {name!r} is not a reasoning-gym dataset; choose one of: {', '.join(known)}"
        )
    try:
        return reasoning_gym.create_dataset(
            name, seed=seed_offset, size=_SIZE, **json.loads(config_json)
        )
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(f"reasoning-gym dataset {name!r} rejected its config: {exc}") from None


class ReasoningGymEnv:
    name = "reasoning_gym"

    def __init__(
        self,
        dataset: str,
        max_tries: int = 2,
        config: dict[str, Any] | None = None,
        shots: int = 1,
        seed_offset: int = 0,
    ) -> None:
        if max_tries < 1 or not 0 <= shots <= 8:
            raise ValueError(f"need max_tries >= 1 and 0 <= shots <= 8, got {max_tries}, {shots}")
        self.dataset = _dataset(dataset, json.dumps(config or {}, sort_keys=True), seed_offset)
        self.dataset_name = dataset
        self.max_tries = max_tries
        self.system_prompt = (
            "Solve the task. Give your final answer inside <answer></answer>, for example "
            "<answer>42</answer>."
        )
        shown = [self.dataset[_SHOTS_FROM + k] for k in range(shots)]
        self.demonstration = tuple(
            message
            for item in shown
            for message in (
                ("user", str(item["question"])),
                ("assistant", f"<answer>{item['answer']}</answer>"),
            )
        )
        self.entry: dict[str, Any] | None = None
        self.tries = 0
        self.score = 0.0

    async def reset(self, seed: int) -> str:
        self.entry = self.dataset[seed]
        self.tries, self.score = 0, 0.0
        return str(self.entry["question"])

    async def step(self, action: str) -> StepResult:
        if self.entry is None:
            raise RuntimeError("step() before reset()")
        self.tries += 1
        left = self.max_tries - self.tries
        match = _ANSWER.search(action)
        if match is None:
            return StepResult(
                f"No answer found: put your final answer inside <answer></answer>. "
                f"{left} tries left.",
                0.0,
                left <= 0,
            )
        answer = match.group(1).strip()
        self.score = float(self.dataset.score_answer(answer, self.entry))
        if self.score >= 1.0 or left <= 0:
            return StepResult("Correct!" if self.score >= 1.0 else "Wrong.", self.score, True)
        return StepResult(
            f"Not correct (the checker scores it {self.score:.2f} of 1). Try again: "
            f"{left} tries left.",
            0.0,
            False,
            {"answer": answer, "score": self.score},
        )

    @property
    def success(self) -> bool:
        return self.score >= 1.0
