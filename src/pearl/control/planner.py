"""Minimal-change transition plans ``(W_add, W_remove, rho)`` between rollout topologies.

Given the current active set ``W`` with roles and a target set ``W'`` with role counts
``n_dst``, a plan keeps every binding and as many roles as possible: joins and leaves are
fixed by the two sets, and among the survivors ``S = W ∩ W'`` each role keeps at most
``min(n_src(r), n_dst(r))`` of its workers (the lowest slot ids), the rest are reassigned.
Both executors (inter-scale rebuilder, intra-scale toggle) consume this one format.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from pearl.control.interfaces import WorkerRole
from pearl.control.state import ROLLOUT_ROLES, SlotId, Topology
from pearl.errors import PearlError


class PlanError(PearlError, ValueError):
    """A plan request is inconsistent (counts vs workers, non-rollout roles) or cannot apply."""


class Join(NamedTuple):
    """A worker entering the active set, with the role it starts in."""

    worker: SlotId
    role: WorkerRole


class Reassignment(NamedTuple):
    """``rho``: a surviving worker switching role."""

    worker: SlotId
    old_role: WorkerRole
    new_role: WorkerRole


@dataclass(slots=True, frozen=True)
class Plan:
    """``(W_add, W_remove, rho)``, each sorted by slot id; ``num_changes`` is its cost."""

    add: tuple[Join, ...] = ()
    remove: tuple[SlotId, ...] = ()
    reassign: tuple[Reassignment, ...] = ()

    @property
    def num_changes(self) -> int:
        """``|W_add| + |W_remove| + |rho|``; equals ``lower_bound`` for plans made here."""
        return len(self.add) + len(self.remove) + len(self.reassign)

    @property
    def is_empty(self) -> bool:
        return self.num_changes == 0

    @property
    def roles_changed(self) -> frozenset[SlotId]:
        """Survivors whose role changes."""
        return frozenset(r.worker for r in self.reassign)

    @property
    def touched(self) -> frozenset[SlotId]:
        """Every worker the plan joins, removes or reassigns; all others are left alone."""
        return frozenset(j.worker for j in self.add) | set(self.remove) | self.roles_changed

    def apply(self, current: Mapping[SlotId, WorkerRole]) -> dict[SlotId, WorkerRole]:
        """The active set with roles after the plan; raises ``PlanError`` if it does not fit."""
        result = dict(current)
        for w in self.remove:
            if w not in result:
                raise PlanError(f"plan removes worker {w}, which is not active in {sorted(result)}")
            del result[w]
        for r in self.reassign:
            if result.get(r.worker) is not r.old_role:
                raise PlanError(
                    f"plan reassigns worker {r.worker} from {r.old_role}, but it is "
                    f"{result.get(r.worker, 'not active')}"
                )
            result[r.worker] = r.new_role
        for j in self.add:
            if j.worker in current:
                raise PlanError(f"plan adds worker {j.worker}, which is already active")
            result[j.worker] = j.role
        return result

    def to_dict(self) -> dict[str, list]:
        """JSON-ready form for events.jsonl."""
        return {
            "add": [[j.worker, str(j.role)] for j in self.add],
            "remove": list(self.remove),
            "reassign": [[r.worker, str(r.old_role), str(r.new_role)] for r in self.reassign],
        }


def _check_request(
    current: Mapping[SlotId, WorkerRole], target: set[SlotId], counts: Mapping[WorkerRole, int]
) -> dict[WorkerRole, int]:
    """Validate a plan request; return ``n_dst`` over all rollout roles."""
    for w, role in current.items():
        if role not in ROLLOUT_ROLES:
            raise PlanError(
                f"current worker {w} has role {role}; plans cover only {', '.join(ROLLOUT_ROLES)}"
            )
    for role, n in counts.items():
        if role not in ROLLOUT_ROLES:
            raise PlanError(
                f"target count for role {role}; plans cover only {', '.join(ROLLOUT_ROLES)}"
            )
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise PlanError(f"target count for {role} must be an int >= 0, got {n!r}")
    n_dst = {r: counts.get(r, 0) for r in ROLLOUT_ROLES}
    if sum(n_dst.values()) != len(target):
        raise PlanError(
            f"target counts { ({str(r): n for r, n in n_dst.items()}) } sum to "
            f"{sum(n_dst.values())}, but the target set has {len(target)} workers {sorted(target)}"
        )
    return n_dst


def _as_set(workers: Iterable[SlotId]) -> set[SlotId]:
    listed = list(workers)
    result = set(listed)
    if len(result) != len(listed):
        raise PlanError(f"target workers repeat an id: {sorted(listed)}")
    return result


def lower_bound(
    current: Mapping[SlotId, WorkerRole],
    target_workers: Iterable[SlotId],
    target_counts: Mapping[WorkerRole, int],
) -> int:
    """The fewest changes any placement needs: ``D_worker + D_role``."""
    target = _as_set(target_workers)
    n_dst = _check_request(current, target, target_counts)
    survivors = [w for w in current if w in target]
    n_src = {r: sum(1 for w in survivors if current[w] is r) for r in ROLLOUT_ROLES}
    # D_worker = |W' \ W| + |W \ W'|
    d_worker = len(target - current.keys()) + len(current.keys() - target)
    # D_role = sum_r [ n_src(r) - min(n_src(r), n_dst(r)) ], over survivors S = W ∩ W'
    d_role = sum(n_src[r] - min(n_src[r], n_dst[r]) for r in ROLLOUT_ROLES)
    return d_worker + d_role


def plan_transition(
    current: Mapping[SlotId, WorkerRole],
    target_workers: Iterable[SlotId],
    target_counts: Mapping[WorkerRole, int],
) -> Plan:
    """A plan from ``current`` (W with roles) to ``target_workers`` (W') with ``target_counts``.

    Exactly ``lower_bound`` changes. Deterministic: per role the lowest-id survivors keep it;
    deficits are filled in role order (colocated, prefill, decode) by the displaced
    survivors first, then by the joiners, each in ascending id.
    """
    target = _as_set(target_workers)
    n_dst = _check_request(current, target, target_counts)
    joins = sorted(target - current.keys())
    leaves = sorted(current.keys() - target)
    survivors = sorted(w for w in current if w in target)

    kept: dict[WorkerRole, list[SlotId]] = {}
    displaced: list[SlotId] = []
    for role in ROLLOUT_ROLES:
        holders = [w for w in survivors if current[w] is role]
        keep = min(len(holders), n_dst[role])
        kept[role] = holders[:keep]
        displaced.extend(holders[keep:])
    displaced.sort()
    # A displaced worker's own role is already full, so it never lands back on it.
    open_roles = [r for r in ROLLOUT_ROLES for _ in range(n_dst[r] - len(kept[r]))]
    fillers = displaced + joins
    assert len(open_roles) == len(fillers), (open_roles, fillers)  # |W'| = sum n_dst

    add: list[Join] = []
    reassign: list[Reassignment] = []
    for worker, role in zip(fillers, open_roles, strict=True):
        if worker in current:
            reassign.append(Reassignment(worker, current[worker], role))
        else:
            add.append(Join(worker, role))
    return Plan(
        add=tuple(sorted(add)),
        remove=tuple(leaves),
        reassign=tuple(sorted(reassign)),
    )


def plan_for_available(
    current: Mapping[SlotId, WorkerRole],
    available: Iterable[SlotId],
    target: Topology,
) -> Plan:
    """PEARL's entry point after an elastic event: every available worker serves (W' = available)
    in the decision's target ``(N_P, N_D, N_C)``; workers no longer available leave."""
    available = _as_set(available)
    if target.num_workers != len(available):
        raise PlanError(
            f"target {target} has {target.num_workers} workers but {len(available)} are "
            f"available {sorted(available)}; decide for N_k = {len(available)}"
        )
    return plan_transition(current, available, target.role_counts())
