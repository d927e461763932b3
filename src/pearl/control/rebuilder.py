"""Inter-scale cluster rebuilder: executes plans for preemptible GPUs.

Shrinking is urgent and cheap: the leaving workers stop receiving turns at once (the
table marks them inactive and the router forgets them), their in-flight turns are
aborted and resume on the remaining workers from the tokens already generated, and
their GPUs are returned. Expansion is expensive and deferrable: new workers
initialize in the background while the others serve, receive the latest weights
once up (lazy propagation), and are admitted all at once; if any of them fails to
initialize, the whole expansion is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Protocol

from pearl.control.interfaces import RolloutWorker, TurnOutput, WorkerRole
from pearl.control.router import Router
from pearl.control.state import SlotId, WorkerSlot, WorkerStatus, WorkerTable
from pearl.errors import EngineStateError


class WorkerFactory(Protocol):
    """Starts and stops the process behind a worker slot (a world's business)."""

    async def start(self, slot: WorkerSlot, role: WorkerRole) -> RolloutWorker:
        """Prepare a worker on the slot's GPUs (takes the preparation latency); may raise."""

    async def stop(self, slot_id: SlotId, worker: RolloutWorker) -> None:
        """Release the slot's process and GPUs."""


class InterScaleRebuilder:
    """Owns the rollout worker handles; keeps the router in line with the table."""

    def __init__(
        self,
        table: WorkerTable,
        router: Router,
        factory: WorkerFactory,
        weight_version: Callable[[], int],
        sync_seconds: Callable[[int], float],
        finalize_s: float = 0.0,
    ) -> None:
        self.table = table
        self.router = router
        self.factory = factory
        self.weight_version = weight_version
        self.sync_seconds = sync_seconds
        self.finalize_s = finalize_s
        self.workers: dict[SlotId, RolloutWorker] = {}
        self.expansions_cancelled = 0
        # Shrinks that took out a worker serving turns (their turns were cut short and
        # resume elsewhere); workers taken out (availability or failure), and the busy ones.
        self.busy_shrinks = 0
        self.workers_shrunk = 0
        self.busy_workers_shrunk = 0
        self.turns_cut_by_shrinks = 0

    def apply_topology(self) -> None:
        """Route to exactly the table's active rollout workers, by role."""
        snap = self.table.snapshot()
        pick = lambda role: [self.workers[s] for s in snap.routable(role) if s in self.workers]  # noqa: E731
        self.router.set_topology(
            colocated=pick(WorkerRole.COLOCATED),
            prefill=pick(WorkerRole.PREFILL),
            decode=pick(WorkerRole.DECODE),
        )

    def route_or_hold(self) -> None:
        """``apply_topology``, or route to no one while a reconfiguration leaves the active
        set without a valid topology (e.g. prefill workers but no decode worker yet): turns
        wait in the router until the reconfiguration completes."""
        try:
            self.apply_topology()
        except ValueError:
            self.router.set_topology()

    async def shrink(
        self, leaving: list[SlotId], roles: Mapping[SlotId, WorkerRole] | None = None
    ) -> list[TurnOutput]:
        """Take ``leaving`` out now and, in the same reconfiguration, switch the survivors in
        ``roles`` to their new roles; return the partial outputs of the cut-short turns."""
        leaving = [s for s in leaving if s in self.workers]
        if not leaving:
            return await self.reassign(roles or {})
        snap = self.table.snapshot()
        stopping = {  # a failed slot stays marked failed
            s: WorkerStatus.INACTIVE
            for s in leaving
            if snap.slot(s).status is not WorkerStatus.FAILED
        }
        if stopping:
            self.table.set_statuses(stopping)
        self.route_or_hold()  # first stop routing, so resumed turns land elsewhere
        handles = [self.workers.pop(s) for s in leaving]
        aborted = asyncio.gather(*(_abort_all(w) for w in handles))
        switched, partials = await asyncio.gather(self.reassign(roles or {}), aborted)
        busy = sum(1 for group in partials if group)
        self.busy_shrinks += int(busy > 0)
        self.workers_shrunk += len(handles)
        self.busy_workers_shrunk += busy
        self.turns_cut_by_shrinks += sum(len(group) for group in partials)
        await asyncio.gather(
            *(self.factory.stop(s, w) for s, w in zip(leaving, handles, strict=True))
        )
        self.route_or_hold()
        return switched + [p for group in partials for p in group]

    async def expand(
        self,
        joining: Mapping[SlotId, WorkerRole],
        roles_at_admission: Callable[[list[SlotId]], Mapping[SlotId, WorkerRole]] | None = None,
        admission_lock: asyncio.Lock | None = None,
    ) -> bool:
        """Start ``joining`` workers in the background and admit them together; False (and
        nothing admitted) if any fails to start. ``roles_at_admission``, given the active set
        after admission, returns the roles to take then (joiners and survivors alike), so a
        mode or ratio change lands together with the admission; ``admission_lock`` is held
        while admitting (the caller's lock on reconfigurations)."""
        if not joining:
            return True
        handles = await self._start_joiners(joining)
        if handles is None:
            return False
        # Lazy weight propagation: the newest snapshot, once the workers are up.
        version = self.weight_version()
        seconds = self.sync_seconds(len(handles))
        lock = admission_lock or contextlib.nullcontext()
        try:
            await asyncio.gather(*(w.sync_weights(version, seconds) for w in handles.values()))
            await asyncio.sleep(self.finalize_s)
            await lock.__aenter__()
            # A newer version may have been trained meanwhile (the regular sync reaches only
            # active workers): catch up before admission, so no turn runs on stale weights.
            version = await self._catch_up(handles, version, seconds)
        except asyncio.CancelledError:
            await self._abandon(joining, handles)
            raise
        # Atomic admission (no other reconfiguration meanwhile): every joiner becomes active
        # in one table update; from here on the joiners are ordinary active workers.
        try:
            await asyncio.shield(self._admit(handles, roles_at_admission, version, seconds))
        finally:
            await lock.__aexit__(None, None, None)
        return True

    async def _start_joiners(
        self, joining: Mapping[SlotId, WorkerRole]
    ) -> dict[SlotId, RolloutWorker] | None:
        """Start ``joining`` with their roles (marked transitioning); their handles, or
        None if any failed to start (the others stopped, all inactive again). Cancelled
        meanwhile (a shrink overtook the expansion), the started ones are stopped too."""
        snap = self.table.snapshot()
        for slot_id, role in joining.items():
            if snap.slot(slot_id).role is not role:
                self.table.set_role(slot_id, role)
        self.table.set_statuses({s: WorkerStatus.TRANSITIONING for s in joining})
        snap = self.table.snapshot()
        starts = [
            asyncio.ensure_future(self.factory.start(snap.slot(s), r)) for s, r in joining.items()
        ]
        try:
            results = await asyncio.gather(*starts, return_exceptions=True)
        except asyncio.CancelledError:
            # All-or-nothing: nothing joins.
            for task in starts:
                task.cancel()
            started = {
                slot_id: task.result()
                for slot_id, task in zip(joining, starts, strict=True)
                if task.done() and not task.cancelled() and task.exception() is None
            }
            await self._abandon(joining, started)
            raise
        handles = {
            s: r for s, r in zip(joining, results, strict=True) if not isinstance(r, BaseException)
        }
        if len(handles) < len(joining):
            await self._abandon(joining, handles)
            return None
        return handles

    async def _abandon(
        self, joining: Mapping[SlotId, WorkerRole], started: Mapping[SlotId, RolloutWorker]
    ) -> None:
        """An expansion given up: the workers it started stopped, every joiner inactive."""
        self.expansions_cancelled += 1
        for slot_id, worker in started.items():
            await self.factory.stop(slot_id, worker)
        self.table.set_statuses({s: WorkerStatus.INACTIVE for s in joining})

    async def _catch_up(
        self, handles: Mapping[SlotId, RolloutWorker], version: int, seconds: float
    ) -> int:
        """Install on ``handles`` (holding ``version``) every newer version trained since;
        returns with no await after its last check: the version they hold."""
        while (latest := self.weight_version()) > version:
            version = latest
            await asyncio.gather(*(w.sync_weights(version, seconds) for w in handles.values()))
        return version

    async def _admit(
        self,
        handles: Mapping[SlotId, RolloutWorker],
        roles_at_admission: Callable[[list[SlotId]], Mapping[SlotId, WorkerRole]] | None,
        version: int,
        seconds: float,
    ) -> None:
        final = (
            dict(roles_at_admission(sorted(set(self.workers) | set(handles))))
            if roles_at_admission
            else {}
        )
        snap = self.table.snapshot()
        for slot_id, worker in handles.items():
            role = final.pop(slot_id, None)
            if role is not None and role is not snap.slot(slot_id).role:
                self.table.set_role(slot_id, role)
                await worker.set_role(role)  # idle until admitted: nothing to hand back
        # The regular sync reaches active workers only: a version trained while the joiners
        # switched role is theirs to install now. No await between the last check and the
        # joiners becoming active, so a sync that starts later finds them among its receivers.
        await self._catch_up(handles, version, seconds)
        self.workers.update(handles)
        self.table.set_statuses({s: WorkerStatus.ACTIVE for s in handles})
        if final:
            await self.reassign(final)  # routes to the new topology once roles have switched
        self.route_or_hold()

    async def reassign(self, roles: Mapping[SlotId, WorkerRole]) -> list[TurnOutput]:
        """Change the roles of active workers (a mode or P:D ratio switch). They leave the
        router, hand back in-flight turns (which resume on the new topology), switch role
        and return together; returns the handed-back partial outputs."""
        snap = self.table.snapshot()
        changes = {
            s: r for s, r in roles.items() if s in self.workers and snap.slot(s).role is not r
        }
        if not changes:
            return []
        self.table.set_statuses({s: WorkerStatus.TRANSITIONING for s in changes})
        for slot_id, role in changes.items():
            self.table.set_role(slot_id, role)
        # Route to the workers that keep their role while the others switch; if that leaves
        # the topology invalid (e.g. no decode worker yet), route to none until the switch ends.
        self.route_or_hold()
        results = await asyncio.gather(
            *(self.workers[s].set_role(r) for s, r in changes.items()), return_exceptions=True
        )
        partials: list[TurnOutput] = []
        for result in results:
            if isinstance(result, EngineStateError):
                # It died meanwhile (two failures at once): its own failure, reported when
                # the call found it dead, takes it out; nothing of it to hand back.
                continue
            if isinstance(result, BaseException):
                raise result
            partials.extend(result)
        self.table.set_statuses({s: WorkerStatus.ACTIVE for s in changes})
        self.route_or_hold()
        return partials


async def _abort_all(worker) -> list[TurnOutput]:
    """The worker's cut-short turns; none if it already stopped (crashed or was killed:
    its callers got their turns back aborted and resume them)."""
    try:
        return await worker.abort_all()
    except EngineStateError:
        return []
