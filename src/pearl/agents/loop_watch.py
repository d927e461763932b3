"""Names the agent that blocks the run's event loop.

An ``async def`` agent that makes a blocking call (``openai.OpenAI`` instead of
``AsyncOpenAI``, ``requests``, ``time.sleep``) stops every episode and the endpoint until
the call returns, and no timeout can fire meanwhile. The loop cannot report this itself
while it is blocked, so a daemon thread does: the loop stamps a heartbeat every
``interval_s``; when the stamp is older than ``threshold_s``, the thread looks at the
loop thread's stack, and if one of the registered agents' functions is on it, logs one
warning for that agent (once per agent for the run), with where it blocks.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any

log = logging.getLogger(__name__)


def agent_name(fn: Any) -> str:
    """``module.qualname`` of an agent function, as errors and warnings name it."""
    target = getattr(fn, "func", fn)  # a functools.partial
    module = getattr(target, "__module__", None) or "?"
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{name}"


class LoopWatch:
    """Watches the event loop it is started in (``start`` there; ``stop`` ends it)."""

    def __init__(self, threshold_s: float = 1.0, interval_s: float = 0.1) -> None:
        self.threshold_s, self.interval_s = threshold_s, interval_s
        self._agents: dict[CodeType, str] = {}  # the agents' code -> their names
        self.warned: set[str] = set()
        self._beat = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, agent: Any) -> None:
        """Watch for ``agent`` (a function, partial or callable object) on the loop's stack."""
        target = getattr(agent, "func", agent)
        code = getattr(target, "__code__", None) or getattr(
            inspect.getattr_static(type(target), "__call__", None),
            "__code__",
            None,  # a callable object
        )
        if code is not None:
            self._agents[code] = agent_name(agent)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stopped.clear()
        self._tick()
        self._thread = threading.Thread(target=self._watch, name="pearl-loop-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._beat = time.monotonic()
        assert self._loop is not None
        self._timer = self._loop.call_later(self.interval_s, self._tick)

    def _watch(self) -> None:
        while not self._stopped.wait(self.interval_s):
            stalled = time.monotonic() - self._beat
            if stalled < self.threshold_s:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            found = self._agent_on(frame)
            if found is None or found[0] in self.warned:
                continue
            name, where = found
            self.warned.add(name)
            log.warning(
                "agent %s has blocked the event loop for %.1f s (at %s): every episode and "
                "the agent endpoint wait meanwhile, and no timeout can fire. It makes a "
                "blocking call in an `async def`: use an async client (openai.AsyncOpenAI, "
                "httpx.AsyncClient) or asyncio.to_thread, or write the agent as a plain "
                "`def`, which runs in a thread of its own",
                name,
                stalled,
                where,
            )

    def _agent_on(self, frame: FrameType | None) -> tuple[str, str] | None:
        """(the agent's name, where the loop thread is now) if an agent is on its stack."""
        innermost = frame
        while frame is not None:
            name = self._agents.get(frame.f_code)
            if name is not None:
                assert innermost is not None
                code = innermost.f_code
                return name, f"{code.co_filename}:{innermost.f_lineno} in {code.co_name}"
            frame = frame.f_back
        return None
