"""A generated suite of SWE-style tasks: small Python repositories with one planted bug each.

``make_task(seed)`` builds, deterministically from the seed, a repository of six files (a
package of two modules, ``tests/``, a README), an issue text, the command that shows the
failure, hidden tests for the reward and the reference fix. Every task comes from a
*domain* (inventory, text statistics, geometry, grades, billing, sensors) holding two
*units* (a public function and the helper it calls, in the package's helper module); one
unit gets the bug, the other stands by, tested and correct. Expected values in all tests
are computed by running the correct code at generation time, and a task is only emitted
when the bug fails at least one visible and one hidden test, so every task is solvable
(``tests/envs/test_swe_tasks.py`` applies each fix and runs the real commands).

Tiers (``tier=None`` draws one from the seed with weights 30/30/25/15 %):

- 0: the issue names the file, the function, the wrong text and the right text; one
  ``sed -i 's/WRONG/RIGHT/' PATH`` fixes it. Kinds: wrong_constant, off_by_one,
  wrong_operator, inverted_condition, missing_normalization, wrong_rounding, ...
- 1: the issue gives a failing call (got / expected) and the function's name; the bug is
  in that function. Same kinds, plus ones whose text needs escaping in sed.
- 2: the issue gives a failing call only; the bug is in the helper module the public
  function calls (swapped_operands, wrong_index, wrong_function, ...).
- 3: two related bugs (``two_bugs``: one in the function, one in its helper; the issue
  gives one failing call for each) or a missing branch (``missing_case``: a guard or a
  case the function should handle is absent).

Why tier 0 is within reach of SmolLM2-135M (judged, not measured): the whole solution is
``sed -i 's/<wrong>/<right>/' <path>`` then the submit echo, where ``<wrong>``, ``<right>``
and ``<path>`` are each copied verbatim from one line of the issue into a fixed template
that the demonstration can show. Copying a span from the context is the first skill small
causal LMs acquire (induction heads), far below reading code or reasoning about a
failure. Tier-0 snippets are restricted to characters with no meaning to sed's pattern or
the shell (no ``/ \\ & * [ ] ^ $ '``) and occur once in their file, so the verbatim copy is
a correct command; the tests run that exact sed for every tier-0 task checked.

Reward (``score_outcomes`` of each hidden test's outcome, as ``pearl.envs.swe`` scores a
tree; ``score`` reads the same from ``hidden_test_command``'s output): hidden tests are named
``test_issue_<i>`` (they fail on the untouched repository) or ``test_guard_<i>`` (they pass
on it). reward = (issue tests passing) / (issue tests), and 0 if any guard fails, the run
crashed or timed out. So an untouched repository scores 0, fixing one of two bugs earns
partial credit, breaking working code earns nothing, and the reference fix scores 1.0;
``solved`` = every hidden test passes and the command exited 0.

Held-out tasks are not copies of training tasks: for every drawn name (package, module,
function, helper) and every constant, training seeds draw from the even-indexed entries of
a pool (even integers of a range) and held-out seeds (``HELDOUT_START <= seed <
2 * HELDOUT_START``) from the odd ones. Test inputs are drawn freely.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from string import Template

from pearl.envs.base import HELDOUT_START

TIERS = (0, 1, 2, 3)
TIER_WEIGHTS = (30, 30, 25, 15)
VISIBLE_TARGET_CASES = 3
HIDDEN_TARGET_CASES = 5
HIDDEN_BYSTANDER_CASES = 2
SED_SAFE = re.compile(r"[A-Za-z0-9_ =<>+\-.,():!\"]+")


@dataclass(slots=True, frozen=True)
class SweTask:
    """One repository with a planted bug, its issue, and how it is scored."""

    seed: int
    tier: int
    kind: str
    files: dict[str, str]
    issue: str
    visible_test: str
    hidden_tests: dict[str, str]
    hidden_test_command: str
    fix: dict[str, str]


@dataclass(slots=True, frozen=True)
class SweScore:
    """The reward of a final tree: ``passed`` of ``total`` hidden tests ran green."""

    reward: float
    passed: int
    total: int
    solved: bool


def make_task(seed: int, tier: int | None = None) -> SweTask:
    """The task of ``seed`` (deterministic); ``tier=None`` draws the tier from the seed."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if tier is not None and tier not in TIERS:
        raise ValueError(f"tier must be one of {TIERS} or None, got {tier}")
    rng = random.Random(seed)
    drawn_tier = rng.choices(TIERS, weights=TIER_WEIGHTS)[0]
    draw = _Draw(rng, heldout=HELDOUT_START <= seed < 2 * HELDOUT_START)
    for _ in range(64):  # a draw whose cases cannot show the bug is redrawn
        task = _try_task(seed, drawn_tier if tier is None else tier, draw)
        if task is not None:
            return task
    raise RuntimeError(f"no valid task for seed {seed} after 64 draws")


def repository(task: SweTask, *, hidden: bool = False, fixed: bool = False) -> dict[str, str]:
    """The task's files, with the hidden tests added and/or the reference fix applied."""
    files = dict(task.files)
    if fixed:
        files.update(task.fix)
    if hidden:
        files.update(task.hidden_tests)
    return files


_RAN = re.compile(r"^Ran (\d+) tests? in ", re.M)
_VERDICT = re.compile(r"^(OK|FAILED)(?: \(([^)]*)\))?[ \t]*$", re.M)
_FAILED_TEST = re.compile(r"^(?:FAIL|ERROR): (test_\w+) ", re.M)
_LISTED_TEST = re.compile(r"\b(test_(?:issue|guard)_\d+) \(")
_NOT_PASSED = ("failures", "errors", "skipped", "unexpected successes")


def score(output: str, returncode: int | None) -> SweScore:
    """Reward from the hidden-test command's combined output (``returncode`` None: timed out).

    reward = passing ``test_issue_*`` / all ``test_issue_*``, or 0 when a ``test_guard_*``
    fails, the run did not list the generated tests (crash, import error) or timed out.
    """
    ran, verdicts = _RAN.findall(output), _VERDICT.findall(output)
    if returncode is None or not ran or not verdicts:
        return SweScore(0.0, 0, 0, False)
    total = int(ran[-1])
    verdict, detail = verdicts[-1]
    counts = {key.strip(): int(value) for key, value in re.findall(r"([a-z ]+)=(\d+)", detail)}
    passed = max(total - sum(counts.get(key, 0) for key in _NOT_PASSED), 0)
    listed = set(_LISTED_TEST.findall(output))
    failed = set(_FAILED_TEST.findall(output))
    issue_tests = {name for name in listed if name.startswith("test_issue_")}
    clean_run = len(listed) == total > 0 and (returncode == 0) == (verdict == "OK")
    if not clean_run or not issue_tests or any(n.startswith("test_guard_") for n in failed):
        return SweScore(0.0, passed, total, False)
    reward = len(issue_tests - failed) / len(issue_tests)
    return SweScore(reward, passed, total, returncode == 0 and passed == total)


def hidden_test_names(task: SweTask) -> list[str]:
    """The hidden tests' method names (``test_issue_<i>``, ``test_guard_<i>``), read from
    their files: what a scoring run must report, each one."""
    names: list[str] = []
    for text in task.hidden_tests.values():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names.append(node.name)
    return names


def score_outcomes(outcomes: Mapping[str, bool], expected: list[str]) -> SweScore:
    """The reward of per-test outcomes (``name -> passed``) against the ``expected`` names:
    a name that did not report counts as failed, so a run that stops early (or prints its
    own report) earns nothing it did not pass. Same rule as ``score``."""
    passed = [name for name in expected if outcomes.get(name) is True]
    issue = [name for name in expected if name.startswith("test_issue_")]
    guards_hold = all(outcomes.get(n) is True for n in expected if n.startswith("test_guard_"))
    if not issue or not guards_hold:
        return SweScore(0.0, len(passed), len(expected), False)
    reward = sum(outcomes.get(name) is True for name in issue) / len(issue)
    return SweScore(reward, len(passed), len(expected), len(passed) == len(expected))


# --- drawing names and constants, split by seed range ---------------------------------------


class _Draw:
    """Random draws where names and constants come from split-disjoint halves of a pool."""

    def __init__(self, rng: random.Random, heldout: bool) -> None:
        self.rng = rng
        self.parity = 1 if heldout else 0

    def name(self, pool: str) -> str:
        """One of the space-separated names of ``pool``, from this split's half."""
        return self.rng.choice(pool.split()[self.parity :: 2])

    def integer(self, low: int, high: int) -> int:
        return self.rng.choice([v for v in range(low, high + 1) if v % 2 == self.parity])

    def other(self, value: int, low: int, high: int) -> int:
        """A wrong value near ``value`` (any split: it only appears as the bug)."""
        return self.rng.choice([v for v in range(low, high + 1) if v != value])


# --- units: a public function, its helper, their bugs and test inputs -----------------------


@dataclass(slots=True, frozen=True)
class _Bug:
    kind: str
    where: str  # "main" (the public function's module) or "helper"
    fixed: str
    buggy: str


@dataclass(slots=True, frozen=True)
class _Unit:
    function: str
    helper: str
    main_constants: str
    main: str
    helper_constants: str
    helper_source: str
    readme: str
    bugs: tuple[_Bug, ...]
    cases: tuple[str, ...]


def _unit(
    names: dict[str, object],
    main: str,
    helper: str,
    readme: str,
    bugs: list[tuple[str, str, str, str]],
    cases: list[str],
    main_constants: str = "",
    helper_constants: str = "",
) -> _Unit:
    sub = {k: str(v) for k, v in names.items()}

    def fill(text: str) -> str:
        return Template(text).substitute(sub)

    return _Unit(
        function=sub["fn"],
        helper=sub["helper"],
        main_constants=fill(main_constants),
        main=fill(main),
        helper_constants=fill(helper_constants),
        helper_source=fill(helper),
        readme=fill(readme),
        bugs=tuple(
            _Bug(kind, where, fill(fixed), fill(buggy)) for kind, where, fixed, buggy in bugs
        ),
        cases=tuple(dict.fromkeys(cases)),
    )


def _reorder(d: _Draw) -> _Unit:
    batch = d.integer(4, 13)
    names = {
        "fn": d.name(
            "reorder_amount units_to_order restock_quantity order_quantity refill_amount top_up_quantity"
        ),
        "helper": d.name("_shortfall _missing_units _gap _deficit"),
        "C": d.name("PACK_SIZE CASE_SIZE BATCH_SIZE CRATE_SIZE"),
        "batch": batch,
        "bad": d.other(batch, 3, 14),
    }
    main = '''
def $fn(level, target):
    """Units to order so stock goes from `level` to at least `target`, in whole packs of $C."""
    if target < 0:
        raise ValueError(f"target must be >= 0, got {target}")
    missing = $helper(level, target)
    packs = (missing + $C - 1) // $C
    return packs * $C
'''
    helper = '''
def $helper(level, target):
    """How many units `level` is below `target` (0 when it is not below)."""
    return max(target - level, 0)
'''
    bugs = [
        ("wrong_constant", "main", "$C = $batch", "$C = $bad"),
        ("off_by_one", "main", "missing + $C - 1)", "missing + $C)"),
        ("off_by_one", "main", "return packs * $C", "return (packs + 1) * $C"),
        ("swapped_operands", "helper", "target - level", "level - target"),
        ("wrong_constant", "helper", "max(target - level, 0)", "max(target - level, 1)"),
        (
            "missing_case",
            "main",
            '    if target < 0:\n        raise ValueError(f"target must be >= 0, got {target}")\n',
            "",
        ),
    ]
    rng = d.rng
    cases = [f"{rng.randint(0, 50)}, {rng.randint(0, 80)}" for _ in range(8)]
    t = rng.randint(batch, 60)
    cases += [
        f"{t}, {t}",
        f"{t - 1}, {t}",
        f"0, {batch}",
        f"0, {batch + 1}",
        f"3, {-rng.randint(1, 9)}",
        f"{rng.randint(0, 20)}, {-rng.randint(10, 30)}",
        f"{t + 5}, {t}",
        f"0, {rng.randint(1, batch - 1)}",
    ]
    return _unit(
        names,
        main,
        helper,
        "- `$fn(level, target)`: units to order to reach `target`, in packs of $batch.",
        bugs,
        cases,
        main_constants="$C = $batch\n",
    )


def _stock_value(d: _Draw) -> _Unit:
    bulk = d.integer(8, 25)
    discount = d.integer(5, 25)
    names = {
        "fn": d.name(
            "stock_value inventory_value total_value holding_value shelf_value warehouse_value"
        ),
        "helper": d.name("_line_value _priced_line _line_worth _value_of_line"),
        "bulk": bulk,
        "disc": discount / 100,
        "bad": d.other(discount, 1, 30) / 100,
    }
    main = '''
def $fn(items):
    """Total value of `items`, (quantity, unit_price) pairs, with bulk discounts, to cents."""
    total = 0.0
    for qty, price in items:
        if qty < 0:
            raise ValueError(f"negative quantity: {qty}")
        total += $helper(qty, price)
    return round(total, 2)
'''
    helper = '''
def $helper(qty, price):
    """Value of one line, `qty * price`, less BULK_DISCOUNT once `qty` reaches BULK_QTY."""
    value = qty * price
    if qty >= BULK_QTY:
        value = value * (1 - BULK_DISCOUNT)
    return value
'''
    bugs = [
        ("wrong_operator", "main", "total += $helper", "total = $helper"),
        ("off_by_one", "main", "in items:", "in items[1:]:"),
        ("off_by_one", "helper", "qty >= BULK_QTY", "qty > BULK_QTY"),
        ("wrong_operator", "helper", "(1 - BULK_DISCOUNT)", "(1 + BULK_DISCOUNT)"),
        ("wrong_constant", "helper", "BULK_DISCOUNT = $disc", "BULK_DISCOUNT = $bad"),
        (
            "missing_case",
            "main",
            '        if qty < 0:\n            raise ValueError(f"negative quantity: {qty}")\n',
            "",
        ),
    ]
    return _unit(
        names,
        main,
        helper,
        "- `$fn(items)`: value of (quantity, price) pairs; $bulk+ units get $disc off.",
        bugs,
        _stock_value_cases(d.rng, bulk),
        helper_constants="BULK_QTY = $bulk\nBULK_DISCOUNT = $disc\n",
    )


def _stock_value_cases(rng: random.Random, bulk: int) -> list[str]:
    """Random item lists, then the edges: no items, either side of ``bulk``, negatives."""
    prices = (0.5, 1.25, 2.0, 3.75, 4.5, 10.0, 12.5)

    def items(n: int) -> str:
        return repr([(rng.randint(0, 30), rng.choice(prices)) for _ in range(n)])

    cases = [items(rng.randint(1, 4)) for _ in range(8)]
    return cases + [
        "[]",
        repr([(bulk, 2.0)]),
        repr([(bulk - 1, 2.0)]),
        repr([(3, 1.0), (-2, 1.0)]),
        repr([(-1, 2.5)]),
        repr([(1, 4.0), (bulk + 2, 1.25)]),
    ]


_WORDS = (
    "river",
    "stone",
    "a",
    "bright",
    "owl",
    "sings",
    "at",
    "dawn",
    "the",
    "lantern",
    "glows",
    "quietly",
    "in",
    "fog",
    "maps",
    "fold",
    "we",
    "walk",
    "north",
    "old",
    "bridge",
)


def _sentence(rng: random.Random, words: tuple[str, ...] = _WORDS) -> str:
    picked = [rng.choice(words) for _ in range(rng.randint(2, 7))]
    if rng.random() < 0.5:
        picked[0] = picked[0].capitalize()
    return " ".join(picked) + rng.choice((".", "!", "?", ",", ""))


def _word_length(d: _Draw) -> _Unit:
    names = {
        "fn": d.name(
            "average_word_length mean_word_length avg_word_length word_length_mean typical_word_length mean_token_length"
        ),
        "helper": d.name("_words _tokens _split_words _clean_words"),
    }
    main = '''
def $fn(text):
    """Mean length of the words in `text`, to 2 decimals (0.0 for a text without words)."""
    words = $helper(text)
    if not words:
        return 0.0
    return round(sum(len(w) for w in words) / len(words), 2)
'''
    helper = '''
def $helper(text):
    """The words of `text`: split on whitespace, outer PUNCTUATION stripped, empties dropped."""
    words = [w.strip(PUNCTUATION) for w in text.split()]
    return [w for w in words if w]
'''
    bugs = [
        ("off_by_one", "main", "len(w) for w", "len(w) + 1 for w"),
        ("off_by_one", "main", "/ len(words), 2)", "/ (len(words) + 1), 2)"),
        ("missing_normalization", "helper", "w.strip(PUNCTUATION) for w", "w for w"),
        ("wrong_argument", "helper", "text.split()", 'text.split(" ")'),
        ("wrong_constant", "helper", 'PUNCTUATION = ".,;:!?"', 'PUNCTUATION = ".,"'),
        ("missing_case", "main", "    if not words:\n        return 0.0\n", ""),
    ]
    rng = d.rng
    cases = [repr(_sentence(rng)) for _ in range(7)]
    cases += [
        repr(""),
        repr("!!! ?"),
        repr("... ;"),
        repr("one\ttwo\nthree"),
        repr("Hello, world!"),
        repr("wait; what? fine:"),
        repr(_sentence(rng) + "  " + _sentence(rng)),
    ]
    return _unit(
        names,
        main,
        helper,
        "- `$fn(text)`: mean word length, punctuation excluded; 0.0 without words.",
        bugs,
        cases,
        helper_constants='PUNCTUATION = ".,;:!?"\n',
    )


def _top_words(d: _Draw) -> _Unit:
    n = d.integer(2, 5)
    names = {
        "fn": d.name(
            "top_words most_common_words frequent_words leading_words popular_words commonest_words"
        ),
        "helper": d.name("_tally _count_words _frequencies _word_counts"),
        "n": n,
        "bad": d.other(n, 1, 6),
    }
    main = '''
def $fn(text, n=$n):
    """The `n` most frequent words of `text` (lower-case), most frequent first, ties a-z."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    counts = $helper(text.split())
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [word for word, _ in ranked[:n]]
'''
    helper = '''
def $helper(words):
    """Occurrences of each word, case-insensitively (keys are lower-case)."""
    counts = {}
    for word in words:
        key = word.lower()
        counts[key] = counts.get(key, 0) + 1
    return counts
'''
    bugs = [
        ("wrong_constant", "main", "n=$n)", "n=$bad)"),
        ("wrong_sign", "main", "(-item[1], item[0])", "(item[1], item[0])"),
        ("off_by_one", "main", "ranked[:n]", "ranked[:n - 1]"),
        ("missing_normalization", "helper", "key = word.lower()", "key = word"),
        ("wrong_constant", "helper", "counts.get(key, 0) + 1", "counts.get(key, 1) + 1"),
        (
            "missing_case",
            "main",
            '    if n < 0:\n        raise ValueError(f"n must be >= 0, got {n}")\n',
            "",
        ),
    ]
    return _unit(
        names,
        main,
        helper,
        "- `$fn(text, n=$n)`: the n commonest words (case-insensitive), ties a-z.",
        bugs,
        _top_words_cases(d.rng),
    )


def _top_words_cases(rng: random.Random) -> list[str]:
    """Random texts with mixed case, with and without ``n``, then ties, zero and negative n."""
    vocab = ("red", "blue", "Red", "green", "tea", "Tea", "sky", "blue", "red")

    def text() -> str:
        return " ".join(rng.choice(vocab) for _ in range(rng.randint(3, 10)))

    cases = [repr(text()) for _ in range(5)]
    cases += [f"{text()!r}, {rng.randint(1, 4)}" for _ in range(5)]
    return cases + [
        repr("b a c b a d"),
        "'x y z', 0",
        "'a b a', -2",
        f"{text()!r}, -1",
        repr("Moon moon sun"),
    ]


def _polygon(rng: random.Random, size: int) -> str:
    return repr([(rng.randint(-5, 9), rng.randint(-5, 9)) for _ in range(size)])


def _perimeter(d: _Draw) -> _Unit:
    names = {
        "fn": d.name(
            "perimeter polygon_perimeter outline_length boundary_length fence_length edge_total"
        ),
        "helper": d.name("_distance _edge_length _span _gap_between"),
    }
    main = '''
def $fn(points):
    """Length of the closed polygon through `points`, to 3 decimals (needs 3+ points)."""
    if len(points) < 3:
        raise ValueError(f"a polygon needs at least 3 points, got {len(points)}")
    total = 0.0
    for i in range(len(points)):
        total += $helper(points[i], points[(i + 1) % len(points)])
    return round(total, 3)
'''
    helper = '''
def $helper(a, b):
    """Euclidean distance between points `a` and `b`, (x, y) pairs."""
    return math.hypot(b[0] - a[0], b[1] - a[1])
'''
    bugs = [
        ("off_by_one", "main", "range(len(points))", "range(len(points) - 1)"),
        ("wrong_rounding", "main", "round(total, 3)", "round(total, 1)"),
        ("wrong_operator", "main", "total += $helper", "total = $helper"),
        ("wrong_index", "helper", "b[1] - a[1]", "b[1] - a[0]"),
        ("wrong_operator", "helper", "b[0] - a[0]", "b[0] + a[0]"),
        (
            "missing_case",
            "main",
            '    if len(points) < 3:\n        raise ValueError(f"a polygon needs at least 3 points, '
            'got {len(points)}")\n',
            "",
        ),
    ]
    rng = d.rng
    cases = [_polygon(rng, rng.randint(3, 5)) for _ in range(9)]
    cases += [
        "[(0, 0), (3, 0), (3, 4)]",
        "[(0, 0), (1, 1)]",
        "[(2, 3)]",
        "[(1, 2), (4, 6), (1, 6)]",
        "[(0.5, 0.5), (2.25, 0.5), (2.25, 1.75)]",
    ]
    return _unit(
        names,
        main,
        helper,
        "- `$fn(points)`: perimeter of a closed polygon (3+ points), to 3 decimals.",
        bugs,
        cases,
    )


def _area(d: _Draw) -> _Unit:
    names = {
        "fn": d.name(
            "polygon_area enclosed_area shoelace_area region_area plot_area footprint_area"
        ),
        "helper": d.name("_cross _wedge _cross_term _twice_triangle"),
    }
    main = '''
def $fn(points):
    """Area enclosed by the polygon through `points` (either orientation), to 3 decimals."""
    if len(points) <= 2:
        return 0.0
    total = 0.0
    for a, b in zip(points, points[1:] + points[:1]):
        total += $helper(a, b)
    half = abs(total) / 2
    return round(half, 3)
'''
    helper = '''
def $helper(a, b):
    """Cross product a.x * b.y - b.x * a.y: twice the signed area of triangle (0, a, b)."""
    return a[0] * b[1] - b[0] * a[1]
'''
    bugs = [
        ("wrong_rounding", "main", "round(half, 3)", "round(half)"),
        ("off_by_one", "main", "if len(points) <= 2:", "if len(points) <= 3:"),
        ("missing_abs", "main", "abs(total) / 2", "total / 2"),
        ("off_by_one", "main", "points[1:] + points[:1]", "points[1:]"),
        ("wrong_operator", "helper", "- b[0] * a[1]", "+ b[0] * a[1]"),
        ("wrong_index", "helper", "a[0] * b[1]", "a[0] * b[0]"),
    ]
    rng = d.rng
    cases = [_polygon(rng, rng.randint(3, 5)) for _ in range(9)]
    cases += [
        "[(0, 0), (4, 0), (4, 3)]",
        "[(0, 0), (0, 3), (4, 0)]",
        "[(1, 1), (2, 2)]",
        "[(0.5, 0), (2, 0), (2, 1.5)]",
        "[(0, 0), (2, 0), (2, 2), (0, 2)]",
    ]
    return _unit(
        names,
        main,
        helper,
        "- `$fn(points)`: area of a polygon in either orientation, to 3 decimals.",
        bugs,
        cases,
    )


def _weighted(d: _Draw) -> _Unit:
    names = {
        "fn": d.name(
            "weighted_average final_score course_score weighted_mark term_score combined_mark"
        ),
        "helper": d.name("_weighted_total _dot _weighted_sum _sum_of_products"),
    }
    main = '''
def $fn(marks, weights):
    """Weighted mean of `marks` (weights need not sum to 1), to 1 decimal."""
    if len(marks) != len(weights):
        raise ValueError(f"{len(marks)} marks but {len(weights)} weights")
    total_weight = sum(weights)
    if total_weight == 0:
        return 0.0
    return round($helper(marks, weights) / total_weight, 1)
'''
    helper = '''
def $helper(marks, weights):
    """Sum of each mark times its weight."""
    return sum(m * w for m, w in zip(marks, weights))
'''
    bugs = [
        ("wrong_function", "main", "total_weight = sum(weights)", "total_weight = len(weights)"),
        ("wrong_rounding", "main", "total_weight, 1)", "total_weight)"),
        ("wrong_operator", "helper", "m * w", "m + w"),
        ("off_by_one", "helper", "zip(marks, weights)", "zip(marks, weights[1:])"),
        (
            "missing_case",
            "main",
            '    if len(marks) != len(weights):\n        raise ValueError(f"{len(marks)} marks but '
            '{len(weights)} weights")\n',
            "",
        ),
    ]
    rng = d.rng
    cases = []
    for _ in range(9):
        k = rng.randint(1, 4)
        cases.append(
            f"{[rng.randint(40, 100) for _ in range(k)]}, {[rng.randint(1, 5) for _ in range(k)]}"
        )
    cases += [
        "[90, 60], [1, 2]",
        "[70, 80, 90], [1, 1]",
        "[55], [0]",
        "[80, 90], [1]",
        "[70], [2, 3]",
        "[88, 73], [3, 1]",
    ]
    return _unit(
        names,
        main,
        helper,
        "- `$fn(marks, weights)`: weighted mean of marks, to 1 decimal.",
        bugs,
        cases,
    )


def _letter(d: _Draw) -> _Unit:
    a = d.integer(86, 95)
    b = a - d.integer(8, 12)
    c = b - d.integer(8, 12)
    names = {
        "fn": d.name("letter_grade grade_for to_letter letter_for_score band_of score_letter"),
        "helper": d.name("_round_half_up _nearest_whole _to_whole _whole_points"),
        "a": a,
        "b": b,
        "c": c,
        "bad": d.other(b, b - 4, b + 4),
    }
    main = '''
def $fn(score):
    """Letter for a 0-100 `score`, rounded to a whole number first (A, B, C or F)."""
    if not 0 <= score <= 100:
        raise ValueError(f"score must be within 0-100, got {score}")
    whole = $helper(score)
    if whole >= A_FROM:
        return "A"
    if whole >= B_FROM:
        return "B"
    if whole >= C_FROM:
        return "C"
    return "F"
'''
    helper = '''
def $helper(score):
    """`score` rounded to a whole number, halves going up (89.5 -> 90)."""
    return int(math.floor(score + 0.5))
'''
    bugs = [
        ("off_by_one", "main", "whole >= B_FROM", "whole > B_FROM"),
        ("wrong_constant", "main", "B_FROM = $b", "B_FROM = $bad"),
        ("wrong_operator", "main", "whole >= C_FROM", "whole <= C_FROM"),
        ("wrong_rounding", "helper", "math.floor(score + 0.5)", "math.floor(score)"),
        ("wrong_function", "helper", "math.floor(score + 0.5)", "math.ceil(score + 0.5)"),
        (
            "missing_case",
            "main",
            '    if not 0 <= score <= 100:\n        raise ValueError(f"score must be within 0-100, got '
            '{score}")\n',
            "",
        ),
    ]
    rng = d.rng
    cases = [str(rng.randint(0, 100)) for _ in range(5)]
    cases += [str(x) for x in (a, b, b - 1, b - 0.5, b - 0.6, c, c - 1, a - 0.5, 101, -3)]
    cases += [str(rng.choice((b, c)) + rng.choice((1, 2, 3))), str(round(rng.uniform(c, a), 1))]
    return _unit(
        names,
        main,
        helper,
        "- `$fn(score)`: A from $a, B from $b, C from $c, else F (score rounded half up).",
        bugs,
        cases,
        main_constants="A_FROM = $a\nB_FROM = $b\nC_FROM = $c\n",
    )


def _shipping(d: _Draw) -> _Unit:
    base = d.integer(3, 12)
    names = {
        "fn": d.name("shipping_cost delivery_fee postage parcel_price freight_charge courier_fee"),
        "helper": d.name("_weight_charge _overweight_fee _kilo_charge _weight_surcharge"),
        "base": base,
        "bad": d.other(base, 2, 13),
        "free": d.integer(1, 4),
        "per": d.integer(2, 9),
        "factor": d.name("1.5 1.25 2.0 1.75 2.5 2.25"),
    }
    main = '''
def $fn(weight_kg, express=False):
    """Cost to ship a parcel of `weight_kg`; express multiplies it by EXPRESS_FACTOR."""
    if weight_kg <= 0:
        raise ValueError(f"weight must be positive, got {weight_kg}")
    cost = BASE_FEE + $helper(weight_kg)
    if express:
        cost = cost * EXPRESS_FACTOR
    return round(cost, 2)
'''
    helper = '''
def $helper(weight_kg):
    """PER_KG for each started kilogram above FREE_KG."""
    extra = math.ceil(weight_kg) - FREE_KG
    return max(extra, 0) * PER_KG
'''
    bugs = [
        ("wrong_constant", "main", "BASE_FEE = $base", "BASE_FEE = $bad"),
        ("inverted_condition", "main", "if express:", "if not express:"),
        ("wrong_operator", "main", "cost * EXPRESS_FACTOR", "cost + EXPRESS_FACTOR"),
        ("wrong_function", "helper", "math.ceil(weight_kg)", "int(weight_kg)"),
        ("wrong_constant", "helper", "max(extra, 0)", "max(extra, 1)"),
        (
            "missing_case",
            "main",
            '    if weight_kg <= 0:\n        raise ValueError(f"weight must be positive, got '
            '{weight_kg}")\n',
            "",
        ),
    ]
    rng = d.rng
    weights = (0.5, 1.0, 1.2, 2.0, 2.7, 3.0, 4.4, 6.0, 7.5, 9.1)
    cases = [f"{rng.choice(weights)}, {rng.random() < 0.5}" for _ in range(8)]
    cases += [str(rng.choice(weights)) for _ in range(3)]
    free = int(names["free"])
    cases += ["0", "-1.5", f"{free}", f"{free + 0.1}", f"{free + 2.5}, True", "0.3"]
    return _unit(
        names,
        main,
        helper,
        "- `$fn(weight_kg, express=False)`: $base + $per per started kg over $free; "
        "express x$factor.",
        bugs,
        cases,
        main_constants="BASE_FEE = $base\nEXPRESS_FACTOR = $factor\n",
        helper_constants="FREE_KG = $free\nPER_KG = $per\n",
    )


def _invoice(d: _Draw) -> _Unit:
    tax = d.integer(5, 25)
    names = {
        "fn": d.name("invoice_total amount_due bill_total order_total checkout_total grand_total"),
        "helper": d.name("_subtotal _lines_total _sum_lines _gross"),
        "tax": tax / 100,
        "bad": d.other(tax, 1, 30) / 100,
    }
    main = '''
def $fn(lines, coupon=0.0):
    """Total due for `lines` less `coupon`, plus TAX_RATE, to cents; never negative."""
    if coupon < 0:
        raise ValueError(f"coupon must be >= 0, got {coupon}")
    net = $helper(lines) - coupon
    net = max(net, 0.0)
    return round(net * (1 + TAX_RATE), 2)
'''
    helper = '''
def $helper(lines):
    """Sum of quantity * unit_price over `lines`, (quantity, unit_price) pairs."""
    return sum(qty * price for qty, price in lines)
'''
    bugs = [
        ("wrong_operator", "main", "(1 + TAX_RATE)", "(1 - TAX_RATE)"),
        ("wrong_operator", "main", "lines) - coupon", "lines) + coupon"),
        ("wrong_constant", "main", "TAX_RATE = $tax", "TAX_RATE = $bad"),
        ("wrong_operator", "helper", "qty * price", "qty + price"),
        ("wrong_function", "helper", "sum(qty", "max(qty"),
        ("missing_case", "main", "    net = max(net, 0.0)\n", ""),
        (
            "missing_case",
            "main",
            '    if coupon < 0:\n        raise ValueError(f"coupon must be >= 0, got {coupon}")\n',
            "",
        ),
    ]
    return _unit(
        names,
        main,
        helper,
        "- `$fn(lines, coupon=0.0)`: subtotal less coupon, plus $tax tax; never below 0.",
        bugs,
        _invoice_cases(d.rng),
        main_constants="TAX_RATE = $tax\n",
    )


def _invoice_cases(rng: random.Random) -> list[str]:
    """Random orders with and without a coupon, then empty, excess, exact and negative ones."""
    prices = (1.0, 2.5, 4.0, 9.99, 0.75, 20.0)

    def lines(n: int) -> str:
        return repr([(rng.randint(1, 6), rng.choice(prices)) for _ in range(n)])

    cases = [lines(rng.randint(1, 3)) for _ in range(5)]
    cases += [f"{lines(rng.randint(1, 3))}, {rng.choice((1.0, 2.5, 5.0))}" for _ in range(4)]
    return cases + [
        "[]",
        "[(1, 3.0)], 10.0",
        "[(2, 5.0), (1, 1.0)], -1.0",
        "[(1, 1.0)], -0.5",
        "[], 1.0",
        "[(2, 1.0)], 5.0",
        "[(3, 2.0)], 6.0",
    ]


def _temperature(d: _Draw) -> _Unit:
    names = {
        "fn": d.name(
            "convert_temperature to_other_scale convert_reading flip_scale translate_temperature other_scale"
        ),
        "helper": d.name("_to_fahrenheit _c_to_f _celsius_to_fahrenheit _as_fahrenheit"),
    }
    main = '''
def $fn(value, unit):
    """`value` in the other scale: unit "C" gives Fahrenheit, "F" gives Celsius; 1 decimal."""
    unit = unit.upper()
    if unit == "C":
        return round($helper(value), 1)
    if unit == "F":
        return round((value - 32) * 5 / 9, 1)
    raise ValueError(f"unit must be C or F, got {unit}")
'''
    helper = '''
def $helper(celsius):
    """Degrees Fahrenheit for `celsius` degrees Celsius."""
    return celsius * 9 / 5 + 32
'''
    bugs = [
        ("missing_normalization", "main", "unit = unit.upper()", "unit = unit"),
        ("wrong_rounding", "main", "round($helper(value), 1)", "round($helper(value))"),
        ("missing_parentheses", "main", "(value - 32) * 5 / 9", "value - 32 * 5 / 9"),
        ("wrong_operator", "helper", "+ 32", "- 32"),
        ("swapped_operands", "helper", "9 / 5", "5 / 9"),
        (
            "missing_case",
            "main",
            '    if unit == "F":\n        return round((value - 32) * 5 / 9, 1)\n',
            "",
        ),
    ]
    rng = d.rng
    cases = [f"{rng.randint(-40, 110)}, {rng.choice(('C', 'F', 'c', 'f'))!r}" for _ in range(8)]
    cases += [
        f"{round(rng.uniform(-10, 40), 1)}, 'C'",
        f"{round(rng.uniform(0, 100), 1)}, 'F'",
        "100, 'C'",
        "212, 'F'",
        "37.5, 'c'",
        "50, 'K'",
        "98.6, 'f'",
    ]
    return _unit(
        names,
        main,
        helper,
        '- `$fn(value, unit)`: Celsius to Fahrenheit for "C", back for "F", 1 decimal.',
        bugs,
        cases,
    )


def _moving(d: _Draw) -> _Unit:
    window = d.integer(2, 5)
    names = {
        "fn": d.name(
            "moving_average rolling_mean smooth window_means sliding_mean running_average"
        ),
        "helper": d.name("_mean _average _avg _arith_mean"),
        "w": window,
        "bad": d.other(window, 1, 6),
    }
    main = '''
def $fn(values, window=$w):
    """Means of each run of `window` consecutive `values`, to 2 decimals."""
    if window <= 0:
        raise ValueError(f"window must be positive, got {window}")
    count = len(values) - window + 1
    return [round($helper(values[i:i + window]), 2) for i in range(count)]
'''
    helper = '''
def $helper(xs):
    """Arithmetic mean of the non-empty list `xs`."""
    return sum(xs) / len(xs)
'''
    bugs = [
        ("off_by_one", "main", "len(values) - window + 1", "len(values) - window"),
        ("wrong_constant", "main", "window=$w)", "window=$bad)"),
        ("off_by_one", "main", "values[i:i + window]", "values[i:i + window - 1]"),
        ("off_by_one", "helper", "sum(xs) /", "sum(xs[1:]) /"),
        ("wrong_operator", "helper", "sum(xs) / len(xs)", "sum(xs) // len(xs)"),
        (
            "missing_case",
            "main",
            '    if window <= 0:\n        raise ValueError(f"window must be positive, got {window}")\n',
            "",
        ),
    ]
    rng = d.rng

    def values(n: int) -> list[int]:
        return [rng.randint(0, 20) for _ in range(n)]

    cases = [repr(values(rng.randint(window, 8))) for _ in range(4)]
    cases += [f"{values(rng.randint(1, 8))}, {rng.randint(1, 4)}" for _ in range(6)]
    cases += [
        "[1, 2, 3, 4], 0",
        "[5, 7], -1",
        "[], 2",
        "[3, 8, 1, 4, 6], 2",
        "[2, 4, 6], 3",
        repr([1, 5, 2, 8, 3, 9, 4][: window + 1]),
    ]
    return _unit(
        names,
        main,
        helper,
        "- `$fn(values, window=$w)`: means of each `window` consecutive values.",
        bugs,
        cases,
    )


@dataclass(slots=True, frozen=True)
class _Domain:
    packages: str  # space-separated pools (see _Draw.name)
    modules: str
    helper_modules: str
    summaries: tuple[str, ...]
    units: tuple[Callable[[_Draw], _Unit], ...]


# fmt: off
_DOMAINS = (
    _Domain("inventory stockroom warehouse pantry depot storehouse stocktake supplies",
            "stock levels orders reorder", "counting _calc rules quantities",
            ("Stock keeping for a small shop.", "Track what is on the shelves.",
             "Inventory arithmetic: reorders and values."), (_reorder, _stock_value)),
    _Domain("textstats wordstats prose lexis corpus_tools wordcount textmetrics readability",
            "stats metrics analysis measures", "tokens tokenize _text parsing",
            ("Simple statistics over plain text.", "Word-level measures of a text.",
             "Counting words in prose."), (_word_length, _top_words)),
    _Domain("geometry shapes polygons planar geom2d figures meshkit survey",
            "polygon measure shapes2d outline", "vectors _points points linalg",
            ("Plane geometry for polygons given as (x, y) points.",
             "Measuring simple shapes in the plane.", "Perimeters and areas of polygons."),
            (_perimeter, _area)),
    _Domain("gradebook grades marks scoring classroom assessments results report_cards",
            "grading scores letters semester", "rounding _math numeric arith",
            ("Turn raw marks into grades.", "A tiny gradebook.",
             "Course scores and letter grades."), (_weighted, _letter)),
    _Domain("billing invoicing checkout shipping ledger storefront orders payments",
            "charges totals pricing costs", "lines _money money amounts",
            ("Prices, totals and shipping for a web shop.", "Billing helpers for small orders.",
             "What a customer pays."), (_shipping, _invoice)),
    _Domain("sensors telemetry weather readings climate station probes monitor",
            "signals series convert process", "_stats averages mathutil numbers",
            ("Processing of sensor readings.", "Small tools for weather-station data.",
             "Temperature series helpers."), (_temperature, _moving)),
)
# fmt: on


# --- assembling a task ----------------------------------------------------------------------


Outcome = tuple[str, object]  # ("value", v) or ("raise", exception name)


# A target case's outcomes: on the correct code, on the buggy code, and for each bug of
# two whether that bug alone shows on it.
_Seen = tuple[Outcome, Outcome, list[bool]]


@dataclass(slots=True, frozen=True)
class _Draft:
    """A drawn repository before its tests: names, the two units (the target first), the
    correct modules and the bugs to plant in the target."""

    package: str
    module: str
    summary: str
    units: list[_Unit]
    bugs: list[_Bug]
    kind: str
    main_path: str
    helper_path: str
    correct: dict[str, str]

    @property
    def target(self) -> _Unit:
        """The unit that gets the bugs."""
        return self.units[0]

    @property
    def bystander(self) -> _Unit:
        """The unit that stays correct (its tests guard against collateral edits)."""
        return self.units[1]

    @property
    def buggy(self) -> dict[str, str]:
        """The package's modules with every bug planted."""
        return self.with_bugs(self.bugs)

    def path(self, bug: _Bug) -> str:
        """The file ``bug`` is planted in."""
        return self.main_path if bug.where == "main" else self.helper_path

    def with_bugs(self, chosen: list[_Bug]) -> dict[str, str]:
        """The package's modules with the ``chosen`` bugs planted."""
        files = dict(self.correct)
        for bug in chosen:
            files[self.path(bug)] = files[self.path(bug)].replace(bug.fixed, bug.buggy)
        return files

    def load(self, files: dict[str, str]) -> dict[str, object]:
        """The functions of the package as ``files`` has it, run in-process."""
        return _namespace(files, self.main_path, self.helper_path)


@dataclass(slots=True, frozen=True)
class _Cases:
    """A draft's test cases (function, args, expected outcome), chosen to show its bug."""

    visible: list[tuple[str, str, Outcome]]
    hidden: list[tuple[str, str, Outcome, bool]]  # and whether the bug fails it
    shown: list[tuple[str, _Seen]]  # the visible target cases, for the issue


def _try_task(seed: int, tier: int, d: _Draw) -> SweTask | None:
    """One draw of the task of ``seed``, or None when the draw cannot show its bug."""
    draft = _draft(tier, d)
    if draft is None:
        return None
    cases = _pick_cases(draft, d.rng)
    if cases is None:
        return None
    return _assemble(seed, tier, draft, cases, d.rng)


def _draft(tier: int, d: _Draw) -> _Draft | None:
    """Domain, names, units and bugs; None when a planted bug's text is not unique."""
    rng = d.rng
    domain = rng.choice(_DOMAINS)
    package = d.name(domain.packages)
    module = d.name(domain.modules)
    helpers = d.name(domain.helper_modules)
    units = [make(d) for make in domain.units]
    rng.shuffle(units)
    bugs, kind = _pick_bugs(units[0], tier, rng)
    if bugs is None:
        return None
    main_path, helper_path = f"{package}/{module}.py", f"{package}/{helpers}.py"
    summary = rng.choice(domain.summaries)
    correct = {
        main_path: _main_module(summary, helpers, units),
        helper_path: _helper_module(package, module, units),
    }
    draft = _Draft(package, module, summary, units, bugs, kind, main_path, helper_path, correct)
    for bug in bugs:
        if correct[draft.path(bug)].count(bug.fixed) != 1:
            raise AssertionError(f"bug text {bug.fixed!r} is not unique in {draft.path(bug)}")
    buggy = draft.buggy
    if any(bug.buggy and buggy[draft.path(bug)].count(bug.buggy) != 1 for bug in bugs):
        return None
    return draft


def _pick_cases(draft: _Draft, rng: random.Random) -> _Cases | None:
    """Target cases that show the bug (visible, hidden) and bystander cases it leaves alone."""
    run_correct = draft.load(draft.correct)
    run_buggy = draft.load(draft.buggy)
    cases, seen = _target_outcomes(draft, run_correct, run_buggy, rng)
    visible = _choose(cases, seen, VISIBLE_TARGET_CASES, set(), failing_first=False)
    if visible is None:
        return None
    hidden = _choose(cases, seen, HIDDEN_TARGET_CASES, set(visible), failing_first=True)
    if hidden is None:
        return None
    target, bystander = draft.target.function, draft.bystander.function
    stand = [
        c
        for c in draft.bystander.cases
        if _same(_outcome(run_correct, bystander, c), _outcome(run_buggy, bystander, c))
    ]
    rng.shuffle(stand)
    if len(stand) < 1 + HIDDEN_BYSTANDER_CASES:
        return None
    visible_cases = [(target, c, seen[c][0]) for c in visible]
    visible_cases.append((bystander, stand[0], _outcome(run_correct, bystander, stand[0])))
    hidden_cases = [(target, c, seen[c][0], not _same(seen[c][0], seen[c][1])) for c in hidden]
    hidden_cases += [
        (bystander, c, _outcome(run_correct, bystander, c), False)
        for c in stand[1 : 1 + HIDDEN_BYSTANDER_CASES]
    ]
    return _Cases(visible_cases, hidden_cases, [(c, seen[c]) for c in visible])


def _target_outcomes(
    draft: _Draft,
    run_correct: dict[str, object],
    run_buggy: dict[str, object],
    rng: random.Random,
) -> tuple[list[str], dict[str, _Seen]]:
    """The target's cases in a drawn order, and what each gives (see ``_Seen``)."""
    run_singles = (
        [draft.load(draft.with_bugs([b])) for b in draft.bugs] if len(draft.bugs) > 1 else []
    )
    function = draft.target.function
    cases = list(draft.target.cases)
    rng.shuffle(cases)
    seen: dict[str, _Seen] = {}
    for args in cases:
        want = _outcome(run_correct, function, args)
        seen[args] = (
            want,
            _outcome(run_buggy, function, args),
            [not _same(want, _outcome(ns, function, args)) for ns in run_singles],
        )
    return cases, seen


def _assemble(seed: int, tier: int, draft: _Draft, cases: _Cases, rng: random.Random) -> SweTask:
    """The task: the buggy repository and its visible tests, the issue, hidden tests, fix."""
    package, module = draft.package, draft.module
    test_module = f"test_{module}"
    visible_test = f"python -m unittest tests.{test_module} -v"
    hidden_module = f"hidden_tests/test_{module}_hidden.py"
    functions = [u.function for u in draft.units]
    files = {
        "README.md": _readme(package, draft.summary, draft.units, module),
        f"{package}/__init__.py": _init(package, draft.summary, module, functions),
        **draft.buggy,
        "tests/__init__.py": "",
        f"tests/{test_module}.py": _visible_tests(package, module, cases.visible),
    }
    issue = _issue(
        tier,
        draft.kind,
        draft.bugs,
        draft.target,
        draft.path(draft.bugs[0]),
        cases.shown,
        visible_test,
        rng,
    )
    return SweTask(
        seed=seed,
        tier=tier,
        kind=draft.kind,
        files=files,
        issue=issue,
        visible_test=visible_test,
        hidden_tests={
            "hidden_tests/__init__.py": "",
            hidden_module: _hidden_tests(package, module, cases.hidden),
        },
        hidden_test_command=f"python -m unittest hidden_tests.test_{module}_hidden -v",
        fix={path: draft.correct[path] for path in {draft.path(b) for b in draft.bugs}},
    )


def _pick_bugs(unit: _Unit, tier: int, rng: random.Random) -> tuple[list[_Bug] | None, str]:
    plain = [b for b in unit.bugs if b.kind != "missing_case"]
    main = [b for b in plain if b.where == "main"]
    helper = [b for b in plain if b.where == "helper"]
    if tier == 0:
        safe = [b for b in main if SED_SAFE.fullmatch(b.fixed) and SED_SAFE.fullmatch(b.buggy)]
        bug = rng.choice(safe)
        return [bug], bug.kind
    if tier == 1:
        bug = rng.choice(main)
        return [bug], bug.kind
    if tier == 2:
        bug = rng.choice(helper)
        return [bug], bug.kind
    missing = [b for b in unit.bugs if b.kind == "missing_case"]
    if missing and rng.random() < 0.5:
        return [rng.choice(missing)], "missing_case"
    return [rng.choice(main), rng.choice(helper)], "two_bugs"


def _namespace(files: dict[str, str], main_path: str, helper_path: str) -> dict[str, object]:
    """The package's functions, run in-process (relative imports dropped: one namespace)."""
    namespace: dict[str, object] = {}
    exec(files[helper_path], namespace)  # noqa: S102 - generated code only
    main = "\n".join(
        line for line in files[main_path].splitlines() if not line.startswith("from .")
    )
    exec(main, namespace)  # noqa: S102
    return namespace


def _outcome(namespace: dict[str, object], function: str, args: str) -> Outcome:
    try:
        return ("value", eval(f"{function}({args})", namespace))  # noqa: S307 - generated
    except Exception as error:  # the bug's own exceptions are outcomes to compare
        return ("raise", type(error).__name__)


def _same(a: Outcome, b: Outcome) -> bool:
    """Whether a test expecting ``a`` passes on ``b`` (floats compare as assertAlmostEqual)."""
    if a[0] != b[0]:
        return False
    if a[0] == "raise":
        return a[1] == b[1]
    if type(a[1]) is float:
        try:
            return a[1] == b[1] or round(abs(a[1] - b[1]), 6) == 0  # type: ignore[operator]
        except TypeError:
            return False
    return a[1] == b[1]


def _choose(
    cases: list[str], outcomes: dict, count: int, exclude: set[str], failing_first: bool
) -> list[str] | None:
    """``count`` cases: one that shows each bug (each single bug of two), then the rest.

    Visible tests take passing cases next (a failing case is saved for the hidden tests);
    hidden tests take two more failing ones, then one passing (a guard on the same function).
    """
    free = [c for c in cases if c not in exclude]
    failing = [c for c in free if not _same(outcomes[c][0], outcomes[c][1])]
    if not failing:
        return None
    singles = len(outcomes[free[0]][2]) if free else 0
    chosen = [failing[0]]
    for i in range(singles):
        if not any(outcomes[c][2][i] for c in chosen):
            showing = [c for c in free if outcomes[c][2][i] and c not in chosen]
            if not showing:
                return None
            chosen.append(showing[0])
    passing = [c for c in free if c not in chosen and c not in failing]
    rest = [c for c in free if c not in chosen and c not in passing]
    chosen += (
        rest[:2] + passing[:1] + rest[2:] + passing[1:] if failing_first else passing + rest
    )[: max(count - len(chosen), 0)]
    return chosen if len(chosen) >= count else None


def _main_module(summary: str, helpers: str, units: list[_Unit]) -> str:
    constants = "".join(u.main_constants for u in units)
    body = "\n".join(u.main for u in units)
    imports = ", ".join(sorted(u.helper for u in units))
    return (
        f'"""{summary}"""\n\nfrom .{helpers} import {imports}\n\n'
        + (f"{constants}\n" if constants else "")
        + body
    )


def _helper_module(package: str, module: str, units: list[_Unit]) -> str:
    constants = "".join(u.helper_constants for u in units)
    body = "\n".join(u.helper_source for u in units)
    head = f'"""Helpers behind {package}.{module}."""\n\n'
    if "math." in body:
        head += "import math\n\n"
    return head + (f"{constants}\n" if constants else "") + body


def _init(package: str, summary: str, module: str, functions: list[str]) -> str:
    names = ", ".join(sorted(functions))
    listed = ", ".join(f'"{f}"' for f in sorted(functions))
    return f'"""{package}: {summary}"""\n\nfrom .{module} import {names}\n\n__all__ = [{listed}]\n'


def _readme(package: str, summary: str, units: list[_Unit], module: str) -> str:
    lines = "\n".join(u.readme for u in units)
    return (
        f"# {package}\n\n{summary}\n\n## Functions (`{package}/{module}.py`)\n\n{lines}\n\n"
        f"## Tests\n\n    python -m unittest discover -s tests -t .\n"
    )


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_") if part)


def _assertion(function: str, args: str, want: Outcome) -> str:
    call = f"{function}({args})"
    if want[0] == "raise":
        return f"        with self.assertRaises({want[1]}):\n            {call}\n"
    if type(want[1]) is float:
        return f"        self.assertAlmostEqual({call}, {want[1]!r}, places=6)\n"
    return f"        self.assertEqual({call}, {want[1]!r})\n"


def _visible_tests(package: str, module: str, cases: list[tuple[str, str, Outcome]]) -> str:
    functions = sorted({f for f, _, _ in cases})
    text = f"import unittest\n\nfrom {package}.{module} import {', '.join(functions)}\n"
    for function in functions:
        text += f"\n\nclass Test{_camel(function)}(unittest.TestCase):\n"
        mine = [(a, w) for f, a, w in cases if f == function]
        for i, (args, want) in enumerate(mine, 1):
            text += ("\n" if i > 1 else "") + f"    def test_{function.lstrip('_')}_{i}(self):\n"
            text += _assertion(function, args, want)
    return text + '\n\nif __name__ == "__main__":\n    unittest.main()\n'


def _hidden_tests(package: str, module: str, cases: list[tuple[str, str, Outcome, bool]]) -> str:
    functions = sorted({f for f, _, _, _ in cases})
    text = f"import unittest\n\nfrom {package}.{module} import {', '.join(functions)}\n"
    text += "\n\nclass HiddenTests(unittest.TestCase):\n"
    issue = guard = 0
    for i, (function, args, want, shows_bug) in enumerate(cases):
        if shows_bug:
            issue += 1
            name = f"test_issue_{issue}"
        else:
            guard += 1
            name = f"test_guard_{guard}"
        text += ("\n" if i else "") + f"    def {name}(self):\n" + _assertion(function, args, want)
    return text


def _show(outcome: Outcome) -> str:
    return f"raises `{outcome[1]}`" if outcome[0] == "raise" else f"returns `{outcome[1]!r}`"


def _symptom(function: str, args: str, want: Outcome, got: Outcome, rng: random.Random) -> str:
    call = f"`{function}({args})`"
    if want[0] == "raise":
        return f"{call} should raise `{want[1]}`, but it {_show(got)}."
    if got[0] == "raise":
        return f"{call} raises `{got[1]}` instead of returning `{want[1]!r}`."
    return rng.choice(
        (
            f"{call} returns `{got[1]!r}`, but it should return `{want[1]!r}`.",
            f"I expected {call} to give `{want[1]!r}`; it gives `{got[1]!r}`.",
            f"Calling {call} yields `{got[1]!r}` instead of `{want[1]!r}`.",
        )
    )


def _issue(
    tier: int,
    kind: str,
    bugs: list[_Bug],
    unit: _Unit,
    path: str,
    visible: list[tuple[str, tuple]],
    visible_test: str,
    rng: random.Random,
) -> str:
    failing = [(c, o) for c, o in visible if not _same(o[0], o[1])]
    first = failing[0]
    symptom = _symptom(unit.function, first[0], first[1][0], first[1][1], rng)
    reproduce = f"Reproduce with `{visible_test}`."
    if tier == 0:
        bug = bugs[0]
        return (
            f"# Wrong result from `{unit.function}`\n\n{symptom}\n\n"
            f"The bug is in `{path}`, in `{unit.function}`: the text `{bug.buggy}` is wrong, "
            f"it should be `{bug.fixed}`.\n\nReplace `{bug.buggy}` with `{bug.fixed}` in "
            f"`{path}`.\n\n{reproduce}\n"
        )
    if tier == 1:
        where = rng.choice(
            (
                f"The problem is in `{unit.function}`.",
                f"Something in `{unit.function}` looks off.",
                f"I think `{unit.function}` has a bug.",
            )
        )
        return f"# `{unit.function}` gives a wrong result\n\n{symptom} {where}\n\n{reproduce}\n"
    if tier == 2:
        title = rng.choice(("Wrong result", "Unexpected output", "Bug report", "Incorrect value"))
        return f"# {title}\n\n{symptom}\n\n{reproduce}\n"
    if kind == "two_bugs":
        lines = [symptom]
        for i in range(len(bugs)):
            shown = [(c, o) for c, o in visible if o[2][i]]
            if shown and shown[0][0] != first[0]:
                c, o = shown[0]
                lines.append(_symptom(unit.function, c, o[0], o[1], rng))
        more = "There may be more than one thing wrong." if len(lines) > 1 else ""
        body = "\n".join(f"- {line}" for line in lines)
        return f"# Several wrong results\n\n{body}\n\n{more}\n\n{reproduce}\n"
    return f"# Unhandled case\n\n{symptom}\n\n{reproduce}\n"
