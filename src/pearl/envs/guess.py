"""Guess the number: the model guesses ``<guess>N</guess>`` and hears "higher" or "lower".
Reward 1 for finding the number within ``max_turns`` guesses, else 0."""

from __future__ import annotations

import random
import re

from pearl.envs.arith import parse_number
from pearl.envs.base import StepResult

_GUESS = re.compile(r"<guess>(.*?)</guess>", re.DOTALL)


class GuessEnv:
    name = "guess"

    def __init__(self, high: int = 16, max_turns: int = 5):
        if high < 2 or max_turns < 1:
            raise ValueError(f"need high >= 2 and max_turns >= 1, got {high}, {max_turns}")
        self.high = high
        self.max_turns = max_turns
        self.system_prompt = (
            f"Find a secret whole number from 1 to {high}. Reply with one guess as "
            f"<guess>NUMBER</guess>; you will hear whether the secret is higher or lower."
        )
        # A worked example shown before the task (the format, and using the replies).
        self.demonstration = (
            ("user", f"Guess the number from 1 to {high}. You have {max_turns} guesses."),
            ("assistant", f"<guess>{(1 + high) // 2}</guess>"),
            ("user", f"Lower. {max_turns - 1} guesses left."),
            ("assistant", f"<guess>{(1 + high) // 4}</guess>"),
            ("user", "Correct!"),
        )
        self.secret = 0
        self.turns = 0
        self.solved = False

    async def reset(self, seed: int) -> str:
        self.secret = random.Random(f"guess/{self.high}/{seed}").randint(1, self.high)
        self.turns = 0
        self.solved = False
        return f"Guess the number from 1 to {self.high}. You have {self.max_turns} guesses."

    async def step(self, action: str) -> StepResult:
        if not self.secret:
            raise RuntimeError("step() before reset()")
        self.turns += 1
        left = self.max_turns - self.turns
        match = _GUESS.search(action)
        value = parse_number(match.group(1)) if match else None
        if value is None or value.denominator != 1:
            return StepResult(
                f"Reply with one whole number as <guess>NUMBER</guess>. {left} guesses left.",
                0.0,
                left <= 0,
            )
        guess = int(value)
        if guess == self.secret:
            self.solved = True
            return StepResult("Correct!", 1.0, True, {"guess": guess})
        hint = "Higher." if self.secret > guess else "Lower."
        return StepResult(f"{hint} {left} guesses left.", 0.0, left <= 0, {"guess": guess})

    @property
    def success(self) -> bool:
        return self.solved
