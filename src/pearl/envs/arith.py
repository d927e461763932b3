"""A safe arithmetic evaluator: numbers, + - * / // % **, unary minus, parentheses.

The text is parsed with ``ast`` and only those nodes are evaluated, with bounds on length,
depth, exponents and magnitudes; nothing is ever passed to ``eval``. Errors are
``ArithmeticInputError`` with a message a model can read.
"""

from __future__ import annotations

import ast
import math
import re
from fractions import Fraction

MAX_CHARS = 120
MAX_DEPTH = 24
MAX_EXPONENT = 12
MAX_MAGNITUDE = 10**15


class ArithmeticInputError(ValueError):
    """The expression is not plain arithmetic within bounds (message says why)."""


_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}


def evaluate(text: str) -> Fraction:
    """The exact value of the expression ``text`` (``x`` and ``×`` count as ``*``)."""
    expr = text.strip().replace("×", "*").replace("÷", "/").replace("x", "*").replace("^", "**")
    expr = expr.replace(",", "")  # thousands separators
    if not expr:
        raise ArithmeticInputError("the expression is empty")
    if len(expr) > MAX_CHARS:
        raise ArithmeticInputError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise ArithmeticInputError(f"cannot parse {text.strip()!r} as arithmetic") from None
    return _eval(tree.body, 0)


def _eval(node: ast.AST, depth: int) -> Fraction:
    if depth > MAX_DEPTH:
        raise ArithmeticInputError("the expression is nested too deeply")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ArithmeticInputError("numbers must be finite")
        return _bounded(Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise ArithmeticInputError(
                    f"exponents must be whole numbers up to {MAX_EXPONENT} in size"
                )
            if left == 0 and right < 0:
                raise ArithmeticInputError("division by zero")
            return _bounded(left ** int(right))
        op = _BINARY.get(type(node.op))
        if op is None:
            raise ArithmeticInputError("only + - * / // % ** and parentheses are allowed")
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
            raise ArithmeticInputError("division by zero")
        return _bounded(Fraction(op(left, right)))
    raise ArithmeticInputError("only numbers, + - * / // % ** and parentheses are allowed")


def _bounded(value: Fraction) -> Fraction:
    if abs(value) > MAX_MAGNITUDE:
        raise ArithmeticInputError(f"a value exceeds {MAX_MAGNITUDE:.0e} in size")
    return value


def format_number(value: Fraction) -> str:
    """An integer as digits; otherwise a decimal rounded to 6 places."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def parse_number(text: str) -> Fraction | None:
    """A plain number (``-12``, ``3.5``, ``1,234``), or None."""
    cleaned = text.strip().replace(",", "")
    if len(cleaned) > 40 or not _NUMBER.fullmatch(cleaned):
        return None
    value = Fraction(cleaned)
    return value if abs(value) <= MAX_MAGNITUDE else None


_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?")
