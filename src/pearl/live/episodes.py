"""Text environments as token-level episodes: the model's reply is decoded for the
environment, its observation encoded in ChatML for the model.

The environment is someone else's code: every call is timed out (``step_timeout_s``),
its answer's type is checked, and an exception, a wrong type or a timeout ends the
episode (``EpisodeAborted``: reward 0, not trained on) with an ``env_error`` event instead
of ending the run. ``reset`` and ``step`` may be coroutines or plain functions (a plain one
runs in a thread, so a slow one does not stall the other episodes and can time out).

An environment that declares ``tools`` (``pearl.envs.tools``) gets them offered in the
model's own format; a reply with tool calls is answered here, by ``call_tool(name,
arguments)`` for each valid call (the results as ``<tool_response>`` blocks) or by an
observation that says what was wrong with a malformed one; a reply without calls goes to
``step``. With tools, the environment's ``max_turns`` bounds every turn, tool turns included.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

from pearl.control.episode import STOP_ENV_ERROR, STOP_ENV_TIMEOUT, EpisodeAborted
from pearl.envs.base import Environment, StepResult
from pearl.envs.tools import check_tools, parse_tool_calls, tool_response
from pearl.models.chat import ChatFormat


class TextEpisode:
    """One trajectory of ``env`` on task ``seed``; ``group`` names the task (GRPO groups)."""

    def __init__(
        self,
        env: Environment,
        seed: int,
        chat: ChatFormat,
        group: str,
        step_timeout_s: float | None = None,
        log: Callable[[dict], None] | None = None,
    ) -> None:
        self.env = env
        self.seed = seed
        self.chat = chat
        self.group = group
        self.step_timeout_s = step_timeout_s
        self.log = log
        self.env_seconds: list[float] = []  # per environment call
        declared = getattr(env, "tools", None)
        self.tools = check_tools(declared, type(env).__qualname__) if declared else None
        self.turns = 0
        self.tool_calls = 0
        self.malformed_calls = 0
        self.closed = False

    async def start(self) -> list[int]:
        first = await self._call("reset", self.seed)
        if not isinstance(first, str):
            self._fail("reset", STOP_ENV_ERROR, f"returned {type(first).__name__}, not str")
        demonstration = tuple(getattr(self.env, "demonstration", ()))
        return self.chat.prompt(self.env.system_prompt, first, demonstration, self.tools)

    async def respond(self, reply: list[int]) -> tuple[list[int], float, bool]:
        self.turns += 1
        text = self.chat.text(reply)
        if self.tools:
            calls, errors = parse_tool_calls(text, self.tools)
            if calls or errors:
                observation = await self._tool_turn(calls, errors)
                if self._out_of_turns():
                    return [], 0.0, True
                return self.chat.next_turn(reply, observation), 0.0, False
        result = await self._call("step", text)
        if not isinstance(result, StepResult):
            result = _as_step_result(result)
            if result is None:
                self._fail("step", STOP_ENV_ERROR, "did not return a StepResult")
        assert result is not None
        if not isinstance(result.observation, str) or not _is_number(result.reward):
            self._fail(
                "step",
                STOP_ENV_ERROR,
                f"returned observation {type(result.observation).__name__} and reward "
                f"{type(result.reward).__name__}; expected str and a finite number",
            )
        if result.done or (self.tools and self._out_of_turns()):
            return [], float(result.reward), True
        return self.chat.next_turn(reply, result.observation), float(result.reward), False

    async def _tool_turn(self, calls, errors: list[str]) -> str:
        """The observation answering a reply's tool calls: every result, or what was wrong."""
        if errors:
            self.malformed_calls += len(errors)
            return (
                f"Your tool call could not be run: {'; '.join(errors)}. Call a tool as "
                '<tool_call>{"name": "NAME", "arguments": {...}}</tool_call>.'
            )
        results = []
        for call in calls:
            self.tool_calls += 1
            out = await self._call("call_tool", call.name, call.arguments)
            if not isinstance(out, str):
                self._fail("call_tool", STOP_ENV_ERROR, f"returned {type(out).__name__}, not str")
            results.append(tool_response(out))
        return "\n".join(results)

    def _out_of_turns(self) -> bool:
        limit = getattr(self.env, "max_turns", None)
        return isinstance(limit, int) and self.turns >= limit

    async def close(self) -> None:
        """The environment's ``close()``, where it has one (a sandbox to end), once the
        episode is over however it ended; a failing or slow one is logged, never raised."""
        if getattr(self.env, "close", None) is None or self.closed:
            return
        self.closed = True
        try:
            await self._call("close")
        except EpisodeAborted:  # logged as an event by _call; the trajectory is already done
            pass

    @property
    def success(self) -> bool:
        """The environment's success flag; one that cannot be read counts as a failure
        (an ``env_error`` event says why), never as the run's end."""
        try:
            return bool(self.env.success)
        except Exception as exc:
            try:
                self._fail("success", STOP_ENV_ERROR, f"raised {type(exc).__name__}: {exc}")
            except EpisodeAborted:
                pass
            return False

    async def _call(self, method: str, *args: Any) -> Any:
        fn = getattr(self.env, method)
        t0 = time.perf_counter()
        try:
            if inspect.iscoroutinefunction(fn):
                call = fn(*args)
            else:
                call = _in_thread(fn, *args)
            out = await asyncio.wait_for(call, self.step_timeout_s)
            if inspect.isawaitable(out):  # a plain function that returned a coroutine
                out = await asyncio.wait_for(out, self.step_timeout_s)
            return out
        except TimeoutError as exc:
            if self.step_timeout_s is None:  # the environment's own timeout
                self._fail(method, STOP_ENV_ERROR, f"raised TimeoutError: {exc}")
            self._fail(method, STOP_ENV_TIMEOUT, f"took more than {self.step_timeout_s:g} s")
        except EpisodeAborted:
            raise
        except Exception as exc:  # the environment's own bug: this episode ends, the run goes on
            self._fail(method, STOP_ENV_ERROR, f"raised {type(exc).__name__}: {exc}")
        finally:
            self.env_seconds.append(time.perf_counter() - t0)

    def _fail(self, method: str, reason: str, what: str) -> None:
        name = f"{type(self.env).__module__}.{type(self.env).__qualname__}"
        message = f"environment {name}.{method}() on task seed {self.seed} {what}"
        if self.log is not None:
            self.log({"kind": reason, "group": self.group, "seed": self.seed, "error": message})
        raise EpisodeAborted(reason, message)


def _in_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future:
    """``fn(*args)`` in a thread of its own, started now (so a timeout counts from when
    the call runs, not from a queue in a shared pool); a daemon thread, so that a call that
    never returns holds neither other episodes' calls nor the process's exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(outcome: Any, error: BaseException | None) -> None:
        if future.done():  # timed out and cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(outcome)

    def run() -> None:
        try:
            outcome, error = fn(*args), None
        except BaseException as exc:  # handed to the episode, which decides
            outcome, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, outcome, error)
        except RuntimeError:  # the loop is closed: nobody waits for this call any more
            pass

    threading.Thread(target=run, name=f"env-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future


def _is_number(value: Any) -> bool:
    try:
        return value == value and abs(float(value)) != float("inf")
    except (TypeError, ValueError):
        return False


def _as_step_result(value: Any) -> StepResult | None:
    """A ``(observation, reward, done[, info])`` tuple as a StepResult (None otherwise)."""
    if isinstance(value, tuple) and len(value) in (3, 4):
        info = value[3] if len(value) == 4 and isinstance(value[3], dict) else {}
        return StepResult(value[0], value[1], bool(value[2]), info)
    return None
