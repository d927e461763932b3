"""Text episodes guard the user's environment: exceptions, wrong types and hangs end the
episode (EpisodeAborted, logged), plain-function environments run in a thread."""

import asyncio
import time

import pytest
from tiny_model import tiny_chat_tokenizer

from pearl.control.episode import EpisodeAborted
from pearl.envs.base import StepResult
from pearl.live.episodes import TextEpisode
from pearl.models.chat import ChatFormat
from pearl.models.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    return ChatFormat(Tokenizer(tiny_chat_tokenizer(tmp_path_factory.mktemp("tok"))))


class Env:
    system_prompt = "sys"

    def __init__(self, step=None, reset=None):
        self._step, self._reset = step, reset
        self.success = False

    async def reset(self, seed):
        return "task" if self._reset is None else self._reset()

    async def step(self, action):
        return self._step(action)


def episode(chat, env, timeout=None):
    events = []
    return TextEpisode(env, 7, chat, "train0", timeout, events.append), events


def test_a_good_step_appends_the_observation(chat):
    ep, events = episode(chat, Env(step=lambda a: StepResult(f"got {a}", 0.5, False)))
    prompt = asyncio.run(ep.start())
    assert chat.tokenizer.decode(prompt).endswith("user\ntask<|im_end|>\n<|im_start|>assistant\n")
    appended, reward, done = asyncio.run(ep.respond(chat.tokenizer.encode("hi")))
    assert reward == 0.5 and not done and "got hi" in chat.tokenizer.decode(appended)
    assert events == [] and len(ep.env_seconds) == 2


@pytest.mark.parametrize(
    "step, reason, message",
    [
        (lambda a: 1 / 0, "env_error", r"step\(\) on task seed 7 raised ZeroDivisionError"),
        (lambda a: "just text", "env_error", r"did not return a StepResult"),
        (lambda a: StepResult(3, 1.0, False), "env_error", r"observation int"),
        (lambda a: StepResult("x", float("nan"), False), "env_error", r"finite number"),
    ],
)
def test_a_failing_step_aborts_the_episode_and_is_logged(chat, step, reason, message):
    ep, events = episode(chat, Env(step=step))
    asyncio.run(ep.start())
    with pytest.raises(EpisodeAborted, match=message) as info:
        asyncio.run(ep.respond(chat.tokenizer.encode("hi")))
    assert info.value.reason == reason
    assert [(e["kind"], e["group"], e["seed"]) for e in events] == [(reason, "train0", 7)]
    assert "test_episodes.Env.step()" in events[0]["error"]


def test_a_reset_that_fails_or_returns_a_non_string_aborts(chat):
    for reset, message in [(lambda: {"x": 1}, "returned dict, not str"), (lambda: [][1], "Index")]:
        ep, events = episode(chat, Env(reset=reset))
        with pytest.raises(EpisodeAborted, match=message):
            asyncio.run(ep.start())
        assert events[0]["kind"] == "env_error"


def test_a_hanging_step_times_out_without_stalling_other_episodes(chat):
    import threading

    unblock = threading.Event()

    class Hangs(Env):
        async def step(self, action):
            await asyncio.sleep(3600)

    class Blocks:  # a plain, blocking function: it runs in a thread and can time out too
        system_prompt = "sys"
        success = False

        async def reset(self, seed):
            return "task"

        def step(self, action):
            unblock.wait(30)  # far past the timeout (released when the test ends)
            return StepResult("late", 0.0, True)

    async def main():
        eps = [episode(chat, Hangs(), timeout=0.2)[0], episode(chat, Blocks(), timeout=0.2)[0]]
        good = episode(chat, Env(step=lambda a: StepResult("ok", 1.0, True)), timeout=30.0)[0]
        for ep in [*eps, good]:
            await ep.start()
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(ep.respond(chat.tokenizer.encode("hi")) for ep in [*eps, good]),
            return_exceptions=True,
        )
        return results, time.perf_counter() - t0

    try:
        (hung, blocked, ok), seconds = asyncio.run(main())
    finally:
        unblock.set()
    assert isinstance(hung, EpisodeAborted) and hung.reason == "env_timeout"
    assert isinstance(blocked, EpisodeAborted) and blocked.reason == "env_timeout"
    assert "took more than 0.2 s" in str(hung) and ok == ([], 1.0, True)
    # Neither waited for the other, nor for the 30 s block (generous: a busy host is slow).
    assert seconds < 10


def test_slow_plain_steps_are_timed_from_when_they_run_and_hung_ones_hold_nothing(chat):
    """A batch's plain-function steps each run at once in their own thread: 40 steps that
    wait for one another (a barrier of 40) all finish (a shared pool of a few threads would
    never run them together: the barrier breaks), even beside calls that never return."""
    import threading

    release = threading.Event()
    together = threading.Barrier(40, timeout=20)

    class Slow:
        system_prompt = "sys"
        success = False

        def __init__(self, hang=False):
            self.hang = hang

        def reset(self, seed):
            return "task"

        def step(self, action):
            if self.hang:
                release.wait(30)  # hangs past the timeout (released when the test ends)
            else:
                together.wait()  # BrokenBarrierError (env_error) unless all 40 run at once
            return StepResult("done", 1.0, True)

    async def main():
        eps = [
            episode(chat, Slow(hang=k < 8), timeout=1.0 if k < 8 else 30.0)[0] for k in range(48)
        ]
        for ep in eps:
            await ep.start()
        return await asyncio.gather(
            *(ep.respond(chat.tokenizer.encode("hi")) for ep in eps), return_exceptions=True
        )

    try:
        results = asyncio.run(main())
    finally:
        release.set()
    hung, slow = results[:8], results[8:]
    assert all(isinstance(r, EpisodeAborted) and r.reason == "env_timeout" for r in hung)
    assert all(r == ([], 1.0, True) for r in slow)


def test_a_success_flag_that_raises_counts_as_a_failure_with_an_event(chat):
    class Broken(Env):
        @property
        def success(self):
            raise KeyError("score")

        @success.setter
        def success(self, value):
            pass

    ep, events = episode(chat, Broken(step=lambda a: StepResult("ok", 1.0, True)))
    assert ep.success is False
    assert (
        events[0]["kind"] == "env_error"
        and "success() on task seed 7 raised KeyError" in (events[0]["error"])
    )


def test_tools_are_offered_and_calls_answered_in_the_models_format(chat):
    """The calculator with tool_format=json: its tool in the system message (a template
    without tools), a valid call answered by call_tool, a malformed one explained, the
    answer judged by step, and max_turns counting tool turns."""
    from pearl.envs import make_env

    env = make_env("calculator", level="easy", tool_format="json", max_turns=3)
    ep, events = episode(chat, env)
    prompt = chat.tokenizer.decode(asyncio.run(ep.start()))
    assert '<tools>\n{"type": "function", "function": {"name": "calculate"' in prompt
    assert '<tool_call>\n{"name": "calculate", "arguments": {"expression": "12 * 7"}}' in prompt
    call = f'<tool_call>{{"name": "calculate", "arguments": {{"expression": "{env.problem.text}"}}}}</tool_call>'
    obs, reward, done = asyncio.run(ep.respond(chat.tokenizer.encode(call)))
    assert f"<tool_response>\n{env.problem.answer}\n</tool_response>" in chat.tokenizer.decode(obs)
    assert (reward, done, env.calls) == (0.0, False, 1)
    bad = '<tool_call>{"name": "calculate", "arguments": {"expr": "1"}}</tool_call>'
    obs, reward, done = asyncio.run(ep.respond(chat.tokenizer.encode(bad)))
    text = chat.tokenizer.decode(obs)
    assert (
        "could not be run: tool call 1 to calculate: missing required argument 'expression'" in text
    )
    assert (reward, done, env.calls, ep.malformed_calls) == (0.0, False, 1, 1)
    obs, reward, done = asyncio.run(ep.respond(chat.tokenizer.encode("<answer>0</answer>")))
    assert done and reward == (1.0 if env.problem.answer == 0 else 0.1)
    again, _ = episode(chat, make_env("calculator", tool_format="json", max_turns=2))
    asyncio.run(again.start())
    for _ in range(2):  # two malformed calls use the whole turn budget
        obs, reward, done = asyncio.run(again.respond(chat.tokenizer.encode(bad)))
    assert (obs, reward, done) == ([], 0.0, True) and events == []


def test_a_template_that_lays_out_tools_renders_the_prompt(chat):
    """A model whose chat template reads ``tools`` gets its own rendering (sandboxed Jinja,
    HF's tojson), checked to end in a ChatML assistant header."""
    from pearl.envs.calculator import CALCULATE
    from pearl.errors import ConfigError

    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if m.role == 'system' and tools %}\nTOOLS:{% for t in tools %} {{ t | tojson }}"
        "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    own = ChatFormat(chat.tokenizer, template)
    assert own.renders_tools and not chat.renders_tools
    text = own.tokenizer.decode(own.prompt("sys", "What is 1 + 1?", (), [CALCULATE]))
    # (trim_blocks, as Hugging Face renders: the newline after a block tag is dropped)
    assert text.startswith('<|im_start|>system\nsysTOOLS: {"type": "function", "function": ')
    assert text.endswith("<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n")
    assert own.prompt("sys", "hi") == chat.prompt("sys", "hi")  # no tools: ChatML as always
    broken = ChatFormat(chat.tokenizer, "{{ tools }}{% if add_generation_prompt %}A:{% endif %}")
    with pytest.raises(ConfigError, match="does not end a prompt with a ChatML assistant header"):
        broken.prompt("sys", "hi", (), [CALCULATE])


def test_the_environment_is_closed_once_and_a_failing_close_is_only_logged(chat):
    class Closing(Env):
        closes = 0

        def close(self):  # plain: runs in a thread like step
            type(self).closes += 1
            raise OSError("the sandbox is gone")

    ep, events = episode(chat, Closing(step=lambda a: StepResult("x", 1.0, True)))
    asyncio.run(ep.start())
    asyncio.run(ep.close())
    asyncio.run(ep.close())
    assert Closing.closes == 1
    assert [e["kind"] for e in events] == ["env_error"] and "close()" in events[0]["error"]
    quiet, _ = episode(chat, Env(step=lambda a: StepResult("x", 1.0, True)))
    asyncio.run(quiet.close())  # an environment without close(): nothing to do
