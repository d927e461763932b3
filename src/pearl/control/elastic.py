"""The Elastic Scheduler: turns availability events into minimal topology changes.

Every event goes through the same stages: (1) update the rollout GPU budget, (2)
decide the mode and role counts, (3) plan the change, (4) let the executor carry it
out. Shrinks run at once; expansions run in the background and are cancelled as a
whole if a later shrink takes GPUs they were preparing. Intra-scale borrowing is
driven by the pipeline's Training Begin / Finished events (``IntraScaleToggleManager``).

This version decides colocated topologies only (RLBoost+-style inter-scale
elasticity); the adaptive PD policy plugs in through ``decide``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from pearl.control.interfaces import Clock, WorkerRole
from pearl.control.rebuilder import InterScaleRebuilder
from pearl.control.state import SlotId


@dataclass(slots=True)
class ElasticEvent:
    at: float
    preemptible_gpus: int
    workers_before: int
    workers_target: int
    left: tuple[SlotId, ...]
    joining: tuple[SlotId, ...]


class ElasticScheduler:
    """Reserved slots always serve; preemptible slots follow the availability budget."""

    def __init__(
        self,
        rebuilder: InterScaleRebuilder,
        reserved: list[SlotId],
        preemptible: list[SlotId],
        gpus_per_worker: int,
        clock: Clock,
        decide: Callable[[int], dict[SlotId, WorkerRole]] | None = None,
    ) -> None:
        self.rebuilder = rebuilder
        self.reserved = list(reserved)
        self.preemptible = list(preemptible)
        self.gpus_per_worker = gpus_per_worker
        self.clock = clock
        self.decide = decide or (lambda n: {})
        self.events: list[ElasticEvent] = []
        self._expansion: asyncio.Task[bool] | None = None
        self._expanding: set[SlotId] = set()

    async def start(self) -> None:
        """Bring up the reserved workers (blocking: nothing can run without them)."""
        await self.rebuilder.expand({s: WorkerRole.COLOCATED for s in self.reserved})

    async def on_availability(self, preemptible_gpus: int) -> None:
        """Stage 1-4 for a change in the number of preemptible GPUs."""
        budget = min(len(self.preemptible), max(0, preemptible_gpus) // self.gpus_per_worker)
        target = set(self.reserved) | set(self.preemptible[:budget])
        active = set(self.rebuilder.workers)
        if self._expansion is not None and not self._expansion.done() and self._expanding - target:
            self._expansion.cancel()  # GPUs being prepared were reclaimed: cancel the whole group
            try:
                await self._expansion
            except asyncio.CancelledError:
                pass
        leaving = sorted(active - target)
        in_flight = (
            self._expanding if self._expansion is not None and not self._expansion.done() else set()
        )
        joining = sorted(target - active - in_flight)
        self.events.append(
            ElasticEvent(
                self.clock.now(),
                preemptible_gpus,
                len(active),
                len(target),
                tuple(leaving),
                tuple(joining),
            )
        )
        if leaving:
            await self.rebuilder.shrink(leaving)
        if joining:
            roles = {s: WorkerRole.COLOCATED for s in joining}
            roles.update({s: r for s, r in self.decide(len(target)).items() if s in roles})
            self._expanding = set(joining)
            self._expansion = asyncio.ensure_future(self.rebuilder.expand(roles))

    async def replay(self, changes: list[tuple[float, int]], until: float | None = None) -> None:
        """Feed ``(time, preemptible GPUs)`` changes at their times (relative to now)."""
        start = self.clock.now()
        for at, gpus in changes:
            if until is not None and at >= until:
                break
            await self.clock.sleep(max(0.0, start + at - self.clock.now()))
            await self.on_availability(gpus)

    async def settle(self) -> None:
        """Wait for a background expansion to finish (end of a run)."""
        if self._expansion is not None:
            try:
                await self._expansion
            except asyncio.CancelledError:
                pass
