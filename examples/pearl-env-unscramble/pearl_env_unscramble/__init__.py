"""Unscramble a word: an example environment plug-in for PEARL.

The protocol (docs/environments.md): a class whose instances have ``system_prompt``,
optionally ``demonstration`` (worked example messages), ``async reset(seed) -> str`` (the
first user message) and ``async step(action) -> StepResult`` (the reply to the model's
whole turn), and a ``success`` flag. A fresh instance serves one trajectory.
"""

from __future__ import annotations

import random
import re

from pearl.envs.base import HELDOUT_START, StepResult

WORDS = tuple(
    """
    apple bread chair dance eagle flame grape house input juice knife lemon money night ocean
    piano queen river snake table uncle voice water youth zebra plant stone light sound green
    cloud storm beach train mouse horse sugar paper glass shirt clock heart smile tiger salad
    pizza honey candy dream earth
    """.split()
)
TRAIN_WORDS, HELDOUT_WORDS = WORDS[:40], WORDS[40:]
_ANSWER = re.compile(r"<answer>\s*([A-Za-z]+)\s*</answer>")


class UnscrambleEnv:
    name = "unscramble"

    def __init__(self, max_tries: int = 3):
        if max_tries < 1:
            raise ValueError(f"max_tries must be >= 1, got {max_tries}")
        self.max_tries = max_tries
        self.system_prompt = (
            "Unscramble the letters into an English word. Answer as <answer>word</answer>."
        )
        self.demonstration = (
            ("user", "Letters: t a c. You have 2 tries."),
            ("assistant", "<answer>act</answer>"),
            ("user", "Not it: 0 of 3 letters in the right place. 1 try left."),
            ("assistant", "<answer>cat</answer>"),
            ("user", "Correct!"),
        )
        self.word = ""
        self.tries = 0
        self.solved = False

    async def reset(self, seed: int) -> str:
        rng = random.Random(f"unscramble/{seed}")
        words = HELDOUT_WORDS if seed >= HELDOUT_START else TRAIN_WORDS
        self.word = rng.choice(words)
        letters = list(self.word)
        while "".join(letters) == self.word:
            rng.shuffle(letters)
        self.tries, self.solved = 0, False
        return f"Letters: {' '.join(letters)}. You have {self.max_tries} tries."

    async def step(self, action: str) -> StepResult:
        if not self.word:
            raise RuntimeError("step() before reset()")
        self.tries += 1
        left = self.max_tries - self.tries
        match = _ANSWER.search(action)
        if match is None:
            return StepResult(
                f"Answer as <answer>word</answer>. {left} tries left.", 0.0, left <= 0
            )
        guess = match.group(1).lower()
        if guess == self.word:
            self.solved = True
            return StepResult("Correct!", 1.0, True)
        placed = sum(a == b for a, b in zip(guess, self.word, strict=False))
        return StepResult(
            f"Not it: {placed} of {len(self.word)} letters in the right place. {left} tries left.",
            0.0,
            left <= 0,
            {"guess": guess},
        )

    @property
    def success(self) -> bool:
        return self.solved
