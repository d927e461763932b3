"""Fix a bug in a small Python repository with shell commands: the shipped SWE-style tasks
(``pearl.envs.swe_tasks``) in a sandbox (``pearl.envs.sandbox``), in mini-swe-agent's
action format, so the same tasks train with PEARL's own loop or with mini-swe-agent
(``pearl.agents.examples.mini_swe_agent``).

Each reply holds one ```` ```bash ```` block; its command runs in the episode's sandbox
(cwd: the repository) and the next observation is its exit code and output. The episode
ends when a command's output starts with ``SUBMIT`` (the agent ran ``echo
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``) or after ``max_turns`` replies; either way the
tree as it stands is scored by the task's hidden tests (reward: the share of them that
pass; success: all of them). A reply with no block or several gets an observation that
says the format and counts as a turn.
"""

from __future__ import annotations

import re

from pearl.envs.base import StepResult
from pearl.envs.sandbox import CommandResult, Sandbox, SandboxLimits
from pearl.envs.swe_tasks import SweTask, make_task, score

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

# A worked example on a task outside the suite: read, fix, check, submit.
DEMONSTRATION = (
    (
        "user",
        "Issue: in shapes/area.py, square(side) returns side * 3; it must return side * side.",
    ),
    ("assistant", "I read the function.\n```bash\ncat shapes/area.py\n```"),
    (
        "user",
        "<returncode>0</returncode>\n<output>\ndef square(side):\n    return side * 3\n</output>",
    ),
    ("assistant", "I fix it.\n```bash\nsed -i 's/side \\* 3/side * side/' shapes/area.py\n```"),
    ("user", "<returncode>0</returncode>\n<output>\n</output>"),
    ("assistant", f"Fixed.\n```bash\necho {SUBMIT}\n```"),
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


def score_tree(sandbox: Sandbox, task: SweTask, timeout_s: float) -> tuple[float, bool]:
    """The hidden tests run on the tree as it stands: (reward, solved)."""
    # Cached bytecode the agent left (compileall, say) could hold code older than its source.
    sandbox.run("find . -name __pycache__ -type d -prune -exec rm -rf {} +", timeout_s=timeout_s)
    for path, text in task.hidden_tests.items():
        sandbox.write_file(path, text)
    result = sandbox.run(task.hidden_test_command, timeout_s=timeout_s)
    outcome = score(result.output, None if result.stopped else result.returncode)
    return outcome.reward, outcome.solved


class SweEnv:
    name = "swe"

    def __init__(
        self,
        tier: int | None = None,
        max_turns: int = 10,
        command_timeout_s: float = 10.0,
        observation_chars: int = 2000,
        score_timeout_s: float = 60.0,
        memory_mb: int = 1024,
        disk_mb: int = 64,
    ) -> None:
        if max_turns < 1 or command_timeout_s <= 0 or observation_chars < 100:
            raise ValueError(
                "need max_turns >= 1, command_timeout_s > 0 and observation_chars >= 100, got "
                f"{max_turns}, {command_timeout_s}, {observation_chars}"
            )
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
        return f"{self.task.issue}\n\nReproduce it with: {self.task.visible_test}"

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
            result = self.sandbox.run(commands[0])
            observation = format_observation(result, self.observation_chars)
        submitted = result is not None and result.output.lstrip().startswith(SUBMIT)
        if not submitted and self.turns < self.max_turns:
            return StepResult(observation, 0.0, False, {"stopped": result and result.stopped})
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
