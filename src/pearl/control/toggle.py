"""Intra-scale toggle manager: borrows idle training GPUs for rollout between updates.

The overlap workers' processes stay alive across hand-offs; only device state moves
(the trainer releases its weights/optimizer state, a rollout worker restores its
weights and KV cache, and back). Borrowing happens after Training Finished, only if
the benefit gate says it pays; returning is mandatory and completes before the next
training step may start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from pearl.control.interfaces import RolloutWorker, Trainer, TurnOutput, WorkerRole
from pearl.control.rebuilder import InterScaleRebuilder
from pearl.control.state import SlotId, WorkerStatus
from pearl.errors import EngineStateError


class IntraScaleToggleManager:
    """Lends the overlap zone's rollout workers out and takes them back."""

    def __init__(
        self,
        rebuilder: InterScaleRebuilder,
        trainer: Trainer,
        training_slots: list[SlotId],
        overlap_workers: Mapping[SlotId, RolloutWorker],
        activate_s: float,
        deactivate_s: float,
        gate: Callable[[], bool] | None = None,
    ) -> None:
        self.rebuilder = rebuilder
        self.table = rebuilder.table
        self.trainer = trainer
        self.training_slots = list(training_slots)
        self.overlap = dict(overlap_workers)  # retained processes, device state released
        self.activate_s = activate_s
        self.deactivate_s = deactivate_s
        self.gate = gate
        self.borrowed = False
        self.rounds = 0
        self.skipped_by_gate = 0
        self.replaced = 0  # overlap workers restarted after dying
        self.toggle_seconds: list[float] = []  # per round: activation + give-back
        self.return_seconds: list[float] = []  # per round: the give-back alone

    async def borrow(
        self,
        roles_at_admission: Callable[[list[SlotId]], Mapping[SlotId, WorkerRole]] | None = None,
    ) -> bool:
        """After Training Finished: activate the overlap workers if the gate allows.
        ``roles_at_admission``, given the active set with the overlap workers, returns the
        roles to serve in (overlap and dedicated workers alike); default: all colocated."""
        if self.borrowed:
            return True
        if self.gate is not None and not self.gate():
            self.skipped_by_gate += 1
            return False
        snap = self.table.snapshot()
        joining = sorted(s for s in self.overlap if snap.slot(s).status is WorkerStatus.INACTIVE)
        if not joining:  # every overlap worker failed and is being replaced
            return False
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await self.trainer.release_device()
        self.table.set_statuses({s: WorkerStatus.INACTIVE for s in self.training_slots})
        final = dict(
            roles_at_admission(sorted(set(self.rebuilder.workers) | set(joining)))
            if roles_at_admission
            else {s: WorkerRole.COLOCATED for s in joining}
        )
        for slot_id in joining:
            role = final.pop(slot_id, WorkerRole.COLOCATED)
            if self.table.snapshot().slot(slot_id).role is not role:
                self.table.set_role(slot_id, role)
            if self.overlap[slot_id].role is not role:
                await self.overlap[slot_id].set_role(role)  # idle: nothing to hand back
        self.table.set_statuses({s: WorkerStatus.TRANSITIONING for s in joining})
        version = self.trainer.weight_version
        # Restoring device state: weights come from the trainer's latest snapshot.
        activated = await asyncio.gather(
            *(self._activate(s, version) for s in joining), return_exceptions=True
        )
        for outcome in activated:
            if isinstance(outcome, BaseException) and not isinstance(outcome, EngineStateError):
                raise outcome
        # A worker that died while activating stays out (its failure handler replaces it).
        joining = [s for s, o in zip(joining, activated, strict=True) if o is None]
        self.rebuilder.workers.update({s: self.overlap[s] for s in joining})
        if joining:
            self.table.set_statuses({s: WorkerStatus.ACTIVE for s in joining})
        if final:
            await self.rebuilder.reassign(final)
        self.rebuilder.route_or_hold()
        self.borrowed = True
        self.rounds += 1
        self.toggle_seconds.append(loop.time() - t0)
        return True

    async def _activate(self, slot_id: SlotId, version: int) -> None:
        worker = self.overlap[slot_id]
        await worker.sync_weights(version, self.activate_s)
        await worker.restore_device()

    def replace_failed(self, slot_id: SlotId) -> asyncio.Future:
        """The overlap worker of ``slot_id`` died (its slot is marked failed and, if it was
        serving, taken out): start a fresh process on the slot in the background, its device
        state released, for the next borrowing round (rounds skip the slot until then)."""

        async def replace() -> None:
            dead = self.overlap[slot_id]
            await self.rebuilder.factory.stop(slot_id, dead)
            snap = self.table.snapshot()
            worker = await self.rebuilder.factory.start(snap.slot(slot_id), WorkerRole.COLOCATED)
            await worker.release_device()  # the trainer may be using the devices now
            self.overlap[slot_id] = worker
            self.replaced += 1
            self.table.set_status(slot_id, WorkerStatus.INACTIVE)

        return asyncio.ensure_future(replace())

    async def give_back(self, roles: Mapping[SlotId, WorkerRole] | None = None) -> list[TurnOutput]:
        """Before Training Begin: stop routing to the overlap workers, abort their turns
        (they resume on dedicated workers), release device state, restore the trainer.
        ``roles`` switches dedicated workers in the same reconfiguration (e.g. the split
        chosen for the dedicated workers alone)."""
        if not self.borrowed:
            return []
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        slots = [s for s in self.overlap if s in self.rebuilder.workers]
        self.table.set_statuses({s: WorkerStatus.INACTIVE for s in slots})
        self.rebuilder.route_or_hold()
        for s in slots:
            del self.rebuilder.workers[s]
        switched, *partials = await asyncio.gather(
            self.rebuilder.reassign(roles or {}), *(self.overlap[s].abort_all() for s in slots)
        )
        self.rebuilder.route_or_hold()
        partials.append(switched)
        # Free their device state for the trainer; the processes stay (sleep, not stop).
        await asyncio.gather(*(self.overlap[s].release_device() for s in slots))
        await asyncio.sleep(self.deactivate_s)
        self.table.set_statuses({s: WorkerStatus.TRANSITIONING for s in self.training_slots})
        await self.trainer.restore_device()
        self.table.set_statuses({s: WorkerStatus.ACTIVE for s in self.training_slots})
        self.borrowed = False
        self.return_seconds.append(loop.time() - t0)
        if self.toggle_seconds:
            self.toggle_seconds[-1] += self.return_seconds[-1]
        return [p for group in partials for p in group]

    # Pipeline hooks: the Elastic Scheduler forwards Training Begin/Finished here.
    async def on_rollout_finished(self, step: int, result: object) -> None:
        pass

    async def on_training_begin(self, step: int) -> None:
        await self.give_back()

    async def on_training_finished(self, step: int, weight_version: int) -> None:
        await self.borrow()
