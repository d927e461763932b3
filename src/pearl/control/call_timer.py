"""Driver-side timing of the calls a router makes to its workers, in either world.

A ``TimedWorker`` wraps a worker handle and records, per call, its driver-side duration
on the running loop's clock (wall clock live, virtual time in the simulator) and, for
turn calls, the engine-side latency the worker reported. Their difference, a turn call's
*gap*, is what the call cost outside the engine: the RPC round trip and the wait for the
worker's event loop.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass

TIMED = ("generate", "prefill", "decode", "match_session", "session_length", "release_session")
TURN_CALLS = ("generate", "prefill", "decode")


@dataclass(slots=True, frozen=True)
class Call:
    name: str
    seconds: float  # driver side
    engine_s: float | None  # engine side (submitted -> finished), turn calls only

    @property
    def gap_s(self) -> float | None:
        return None if self.engine_s is None else self.seconds - self.engine_s


class TimedWorker:
    """A worker handle that records every call in ``TIMED`` into ``calls``; other
    attributes pass through."""

    def __init__(self, inner, calls: list[Call]) -> None:
        self._inner, self._calls = inner, calls

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in TIMED:
            return attr

        async def timed(*args, **kwargs):
            clock = asyncio.get_running_loop()
            t0 = clock.time()
            out = await attr(*args, **kwargs)
            seconds = clock.time() - t0
            engine_s = None
            if name in TURN_CALLS:
                engine_s = out.telemetry.finished_at - out.telemetry.submitted_at
            self._calls.append(Call(name, seconds, engine_s))
            return out

        return timed


def median_gap(calls: list[Call]) -> float | None:
    """Median gap of the turn calls (None if there were none)."""
    gaps = [c.gap_s for c in calls if c.gap_s is not None]
    return statistics.median(gaps) if gaps else None
