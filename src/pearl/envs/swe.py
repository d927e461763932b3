"""Fix a bug in a small Python repository with shell commands: the shipped SWE-style tasks
(``pearl.envs.swe_tasks``) in a sandbox (``pearl.envs.sandbox``), in mini-swe-agent's
action format, so the same tasks train with PEARL's own loop or with mini-swe-agent
(``pearl.agents.examples.mini_swe_agent``).

Each reply holds one ```` ```bash ```` block (``sh`` or no tag also do); its command runs in
the episode's sandbox (cwd: the repository) and the next observation is its exit code and
output. The episode ends when a command's first output line is ``SUBMIT`` and it exits 0
(the agent ran ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``: mini-swe-agent's rule) or
after ``max_turns`` replies; either way the task's hidden tests score the tree as it stands
(``score_tree``: reward the share of its issue tests that pass, 0 if a guard test fails;
success: all pass). A reply with no block or several gets an observation that says the
format and counts as a turn.

Scoring runs the hidden tests in the sandbox, each test's outcome reported under a nonce so
that text the agent's code prints is no result, with the repository after the standard
library on the path; anything the agent left in the way (a folder or link at a hidden
test's path, a hang, a full disk) scores 0. The last step (its command, then scoring) takes
up to ``command_timeout_s + score_timeout_s`` plus a few seconds: keep it under the run's
``env.step_timeout_s`` (60 s by default), or the episode ends ``env_timeout`` instead.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import time

from pearl.envs.base import StepResult
from pearl.envs.sandbox import CommandResult, Sandbox, SandboxError, SandboxLimits
from pearl.envs.swe_tasks import SweTask, hidden_test_names, make_task, score_outcomes

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent's sentinel
# One command block: ```bash (or ```sh, or a bare ```) ... ```; small models often drop the tag.
ACTION_REGEX = r"```(?:bash|sh)?[ \t]*\n(.*?)\n```"
_BASH = re.compile(ACTION_REGEX, re.DOTALL)

SYSTEM_PROMPT = (
    "You fix bugs in a Python repository by running shell commands. Each reply has a short "
    "thought and exactly one command in a ```bash block; it runs in the repository's root "
    "and you see its output. Edit files with sed or python. When the fix is done, reply "
    f"with:\n```bash\necho {SUBMIT}\n```"
)

# A worked example on a task outside the suite, in the shape of the easiest tier's issues:
# the fix is the one command the issue spells out, then the submit command.
DEMONSTRATION = (
    (
        "user",
        "# Wrong result from `square`\n\n`square(3)` returns `6`, but it should return `9`.\n\n"
        "The bug is in `shapes/area.py`, in `square`: the text `side + side` is wrong, it "
        "should be `side * side`.\n\nReplace `side + side` with `side * side` in "
        "`shapes/area.py`.\n\nReproduce with `python -m unittest tests.test_area -v`.",
    ),
    ("assistant", "```bash\nsed -i 's/side + side/side * side/' shapes/area.py\n```"),
    ("user", "<returncode>0</returncode>\n<output>\n\n</output>"),
    ("assistant", f"```bash\necho {SUBMIT}\n```"),
    ("user", "Submitted."),
)


def format_observation(result: CommandResult, limit_chars: int) -> str:
    """A command's result as the model reads it, mini-swe-agent's shape: the exit code,
    the output (its head and tail when longer than ``limit_chars``) and why it was stopped."""
    output = result.output
    if len(output) > limit_chars:
        half = limit_chars // 2
        cut = len(output) - 2 * half
        output = f"{output[:half]}\n[... {cut} characters left out ...]\n{output[-half:]}"
    note = f"\n<stopped>{result.stopped}</stopped>" if result.stopped else ""
    return f"<returncode>{result.returncode}</returncode>{note}\n<output>\n{output}\n</output>"


# The hidden tests' runner: ``python -I`` (no current folder, no PYTHON* variables on the
# path) with the repository appended last, so a file of the agent's (``unittest.py``) cannot
# stand in for the standard library; it reports each test's outcome on one line tagged with
# a nonce drawn for this run, so text the agent's code prints is not read as a result.
# (Code the tests import runs in this process and could still patch ``unittest``: the
# tasks are for training small models, not a security boundary for adversarial ones.)
_RUNNER = """
import json, sys, unittest
nonce, module = sys.argv[1], sys.argv[2]
sys.path.append(".")
outcomes = {}
class Result(unittest.TestResult):
    def addSuccess(self, test):
        outcomes[test._testMethodName] = True
    def addFailure(self, test, err):
        outcomes[test._testMethodName] = False
    addError = addFailure
try:
    unittest.defaultTestLoader.loadTestsFromName(module).run(Result())
finally:
    print(nonce + json.dumps(outcomes), flush=True)
"""


def is_submission(result: CommandResult) -> bool:
    """mini-swe-agent's rule: the output's first line is the sentinel and the command exited 0."""
    lines = result.output.lstrip().splitlines()
    return bool(lines) and lines[0].strip() == SUBMIT and result.returncode == 0


def score_tree(sandbox: Sandbox, task: SweTask, timeout_s: float) -> tuple[float, bool]:
    """The hidden tests run on the tree as it stands: (reward, solved). Whatever the agent
    left (a folder or a link where a hidden test goes, a full disk, a hang) scores 0."""
    modules = [path for path in task.hidden_tests if not path.endswith("__init__.py")]
    folders = sorted({path.split("/")[0] for path in task.hidden_tests})
    nonce = secrets.token_hex(16)
    try:
        # Clear the hidden tests' paths and cached bytecode (compiled from an older source).
        sandbox.run(
            f"rm -rf {' '.join(folders)}; find . -name __pycache__ -prune -exec rm -rf {{}} +",
            timeout_s=timeout_s,
        )
        for path, text in task.hidden_tests.items():
            sandbox.write_file(path, text)
    except (ValueError, OSError, SandboxError):
        return 0.0, False
    outcomes: dict[str, bool] = {}
    for path in modules:
        module = path.removesuffix(".py").replace("/", ".")
        command = f"python -I -c {shlex.quote(_RUNNER)} {nonce} {module}"
        result = sandbox.run(command, timeout_s=timeout_s)
        for line in result.output.splitlines():
            if line.startswith(nonce) and not result.stopped:
                try:
                    reported = json.loads(line[len(nonce) :])
                except ValueError:
                    continue
                outcomes.update({str(k): v is True for k, v in reported.items()})
    outcome = score_outcomes(outcomes, hidden_test_names(task))
    return outcome.reward, outcome.solved


class SweEnv:
    name = "swe"

    def __init__(
        self,
        tier: int | None = None,
        max_turns: int = 10,
        command_timeout_s: float = 10.0,
        observation_chars: int = 2000,
        score_timeout_s: float = 30.0,
        memory_mb: int = 1024,
        disk_mb: int = 64,
        remote_latency_s: float = 0.0,
    ) -> None:
        if max_turns < 1 or command_timeout_s <= 0 or observation_chars < 100:
            raise ValueError(
                "need max_turns >= 1, command_timeout_s > 0 and observation_chars >= 100, got "
                f"{max_turns}, {command_timeout_s}, {observation_chars}"
            )
        if not 0 <= remote_latency_s <= 600:
            raise ValueError(f"remote_latency_s must be 0-600 seconds, got {remote_latency_s}")
        # Seconds every command (and the scoring) waits before it runs: a remote sandbox's
        # round trip, injected, for measuring rollout where the environment is slow (0: the
        # local sandbox only). A wait, not work: it holds no CPU.
        self.remote_latency_s = remote_latency_s
        self.tier = tier
        self.max_turns = max_turns
        self.observation_chars = observation_chars
        self.score_timeout_s = score_timeout_s
        self.limits = SandboxLimits(wall_s=command_timeout_s, memory_mb=memory_mb, disk_mb=disk_mb)
        self.system_prompt = SYSTEM_PROMPT
        self.demonstration = DEMONSTRATION
        self.task: SweTask | None = None
        self.sandbox: Sandbox | None = None
        self.turns = 0
        self.solved = False

    def reset(self, seed: int) -> str:
        self.close()
        self.task = make_task(seed, self.tier)
        self.sandbox = Sandbox(self.task.files, self.limits)
        self.turns = 0
        self.solved = False
        return self.task.issue  # it ends with the command that shows the failure

    def step(self, action: str) -> StepResult:
        if self.task is None or self.sandbox is None:
            raise RuntimeError("step() before reset()")
        self.turns += 1
        commands = _BASH.findall(action)
        if len(commands) != 1:
            observation = (
                f"Your reply had {len(commands)} ```bash blocks; it needs exactly one, "
                f"e.g.\n```bash\nls\n```"
            )
            result = None
        else:
            time.sleep(self.remote_latency_s)
            result = self.sandbox.run(commands[0])
            observation = format_observation(result, self.observation_chars)
        submitted = result is not None and is_submission(result)
        if not submitted and self.turns < self.max_turns:
            return StepResult(observation, 0.0, False, {"stopped": result and result.stopped})
        time.sleep(self.remote_latency_s)
        reward, self.solved = score_tree(self.sandbox, self.task, self.score_timeout_s)
        self.close()
        return StepResult(
            "Submitted." if submitted else observation, reward, True, {"submitted": submitted}
        )

    def close(self) -> None:
        """Ends the sandbox (its processes and tree); the runtime calls it when the
        episode ends however it ends."""
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    @property
    def success(self) -> bool:
        return self.solved
