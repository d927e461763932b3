"""The GPU–worker–role table ``M = {w -> (G_w, R_w, a_w)}``: one source of truth for who serves.

Each worker occupies a stable slot ``w`` (an int, never renumbered, never reused) bound for
its lifetime to a fixed GPU set ``G_w``; only its role ``R_w`` and status ``a_w`` change.
Two zones: the *dedicated* rollout zone (grows and shrinks with preemptible GPUs) and the
*overlap* zone (training GPUs: a training slot, and overlap rollout slots that time-share
its GPUs while training is idle).

Single writer, no lock: the Elastic Scheduler is the only component that mutates a
``WorkerTable``; everyone else (router, executors, pipeline) reads immutable
``TableSnapshot``s. Every mutation is synchronous (no ``await`` inside), so under asyncio it
is atomic: it validates, then commits as a whole and bumps ``version`` once, or raises and
leaves the table unchanged. A reader holding a snapshot can compare its ``version`` to the
table's to know it is stale.
"""

from __future__ import annotations

import enum
import numbers
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from pearl.control.interfaces import WorkerRole
from pearl.errors import PearlError

SlotId = int
"""A stable worker slot identifier ``w``."""

ROLLOUT_ROLES: tuple[WorkerRole, ...] = (
    WorkerRole.COLOCATED,
    WorkerRole.PREFILL,
    WorkerRole.DECODE,
)
"""The roles a rollout worker can take (everything but ``TRAINING``), in a fixed order."""


class WorkerStateError(PearlError, ValueError):
    """A table operation is invalid (unknown slot, bad transition, broken invariant)."""


class WorkerStatus(enum.StrEnum):
    """``a_w``: whether the worker is in the active set ``W``."""

    ACTIVE = "active"  # serves requests (rollout) or holds its GPUs (training)
    INACTIVE = "inactive"  # process may live, but serves nothing and holds no device state
    TRANSITIONING = "transitioning"  # joining, leaving or being reassigned: drain or init first
    FAILED = "failed"  # its process died: serves and holds nothing until restarted or released


class Zone(enum.StrEnum):
    """Which pool a slot's GPUs belong to."""

    DEDICATED = "dedicated"  # rollout GPUs: reserved plus preemptible ones that come and go
    OVERLAP = "overlap"  # training GPUs: training slots plus the rollout slots that borrow them


class Mode(enum.StrEnum):
    """Execution mode of the rollout pool."""

    COLOCATED = "colocated"
    DISAGGREGATED = "disaggregated"


# a_w transitions: activation always goes through TRANSITIONING (init, weight sync, role
# rebinding); deactivation may skip it, because an inter-scale shrink returns GPUs at once.
# A worker that dies (serving, starting, or a retained idle process) is FAILED until its
# slot restarts or is released.
_ALLOWED_STATUS_CHANGES: dict[WorkerStatus, frozenset[WorkerStatus]] = {
    WorkerStatus.INACTIVE: frozenset({WorkerStatus.TRANSITIONING, WorkerStatus.FAILED}),
    WorkerStatus.TRANSITIONING: frozenset(
        {WorkerStatus.ACTIVE, WorkerStatus.INACTIVE, WorkerStatus.FAILED}
    ),
    WorkerStatus.ACTIVE: frozenset(
        {WorkerStatus.TRANSITIONING, WorkerStatus.INACTIVE, WorkerStatus.FAILED}
    ),
    WorkerStatus.FAILED: frozenset({WorkerStatus.TRANSITIONING, WorkerStatus.INACTIVE}),
}


@dataclass(slots=True, frozen=True)
class Topology:
    """Role counts ``pi = (N_P, N_D, N_C)`` of the active rollout workers.

    Any non-negative counts are representable (a shrink can leave ``4P0D``); ``is_valid``
    says whether it is a servable mode: fully colocated, or disaggregated with N_P, N_D >= 1.
    """

    prefill: int = 0  # N_P
    decode: int = 0  # N_D
    colocated: int = 0  # N_C

    def __post_init__(self) -> None:
        for name in ("prefill", "decode", "colocated"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"Topology.{name} must be an int >= 0, got {value!r}")

    @classmethod
    def colocation(cls, workers: int) -> Topology:
        """``N_C = workers``, ``N_P = N_D = 0``."""
        return cls(colocated=workers)

    @classmethod
    def split(cls, prefill: int, decode: int) -> Topology:
        """Disaggregated ``N_P : N_D``."""
        return cls(prefill=prefill, decode=decode)

    @classmethod
    def from_counts(cls, counts: Mapping[WorkerRole, int]) -> Topology:
        """From role counts; ``TRAINING`` must be absent or zero."""
        if counts.get(WorkerRole.TRAINING, 0):
            raise ValueError(f"a rollout topology has no training workers, got counts {counts}")
        return cls(
            prefill=counts.get(WorkerRole.PREFILL, 0),
            decode=counts.get(WorkerRole.DECODE, 0),
            colocated=counts.get(WorkerRole.COLOCATED, 0),
        )

    @property
    def num_workers(self) -> int:
        """``N_P + N_D + N_C``."""
        return self.prefill + self.decode + self.colocated

    @property
    def mode(self) -> Mode | None:
        """The mode the counts belong to; ``None`` when mixed or empty."""
        if self.colocated and not (self.prefill or self.decode):
            return Mode.COLOCATED
        if (self.prefill or self.decode) and not self.colocated:
            return Mode.DISAGGREGATED
        return None

    @property
    def is_valid(self) -> bool:
        """Servable: fully colocated, or disaggregated with at least one P and one D."""
        if self.mode is Mode.COLOCATED:
            return True
        return self.mode is Mode.DISAGGREGATED and self.prefill >= 1 and self.decode >= 1

    def role_counts(self) -> dict[WorkerRole, int]:
        """Counts per rollout role (zeros included), the planner's ``n_dst``."""
        return {
            WorkerRole.COLOCATED: self.colocated,
            WorkerRole.PREFILL: self.prefill,
            WorkerRole.DECODE: self.decode,
        }

    @property
    def label(self) -> str:
        """``"8C"``, ``"5P3D"`` (mixed: ``"1P0D2C"``)."""
        if self.mode is Mode.COLOCATED:
            return f"{self.colocated}C"
        if self.mode is Mode.DISAGGREGATED:
            return f"{self.prefill}P{self.decode}D"
        return f"{self.prefill}P{self.decode}D{self.colocated}C"

    def __str__(self) -> str:
        return self.label


@dataclass(slots=True, frozen=True)
class WorkerSlot:
    """One row of ``M``: slot ``w`` -> (``G_w`` gpus, ``R_w`` role, ``a_w`` status), plus its zone."""

    slot_id: SlotId
    gpus: tuple[int, ...]  # G_w, fixed for the slot's lifetime
    zone: Zone
    role: WorkerRole  # R_w
    status: WorkerStatus  # a_w

    @property
    def is_training(self) -> bool:
        return self.role is WorkerRole.TRAINING

    @property
    def is_routable(self) -> bool:
        """Only ACTIVE rollout workers receive requests."""
        return self.status is WorkerStatus.ACTIVE and not self.is_training


@dataclass(slots=True, frozen=True)
class TableSnapshot:
    """An immutable view of the table at ``version``; what readers hold."""

    version: int
    slots: tuple[WorkerSlot, ...]  # ordered by slot_id

    def slot(self, slot_id: SlotId) -> WorkerSlot:
        """The row of ``slot_id``; raises ``WorkerStateError`` naming the known slots."""
        for s in self.slots:
            if s.slot_id == slot_id:
                return s
        known = [s.slot_id for s in self.slots]
        raise WorkerStateError(f"no worker slot {slot_id!r}; known slots are {known}")

    def __contains__(self, slot_id: object) -> bool:
        return any(s.slot_id == slot_id for s in self.slots)

    def workers(
        self,
        role: WorkerRole | None = None,
        status: WorkerStatus | None = None,
        zone: Zone | None = None,
    ) -> tuple[WorkerSlot, ...]:
        """Slots matching every given filter, by slot id."""
        return tuple(
            s
            for s in self.slots
            if (role is None or s.role is role)
            and (status is None or s.status is status)
            and (zone is None or s.zone is zone)
        )

    def by_zone(self, zone: Zone) -> tuple[WorkerSlot, ...]:
        return self.workers(zone=zone)

    def routable(self, role: WorkerRole) -> tuple[SlotId, ...]:
        """Ids of the ACTIVE rollout workers of ``role``: the only ones a router may use."""
        if role is WorkerRole.TRAINING:
            raise WorkerStateError("training workers are never routed to; pass a rollout role")
        return tuple(s.slot_id for s in self.workers(role=role, status=WorkerStatus.ACTIVE))

    def require_routable(self, slot_id: SlotId, role: WorkerRole) -> WorkerSlot:
        """The slot, if a ``role`` request may be sent to it now; else ``WorkerStateError``."""
        s = self.slot(slot_id)
        if not s.is_routable or s.role is not role:
            raise WorkerStateError(
                f"slot {slot_id} is {s.status} {s.role} (version {self.version}); "
                f"a {role} request needs an active {role} worker, e.g. {list(self.routable(role))}"
            )
        return s

    def active_roles(self) -> dict[SlotId, WorkerRole]:
        """The active rollout set ``W`` with roles: the planner's ``current``."""
        return {s.slot_id: s.role for s in self.slots if s.is_routable}

    def role_counts(self, status: WorkerStatus = WorkerStatus.ACTIVE) -> dict[WorkerRole, int]:
        """Workers per role (all four roles, zeros included) among slots with ``status``."""
        counts = Counter(s.role for s in self.slots if s.status is status)
        return {role: counts.get(role, 0) for role in WorkerRole}

    def topology(self) -> Topology:
        """``(N_P, N_D, N_C)`` of the active rollout workers."""
        return Topology.from_counts(
            {r: n for r, n in self.role_counts().items() if r is not WorkerRole.TRAINING}
        )

    def violations(self) -> list[str]:
        """Every broken invariant, as sentences; empty when the table is consistent."""
        problems: list[str] = []
        ids = [s.slot_id for s in self.slots]
        if len(set(ids)) != len(ids):
            problems.append(f"slot ids repeat: {sorted(ids)}")
        dedicated: dict[int, list[SlotId]] = defaultdict(list)
        training: dict[int, list[SlotId]] = defaultdict(list)
        overlap_rollout: dict[int, list[SlotId]] = defaultdict(list)
        holders: dict[int, list[SlotId]] = defaultdict(list)  # GPU -> non-inactive slots
        for s in self.slots:
            if not s.gpus or len(set(s.gpus)) != len(s.gpus):
                problems.append(f"slot {s.slot_id} GPU set {s.gpus} is empty or repeats a GPU")
            if s.is_training and s.zone is not Zone.OVERLAP:
                problems.append(f"training slot {s.slot_id} is in zone {s.zone}, not overlap")
            table = (
                dedicated
                if s.zone is Zone.DEDICATED
                else training
                if s.is_training
                else overlap_rollout
            )
            for g in s.gpus:
                table[g].append(s.slot_id)
                if s.status not in (WorkerStatus.INACTIVE, WorkerStatus.FAILED):
                    holders[g].append(s.slot_id)
        for name, table in (
            ("dedicated", dedicated),
            ("training", training),
            ("overlap rollout", overlap_rollout),
        ):
            for g, owners in sorted(table.items()):
                if len(owners) > 1:
                    problems.append(f"GPU {g} is in {name} slots {owners}; at most one may own it")
        overlap_gpus = set(training) | set(overlap_rollout)
        for g in sorted(set(dedicated) & overlap_gpus):
            problems.append(
                f"GPU {g} is in dedicated slot {dedicated[g]} and overlap slots "
                f"{training.get(g, []) + overlap_rollout.get(g, [])}"
            )
        for g, owners in sorted(overlap_rollout.items()):
            if g not in training:
                problems.append(
                    f"overlap rollout slot {owners} uses GPU {g}, which no training slot owns"
                )
        for g, owners in sorted(holders.items()):
            if len(owners) > 1:
                problems.append(
                    f"GPU {g} is held by non-inactive slots {owners}; training and borrowing "
                    "rollout must hand it off (one deactivates before the other activates)"
                )
        return problems

    def check(self) -> None:
        """Raise ``WorkerStateError`` listing every broken invariant (see ``violations``)."""
        problems = self.violations()
        if problems:
            raise WorkerStateError(
                f"table version {self.version} is inconsistent: " + "; ".join(problems)
            )


class WorkerTable:
    """The single-writer GPU–worker–role table (see the module docstring for the rules).

    Mutations validate the whole resulting table and commit atomically, bumping ``version``
    once per call; readers call ``snapshot()``.
    """

    def __init__(self) -> None:
        self._snapshot = TableSnapshot(version=0, slots=())
        self._next_id: SlotId = 0
        # Called with every committed snapshot (e.g. to record a timeline of roles).
        self.listeners: list[Callable[[TableSnapshot], None]] = []

    @property
    def version(self) -> int:
        return self._snapshot.version

    def snapshot(self) -> TableSnapshot:
        """The current immutable view (cheap: the table keeps one per version)."""
        return self._snapshot

    def check(self) -> None:
        """Raise ``WorkerStateError`` if an invariant is broken (never, if only this class writes)."""
        self._snapshot.check()

    def add_slot(
        self,
        gpus: Iterable[int],
        zone: Zone,
        role: WorkerRole,
        status: WorkerStatus = WorkerStatus.INACTIVE,
    ) -> SlotId:
        """Bind a new slot to ``gpus`` for life; returns its id (never reused)."""
        gpus = tuple(gpus)
        if not all(isinstance(g, numbers.Integral) and g >= 0 for g in gpus):
            raise WorkerStateError(f"GPU ids must be ints >= 0, got {gpus!r}")
        gpus = tuple(int(g) for g in gpus)
        slot = WorkerSlot(self._next_id, gpus, Zone(zone), WorkerRole(role), WorkerStatus(status))
        self._commit(self._snapshot.slots + (slot,))
        self._next_id += 1
        return slot.slot_id

    def find_slot(self, gpus: Iterable[int], zone: Zone = Zone.DEDICATED) -> SlotId | None:
        """The rollout slot bound to exactly ``gpus`` in ``zone`` (to reuse it), if any."""
        wanted = tuple(sorted(gpus))
        for s in self._snapshot.slots:
            if s.zone is Zone(zone) and not s.is_training and tuple(sorted(s.gpus)) == wanted:
                return s.slot_id
        return None

    def set_status(self, slot_id: SlotId, status: WorkerStatus) -> None:
        """Change ``a_w`` of one slot (see ``set_statuses``)."""
        self.set_statuses({slot_id: status})

    def set_statuses(self, changes: Mapping[SlotId, WorkerStatus]) -> None:
        """Change ``a_w`` of several slots atomically (e.g. admit an expansion group at once).

        Allowed: inactive -> transitioning -> active, active -> transitioning -> inactive,
        active -> inactive (urgent reclaim), and any of them -> failed (the process died)
        -> transitioning (restart) or inactive. A GPU is held by one slot at
        most that is neither inactive nor failed.
        """
        if not changes:
            raise WorkerStateError("set_statuses needs at least one (slot, status) change")
        rows = {s.slot_id: s for s in self._snapshot.slots}
        for slot_id, status in changes.items():
            old = self._snapshot.slot(slot_id)
            status = WorkerStatus(status)
            if status not in _ALLOWED_STATUS_CHANGES[old.status]:
                allowed = sorted(str(s) for s in _ALLOWED_STATUS_CHANGES[old.status])
                raise WorkerStateError(
                    f"slot {slot_id} cannot go from {old.status} to {status}; "
                    f"from {old.status} it may go to {allowed}"
                )
            rows[slot_id] = replace(old, status=status)
        self._commit(tuple(rows[i] for i in sorted(rows)))

    def set_role(self, slot_id: SlotId, role: WorkerRole) -> None:
        """Change ``R_w`` of a rollout slot that is not serving (transitioning or inactive)."""
        old = self._snapshot.slot(slot_id)
        role = WorkerRole(role)
        if old.is_training or role is WorkerRole.TRAINING:
            raise WorkerStateError(
                f"slot {slot_id}: training workers are fixed; cannot change role "
                f"{old.role} -> {role} (rollout slots take one of {', '.join(ROLLOUT_ROLES)})"
            )
        if old.status is WorkerStatus.ACTIVE:
            raise WorkerStateError(
                f"slot {slot_id} is active as {old.role}; set it transitioning (drain) "
                f"before reassigning it to {role}"
            )
        if role is old.role:
            raise WorkerStateError(f"slot {slot_id} already has role {role}")
        rows = tuple(
            replace(s, role=role) if s.slot_id == slot_id else s for s in self._snapshot.slots
        )
        self._commit(rows)

    def _commit(self, slots: tuple[WorkerSlot, ...]) -> None:
        candidate = TableSnapshot(version=self._snapshot.version + 1, slots=slots)
        problems = candidate.violations()
        if problems:
            raise WorkerStateError(
                "change rejected, table unchanged at version "
                f"{self._snapshot.version}: " + "; ".join(problems)
            )
        self._snapshot = candidate
        for listener in self.listeners:
            listener(candidate)
