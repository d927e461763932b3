"""Virtual time: an asyncio event loop whose clock jumps to the next timer.

When no callback is ready, an ordinary event loop sleeps in ``select(timeout)``
until the earliest timer is due. This loop's selector instead advances the
loop's clock by ``timeout`` and returns at once, so ``asyncio.sleep(3600)`` takes
microseconds while every coroutine, timer and future behaves as in real time.
Async control-plane code therefore runs unchanged, and runs are deterministic.
"""

from __future__ import annotations

import asyncio
import gc
import math
import selectors
from asyncio import base_events
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from heapq import heapify, heappop, heappush
from typing import TypeVar

T = TypeVar("T")


class VirtualTimeDeadlock(RuntimeError):
    """Nothing is runnable and no timer is pending: the simulated world is stuck."""


def _resolution(now: float) -> float:
    """asyncio fires the timers due before ``time() + _clock_resolution``. A fixed 1e-9 s
    is lost in rounding once the clock passes ~1.7e7 s (2^24), and a timer due "now" then
    never fires: the loop spun forever. The tolerance is a few representable steps of the
    current time instead (1e-9 s near 0, 2.4e-7 s at 1e9 s)."""
    return max(1e-9, 4 * math.ulp(now))


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.loop: VirtualTimeLoop | None = None  # whose clock this is
        self.jumps = 0
        self.woken = False  # a thread queued a callback (VirtualTimeLoop._write_to_self)

    def select(self, timeout: float | None = None):
        # Real file descriptors are polled only before the clock jumps, and only when a
        # thread wrote to the loop's self-pipe (a thread-safe callback: it runs before
        # the clock moves on) or there are others: a poll per iteration was ~3% of a
        # simulated run, a poll per jump another ~3%.
        if timeout == 0:
            return []
        if self.woken or len(self.get_map()) > 1:  # a thread's callback, or real I/O
            self.woken = False
            events = super().select(0)
            if events:
                return events
        if timeout is None:
            raise VirtualTimeDeadlock(
                "virtual-time loop has nothing to run and no timer pending "
                "(a coroutine awaits something that can never happen); waiting tasks:\n"
                + _waiting_tasks()
            )
        # Far from 0 a tiny timeout can vanish in rounding (the float after 2e7 s is
        # 4e-9 s away): always move forward, by at least one representable step.
        self.now = max(self.now + timeout, math.nextafter(self.now, math.inf))
        self.jumps += 1
        if self.loop is not None:  # the clock moved: so does the loop's tolerance
            self.loop._clock_resolution = _resolution(self.now)
        return []


def _waiting_tasks(limit: int = 12) -> str:
    """Where each pending task of the running loop waits (its innermost coroutine)."""
    lines = []
    for task in list(asyncio.all_tasks())[:limit]:
        coro, where = task.get_coro(), "?"
        while coro is not None:
            frame = getattr(coro, "cr_frame", None)
            if frame is not None:
                where = f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}"
            coro = getattr(coro, "cr_await", None)
        lines.append(f"  {task.get_coro().__qualname__} waits at {where}")
    return "\n".join(lines)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on simulated seconds starting at ``start``."""

    def __init__(self, start: float = 0.0) -> None:
        selector = _JumpingSelector()
        selector.now = float(start)
        self._virtual = selector
        super().__init__(selector)
        # asyncio's own setting (the host clock's resolution) does not apply: the virtual
        # clock's (``_resolution``), a plain attribute the selector updates as it jumps
        # (asyncio reads it every loop iteration; a property here was ~1% of a run).
        self._clock_resolution = _resolution(selector.now)
        selector.loop = self

    def time(self) -> float:
        return self._virtual.now

    def call_at(self, when, callback, *args, context=None):
        """asyncio's ``call_at``, with the timer kept in the heap as ``(when, timer)``: the
        heap compares floats in C where asyncio calls ``TimerHandle.__lt__`` (Python) a
        dozen times a push or pop (~2.1 against ~0.7 us with 5,000 timers pending; a
        simulated turn sets ~5). The order is asyncio's exactly: the pairs compare as the
        timers do (by time; at equal times the timers, which answer not-less), so the
        heap's layout and its ties are the same."""
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()
        if self._debug:
            self._check_thread()
            self._check_callback(callback, "call_at")
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        if timer._source_traceback:
            del timer._source_traceback[-1]
        heappush(self._scheduled, (when, timer))
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        """One pass of the loop: asyncio's own (``BaseEventLoop._run_once``), step for step,
        on the heap of ``(when, timer)`` pairs, less what virtual time never needs: no poll
        when callbacks are ready (this selector answers ``select(0)`` with nothing), the
        clock read as an attribute, no event processing when no event came, and no timing
        of callbacks in debug mode (the virtual clock stands still while one runs, so
        asyncio's slow-callback warning could never fire). A simulated step runs ~12
        passes a turn, most with one callback each."""
        scheduled = self._scheduled
        count = len(scheduled)
        if (
            count > base_events._MIN_SCHEDULED_TIMER_HANDLES
            and self._timer_cancelled_count / count
            > base_events._MIN_CANCELLED_TIMER_HANDLES_FRACTION
        ):  # mostly cancelled timers: rebuilt without them, as asyncio does
            kept = []
            for entry in scheduled:
                if entry[1]._cancelled:
                    entry[1]._scheduled = False
                else:
                    kept.append(entry)
            heapify(kept)
            self._scheduled = scheduled = kept
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][1]._cancelled:
                self._timer_cancelled_count -= 1
                heappop(scheduled)[1]._scheduled = False
        ready = self._ready
        clock = self._virtual
        if not ready and not self._stopping:
            timeout = None
            if scheduled:
                timeout = min(
                    max(0, scheduled[0][0] - clock.now), base_events.MAXIMUM_SELECT_TIMEOUT
                )
            events = clock.select(timeout)
            if events:
                self._process_events(events)
        end_time = clock.now + self._clock_resolution
        while scheduled:
            if scheduled[0][0] >= end_time:
                break
            handle = heappop(scheduled)[1]
            handle._scheduled = False
            ready.append(handle)
        debug = self._debug
        for _ in range(len(ready)):
            handle = ready.popleft()
            if handle._cancelled:
                continue
            if debug:  # what asyncio's handlers read in debug mode
                self._current_handle = handle
                try:
                    handle._run()
                finally:
                    self._current_handle = None
            else:
                handle._run()

    def _write_to_self(self) -> None:
        self._virtual.woken = True  # before the byte: the selector polls for it
        super()._write_to_self()

    @property
    def timer_jumps(self) -> int:
        """How many times the clock jumped forward (a measure of simulated events)."""
        return self._virtual.jumps


@contextmanager
def sparse_gc(young_threshold: int = 4_000_000) -> Iterator[None]:
    """Run cyclic garbage collection rarely while a simulation runs.

    A simulated run allocates millions of short-lived objects and keeps 10^5-10^7
    alive (contexts, block tables, cached pieces); with CPython's default thresholds
    (a young collection every 700 allocations) the collector took ~30% of a run. A young
    collection also reads every object its young objects refer to, most of them cold in a
    large fleet: at 512 workers (one step, ``gc.callbacks`` timing) collecting every
    10^5 allocations spent 9.2 s in young collections, every 10^6 0.7 s (12.0 s against
    5.6 s in all; most short-lived objects die before a collection sees them). At 10^6 the
    step still ran 7 middle and 1 full collection (4.6 s of 123 s, on CPython's allocator);
    at 4 x 10^6 none, with the same peak memory (706 MB) and digest (CPython counts
    tracked objects allocated less those freed; a step's count stays under that). Unlike
    ``gc.disable()`` this keeps memory bounded on long runs (benchmarks/sim_scale.py's
    memory over 57 steps)."""
    old = gc.get_threshold()
    gc.set_threshold(young_threshold, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def run_virtual(main: Callable[[], Awaitable[T]], start: float = 0.0) -> tuple[T, float]:
    """Run ``main()`` to completion in virtual time; return its result and the end time."""
    loop = VirtualTimeLoop(start)
    try:
        with sparse_gc():
            result = loop.run_until_complete(main())
        return result, loop.time()
    finally:
        loop.close()
