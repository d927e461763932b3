"""The SWE environment: shell commands in a task's sandbox, the hidden tests scoring the
tree when the agent submits or runs out of turns, and the sandbox ended with the episode."""

import re
import time

import pytest

from pearl.envs.sandbox import isolation
from pearl.envs.swe import SUBMIT, SweEnv

SUBMIT_REPLY = f"Done.\n```bash\necho {SUBMIT}\n```"


def command(text: str) -> str:
    return f"I run it.\n```bash\n{text}\n```"


def issue_fix(env: SweEnv) -> str:
    """The tier-0 fix the issue spells out, as the one sed command it asks for."""
    wrong, right, path = re.search(
        r"Replace `(.*?)` with `(.*?)` in `(.*?)`", env.task.issue
    ).groups()
    return f"sed -i 's/{wrong}/{right}/' {path}"


def test_fixing_what_the_issue_says_and_submitting_scores_1():
    env = SweEnv(tier=0)
    issue = env.reset(3)
    assert f"Reproduce with `{env.task.visible_test}`" in issue
    run = env.step(command(env.task.visible_test))
    assert not run.done and "<returncode>1</returncode>" in run.observation
    assert "FAILED" in run.observation
    # Running the tests cached nothing: the same-size edit below, within the same second,
    # is what the next run imports (no stale .pyc).
    assert not env.step(command(issue_fix(env))).done
    assert "OK" in env.step(command(env.task.visible_test)).observation
    root = env.sandbox.root
    done = env.step(SUBMIT_REPLY)
    assert (done.done, done.reward, env.success, done.info) == (
        True,
        1.0,
        True,
        {"submitted": True},
    )
    assert env.sandbox is None and not root.exists()  # ended with the episode


def test_submitting_the_untouched_repository_scores_0():
    env = SweEnv(tier=1)
    env.reset(5)
    done = env.step(SUBMIT_REPLY)
    assert done.done and done.reward == 0.0 and not env.success


def test_a_reply_without_exactly_one_block_is_told_the_format_and_uses_a_turn():
    env = SweEnv(tier=0, max_turns=3)
    env.reset(0)
    for reply in ("I think the bug is in the code.", command("ls") + "\n" + command("pwd")):
        step = env.step(reply)
        assert not step.done and "needs exactly one" in step.observation
    last = env.step("still no command")  # the third turn: out of turns, the tree scored
    assert last.done and last.reward == 0.0 and last.info == {"submitted": False}
    assert env.sandbox is None


def test_the_last_turn_scores_the_tree_as_it_stands():
    env = SweEnv(tier=0, max_turns=1)
    env.reset(2)
    step = env.step(command(issue_fix(env)))
    assert step.done and step.reward == 1.0 and env.success


def test_a_stopped_command_is_reported_and_the_episode_goes_on():
    env = SweEnv(tier=0, command_timeout_s=0.5, observation_chars=200)
    env.reset(1)
    step = env.step(command("sleep 30"))
    assert not step.done and "<stopped>timeout</stopped>" in step.observation
    long = env.step(command("seq 1 100000"))
    assert "characters left out" in long.observation and len(long.observation) < 400
    env.close()
    env.close()  # idempotent


def test_options_are_checked():
    with pytest.raises(ValueError, match="max_turns >= 1"):
        SweEnv(max_turns=0)
    with pytest.raises(ValueError, match="remote_latency_s must be 0-600 seconds"):
        SweEnv(remote_latency_s=-1)


def test_a_remote_sandbox_latency_delays_every_command_and_the_scoring():
    env = SweEnv(tier=0, max_turns=2, remote_latency_s=0.3)
    env.reset(3)
    t0 = time.perf_counter()
    assert not env.step(command("true")).done
    command_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert env.step(command("true")).done  # the last turn: the command, then the scoring
    last_s = time.perf_counter() - t0
    assert command_s >= 0.3 and last_s >= 0.6
    # A reply with no command runs nothing and waits for nothing.
    env.reset(3)
    t0 = time.perf_counter()
    assert not env.step("no block").done
    assert time.perf_counter() - t0 < 0.3


@pytest.mark.skipif(not isolation().filesystem_view, reason="no filesystem view on this machine")
def test_the_agent_sees_only_its_repository():
    env = SweEnv(tier=0)
    env.reset(4)
    step = env.step(command("ls / && cat /etc/hostname"))
    assert "repo" in step.observation and "No such file" in step.observation
    env.close()


def fixed_env(seed: int = 3, **options) -> SweEnv:
    """A tier-0 task with its fix applied (the hidden tests would all pass)."""
    env = SweEnv(tier=0, **options)
    env.reset(seed)
    assert not env.step(command(issue_fix(env))).done
    return env


# What unittest prints for a passing run, as a line of Python the agent writes.
FAKE_REPORT = r'print("test_issue_1 (x) ... ok\n\nRan 1 test in 0.001s\n\nOK")'


@pytest.mark.parametrize(
    "forgery",
    [
        f"cat > unittest.py <<'EOF'\n{FAKE_REPORT}\nEOF",  # stands in for the stdlib's
        # the package prints a passing report and leaves before any test runs
        f"for f in */__init__.py; do cat >> $f <<'EOF'\nimport os\n{FAKE_REPORT}\nos._exit(0)\n"
        "EOF\ndone",
    ],
    ids=["shadow-unittest", "package-prints-a-report"],
)
def test_a_report_the_agent_prints_is_not_a_score(forgery):
    env = SweEnv(tier=0)
    env.reset(3)  # the bug left in place
    assert "<returncode>0</returncode>" in env.step(command(forgery)).observation
    done = env.step(SUBMIT_REPLY)
    assert done.done and done.reward == 0.0 and not env.success


@pytest.mark.parametrize(
    "obstacle",
    ["mkdir -p hidden_tests/__init__.py", "ln -s /tmp hidden_tests", "touch hidden_tests"],
    ids=["folder-in-the-way", "link-out", "file-in-the-way"],
)
def test_what_the_agent_left_at_the_hidden_tests_paths_does_not_stop_scoring(obstacle):
    env = fixed_env()
    env.step(command(obstacle))
    done = env.step(SUBMIT_REPLY)
    assert (done.done, done.reward, env.success) == (True, 1.0, True)


def test_a_fix_that_hangs_its_tests_scores_0_within_the_scoring_timeout():
    env = fixed_env(score_timeout_s=2.0)
    env.step(command("for f in */__init__.py; do echo 'import time; time.sleep(60)' >> $f; done"))
    started = time.monotonic()
    done = env.step(SUBMIT_REPLY)
    assert done.done and done.reward == 0.0 and time.monotonic() - started < 15


def test_only_the_sentinel_on_its_own_first_line_with_exit_0_submits():
    env = SweEnv(tier=0, max_turns=5)
    env.reset(0)
    for reply in (f"echo {SUBMIT}; false", f"echo x; echo {SUBMIT}"):
        assert not env.step(command(reply)).done
    assert env.step(SUBMIT_REPLY).done
