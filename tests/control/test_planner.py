"""Minimal-change plans: exact D_worker + D_role changes, stable slots, deterministic roles."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.control.interfaces import WorkerRole
from pearl.control.planner import (
    Join,
    Plan,
    PlanError,
    Reassignment,
    lower_bound,
    plan_for_available,
    plan_transition,
)
from pearl.control.state import ROLLOUT_ROLES, Topology

P, D, C, T = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.COLOCATED, WorkerRole.TRAINING


def test_a_joiner_takes_the_missing_role_and_nobody_else_moves():
    # 2P3D; worker 2 (D) is reclaimed, worker 5 arrives; target 3P2D.
    current = {0: P, 1: P, 2: D, 3: D, 4: D}
    plan = plan_for_available(current, {0, 1, 3, 4, 5}, Topology.split(3, 2))
    assert plan == Plan(add=(Join(5, P),), remove=(2,), reassign=())
    assert plan.num_changes == 2 == lower_bound(current, {0, 1, 3, 4, 5}, {P: 3, D: 2})
    assert plan.apply(current) == {0: P, 1: P, 3: D, 4: D, 5: P}


def test_mode_switch_reassigns_every_survivor_lowest_ids_first():
    current = {0: C, 1: C, 2: C, 3: C}
    plan = plan_transition(current, {0, 1, 2, 3}, {P: 2, D: 2})
    assert plan.reassign == (
        Reassignment(0, C, P),
        Reassignment(1, C, P),
        Reassignment(2, C, D),
        Reassignment(3, C, D),
    )
    assert plan.num_changes == 4 and plan.add == () and plan.remove == ()


def test_lower_slot_ids_keep_their_role():
    plan = plan_transition({4: D, 1: D, 7: D}, {1, 4, 7}, {P: 1, D: 2})
    assert plan.reassign == (Reassignment(7, D, P),)
    assert plan.roles_changed == frozenset({7})


def test_shrink_that_empties_decode_reassigns_a_survivor():
    # 3P1D loses its only decode worker (3): one prefill worker must become decode.
    current = {0: P, 1: P, 2: P, 3: D}
    plan = plan_transition(current, {0, 1, 2}, {P: 2, D: 1})
    assert plan == Plan(remove=(3,), reassign=(Reassignment(2, P, D),))
    assert plan.touched == frozenset({2, 3})
    assert plan.to_dict() == {"add": [], "remove": [3], "reassign": [[2, "prefill", "decode"]]}


def test_displaced_survivors_fill_deficits_before_joiners():
    # 3D plus one joiner -> 2P2D: survivor 2 is displaced from D and takes the first P slot.
    plan = plan_transition({0: D, 1: D, 2: D}, {0, 1, 2, 9}, {C: 0, P: 2, D: 2})
    assert plan.reassign == (Reassignment(2, D, P),)
    assert plan.add == (Join(9, P),)


def test_unchanged_target_is_an_empty_plan():
    current = {0: P, 1: D}
    plan = plan_transition(current, [1, 0], {P: 1, D: 1})
    assert plan.is_empty and plan.num_changes == 0


@pytest.mark.parametrize(
    ("current", "target", "counts", "message"),
    [
        ({0: P}, {0, 1}, {P: 1}, r"sum to 1, but the target set has 2 workers \[0, 1\]"),
        (
            {0: T},
            {0},
            {P: 1},
            "current worker 0 has role training; plans cover only colocated, prefill, decode",
        ),
        ({0: P}, {0}, {T: 1}, "target count for role training"),
        ({0: P}, {0}, {P: -1, D: 2}, "must be an int >= 0, got -1"),
        ({0: P}, [0, 0], {P: 2}, r"repeat an id: \[0, 0\]"),
    ],
)
def test_bad_requests_name_the_problem(current, target, counts, message):
    with pytest.raises(PlanError, match=message):
        plan_transition(current, target, counts)


def test_plan_for_available_needs_a_target_for_exactly_the_available_workers():
    with pytest.raises(PlanError, match=r"target 2P2D has 4 workers but 3 are available"):
        plan_for_available({0: P}, {0, 1, 2}, Topology.split(2, 2))


def test_apply_refuses_a_plan_that_does_not_fit():
    with pytest.raises(PlanError, match="removes worker 5, which is not active"):
        Plan(remove=(5,)).apply({0: P})
    with pytest.raises(PlanError, match="adds worker 0, which is already active"):
        Plan(add=(Join(0, D),)).apply({0: P})
    with pytest.raises(PlanError, match="reassigns worker 0 from decode, but it is prefill"):
        Plan(reassign=(Reassignment(0, D, P),)).apply({0: P})


@st.composite
def transitions(draw, max_id: int = 12):
    """A current active set with roles, a target set, and target counts summing to it."""
    ids = list(range(max_id))
    current_ids = draw(st.lists(st.sampled_from(ids), unique=True, max_size=max_id))
    current = {w: draw(st.sampled_from(ROLLOUT_ROLES)) for w in current_ids}
    target = set(draw(st.lists(st.sampled_from(ids), unique=True, max_size=max_id)))
    cuts = sorted(draw(st.lists(st.integers(0, len(target)), min_size=2, max_size=2)))
    counts = {C: cuts[0], P: cuts[1] - cuts[0], D: len(target) - cuts[1]}
    return current, target, counts


def brute_force_minimum(current, target, counts) -> int:
    """Fewest changes over every role assignment of ``target`` with ``counts``."""
    members = sorted(target)
    churn = len(target - current.keys()) + len(current.keys() - target)
    best = None
    for roles in itertools.product(ROLLOUT_ROLES, repeat=len(members)):
        if any(roles.count(r) != counts[r] for r in ROLLOUT_ROLES):
            continue
        switched = sum(
            1 for w, r in zip(members, roles, strict=True) if w in current and current[w] is not r
        )
        best = switched if best is None else min(best, switched)
    return churn + best


@settings(max_examples=100, deadline=None)
@given(transitions())
def test_plans_are_minimal_and_reach_the_target(case):
    current, target, counts = case
    plan = plan_transition(current, target, counts)
    after = plan.apply(current)

    # exactly D_worker + D_role changes, never more
    assert plan.num_changes == lower_bound(current, target, counts)
    # the target set with exactly the target counts
    assert after.keys() == target
    assert {r: sum(1 for x in after.values() if x is r) for r in ROLLOUT_ROLES} == counts
    # no renaming: joins are new ids of W', removals are exactly W \ W', reassignments survivors
    assert {j.worker for j in plan.add} == target - current.keys()
    assert set(plan.remove) == current.keys() - target
    assert {r.worker for r in plan.reassign} <= current.keys() & target
    # survivors outside rho keep their role; reassignments really change it
    for w in (current.keys() & target) - plan.roles_changed:
        assert after[w] is current[w]
    assert all(r.old_role is not r.new_role for r in plan.reassign)
    # deterministic
    assert plan_transition(dict(reversed(current.items())), set(target), counts) == plan


@settings(max_examples=100, deadline=None)
@given(transitions(max_id=6))
def test_lower_bound_matches_exhaustive_search(case):
    current, target, counts = case
    assert lower_bound(current, target, counts) == brute_force_minimum(current, target, counts)
