"""Arithmetic with a calculator tool: the model calls ``<calc>EXPR</calc>``, reads the result,
then answers ``<answer>N</answer>``. Reward 1 for the right answer, ``format_reward`` for a
well-formed wrong one, 0 otherwise. ``max_turns=1`` is the single-turn variant (answer
directly, no tool). ``tool_format="json"`` declares the calculator as a ``calculate``
function instead, called in the model's tool-call format (``pearl.envs.tools``)."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

from pearl.envs.arith import ArithmeticInputError, evaluate, format_number, parse_number
from pearl.envs.base import StepResult
from pearl.envs.tools import tool_response

_CALC = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
CALCULATE = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression (+ - * / and parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 12 * 7"}},
            "required": ["expression"],
        },
    },
}
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

# Operand ranges per difficulty: (lo, hi) of each operand, and the operators drawn.
LEVELS = {
    "easy": ((10, 99), (10, 99), "+-"),
    "medium": ((100, 999), (10, 99), "+-*"),
    "hard": ((100, 9999), (100, 999), "*"),
}


@dataclass(slots=True, frozen=True)
class Problem:
    text: str
    answer: int

    @classmethod
    def of(cls, seed: int, level: str) -> Problem:
        (alo, ahi), (blo, bhi), ops = LEVELS[level]
        rng = random.Random(f"calculator/{level}/{seed}")
        a, b, op = rng.randint(alo, ahi), rng.randint(blo, bhi), rng.choice(ops)
        text = f"{a} {op} {b}"
        return cls(text, int(evaluate(text)))


class CalculatorEnv:
    name = "calculator"

    def __init__(
        self,
        level: str = "medium",
        max_turns: int = 3,
        format_reward: float = 0.1,
        tool_format: str = "tag",
    ):
        if level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if tool_format not in ("tag", "json"):
            raise ValueError(f"tool_format must be 'tag' or 'json', got {tool_format!r}")
        self.tool_format = tool_format
        self.level = level
        self.max_turns = max_turns
        self.format_reward = format_reward
        if max_turns == 1:
            self.system_prompt = (
                "Solve the arithmetic problem. Reply only with the result as "
                "<answer>NUMBER</answer>, for example <answer>84</answer>."
            )
        else:
            self.system_prompt = (
                "You have a calculator. To use it, reply only <calc>EXPRESSION</calc>, for "
                "example <calc>12 * 7</calc>, and you get the result, e.g. Result: 84. Then "
                "reply only <answer>NUMBER</answer>, for example <answer>84</answer>."
            )
        # A worked example shown before the task (small models follow a demonstration far
        # better than a description of the format).
        if tool_format == "json" and max_turns > 1:
            self.tools = [CALCULATE]
            self.system_prompt = (
                "Solve the arithmetic problem. Use the calculate tool, then reply only "
                "<answer>NUMBER</answer>, for example <answer>84</answer>."
            )
        if max_turns == 1:
            self.demonstration = (("user", "What is 12 + 7?"), ("assistant", "<answer>19</answer>"))
        elif tool_format == "json":
            call = {"name": "calculate", "arguments": {"expression": "12 * 7"}}
            self.demonstration = (
                ("user", "What is 12 * 7?"),
                ("assistant", f"<tool_call>\n{json.dumps(call)}\n</tool_call>"),
                ("user", tool_response("84")),
                ("assistant", "<answer>84</answer>"),
            )
        else:
            self.demonstration = (
                ("user", "What is 12 * 7?"),
                ("assistant", "<calc>12 * 7</calc>"),
                ("user", "Result: 84"),
                ("assistant", "<answer>84</answer>"),
            )
        self.problem: Problem | None = None
        self.turns = 0
        self.calls = 0
        self.solved = False

    async def reset(self, seed: int) -> str:
        self.problem = Problem.of(seed, self.level)
        self.turns = self.calls = 0
        self.solved = False
        return f"What is {self.problem.text}?"

    async def step(self, action: str) -> StepResult:
        if self.problem is None:
            raise RuntimeError("step() before reset()")
        self.turns += 1
        last = self.turns >= self.max_turns
        answer = _ANSWER.search(action)
        if answer is not None:
            value = parse_number(answer.group(1))
            if value is None:
                return self._go_on(
                    f"{answer.group(1).strip()[:40]!r} is not a number. Answer with digits only, "
                    f"as <answer>NUMBER</answer>.",
                    last,
                )
            self.solved = value == self.problem.answer
            reward = 1.0 if self.solved else self.format_reward
            return StepResult("", reward, True, {"answer": format_number(value)})
        call = _CALC.search(action) if self.tool_format == "tag" else None
        if call is not None and self.max_turns > 1:
            self.calls += 1
            try:
                result = f"Result: {format_number(evaluate(call.group(1)))}"
            except ArithmeticInputError as exc:
                result = f"Calculator error: {exc}."
            return self._go_on(result, last)
        if self.max_turns == 1:
            hint = "Reply with <answer>NUMBER</answer>."
        elif self.tool_format == "json":
            hint = "Call the calculate tool, or reply with <answer>NUMBER</answer> to answer."
        else:
            hint = (
                "Reply with <calc>EXPRESSION</calc> to use the calculator, or with "
                "<answer>NUMBER</answer> to answer."
            )
        return self._go_on(hint, last)

    async def call_tool(self, name: str, arguments: dict) -> str:
        """The ``calculate`` tool (``tool_format="json"``): a turn, like a ``<calc>`` call."""
        self.turns += 1
        self.calls += 1
        try:
            return format_number(evaluate(str(arguments["expression"])))
        except ArithmeticInputError as exc:
            return f"error: {exc}"

    def _go_on(self, observation: str, last: bool) -> StepResult:
        return StepResult(observation, 0.0, last)

    @property
    def success(self) -> bool:
        return self.solved
