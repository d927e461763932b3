"""The GPU–worker–role table: stable slots, validated transitions, invariants, snapshots."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.control.interfaces import WorkerRole
from pearl.control.state import (
    Mode,
    TableSnapshot,
    Topology,
    WorkerSlot,
    WorkerStateError,
    WorkerStatus,
    WorkerTable,
    Zone,
)

ACTIVE, INACTIVE, TRANSITIONING = (
    WorkerStatus.ACTIVE,
    WorkerStatus.INACTIVE,
    WorkerStatus.TRANSITIONING,
)
P, D, C, T = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.COLOCATED, WorkerRole.TRAINING


def cluster() -> WorkerTable:
    """4 dedicated TP2 workers (2P2D, active) on GPUs 0-7; training on GPUs 8-11 with two
    overlap rollout slots that may borrow them."""
    t = WorkerTable()
    for i, role in enumerate([P, P, D, D]):
        t.add_slot((2 * i, 2 * i + 1), Zone.DEDICATED, role, status=ACTIVE)
    t.add_slot((8, 9, 10, 11), Zone.OVERLAP, T, status=ACTIVE)  # slot 4
    t.add_slot((8, 9), Zone.OVERLAP, D)  # slot 5
    t.add_slot((10, 11), Zone.OVERLAP, D)  # slot 6
    return t


def test_slots_get_stable_increasing_ids_and_fixed_gpus():
    t = cluster()
    snap = t.snapshot()
    assert [s.slot_id for s in snap.slots] == [0, 1, 2, 3, 4, 5, 6]
    assert snap.slot(2).gpus == (4, 5)
    t.set_status(1, INACTIVE)  # a preemptible worker leaves: its slot stays, its id is kept
    t.set_status(1, TRANSITIONING)
    assert t.snapshot().slot(1).gpus == (2, 3)
    assert t.add_slot((12, 13), Zone.DEDICATED, P) == 7  # ids are never reused
    assert t.find_slot((3, 2)) == 1  # returning GPUs find their old slot
    assert t.find_slot((20, 21)) is None
    t.check()


def test_queries_by_role_status_zone_and_topology():
    snap = cluster().snapshot()
    assert snap.routable(P) == (0, 1)
    assert snap.routable(D) == (2, 3)  # overlap decode slots are inactive
    assert snap.active_roles() == {0: P, 1: P, 2: D, 3: D}
    assert snap.role_counts() == {C: 0, P: 2, D: 2, T: 1}
    assert snap.role_counts(INACTIVE)[D] == 2
    assert snap.topology() == Topology(prefill=2, decode=2)
    assert [s.slot_id for s in snap.by_zone(Zone.OVERLAP)] == [4, 5, 6]
    assert [s.slot_id for s in snap.workers(role=D, zone=Zone.DEDICATED)] == [2, 3]
    assert 6 in snap and 7 not in snap
    with pytest.raises(WorkerStateError, match="training workers are never routed"):
        snap.routable(T)


def test_version_bumps_once_per_committed_change_and_never_on_rejection():
    t = cluster()
    v = t.version
    assert v == 7  # seven slots added
    t.set_status(0, TRANSITIONING)
    assert t.version == v + 1
    with pytest.raises(WorkerStateError):
        t.set_status(0, TRANSITIONING)  # no-op is not a change
    with pytest.raises(WorkerStateError):
        t.set_role(1, D)  # active
    assert t.version == v + 1
    t.set_role(0, D)
    assert t.version == v + 2
    assert t.snapshot().version == t.version


def test_status_transitions_are_validated():
    t = cluster()
    with pytest.raises(WorkerStateError, match="from inactive to active"):
        t.set_status(5, ACTIVE)  # must initialize (transitioning) first
    t.set_status(2, TRANSITIONING)  # draining
    t.set_status(2, INACTIVE)
    t.set_status(3, INACTIVE)  # urgent reclaim skips draining
    assert t.snapshot().routable(D) == ()
    with pytest.raises(WorkerStateError, match="no worker slot 99; known slots are"):
        t.set_status(99, ACTIVE)


def test_transitioning_workers_are_not_routable():
    t = cluster()
    t.set_status(0, TRANSITIONING)
    snap = t.snapshot()
    assert snap.routable(P) == (1,)
    with pytest.raises(WorkerStateError, match="slot 0 is transitioning prefill"):
        snap.require_routable(0, P)
    with pytest.raises(WorkerStateError, match="needs an active decode worker"):
        snap.require_routable(1, D)  # active, but the wrong role
    assert snap.require_routable(1, P).slot_id == 1


def test_roles_change_only_on_drained_rollout_workers():
    t = cluster()
    with pytest.raises(WorkerStateError, match="set it transitioning"):
        t.set_role(0, D)
    t.set_status(0, TRANSITIONING)
    t.set_role(0, D)
    t.set_status(0, ACTIVE)
    assert t.snapshot().topology() == Topology(prefill=1, decode=3)
    with pytest.raises(WorkerStateError, match="training workers are fixed"):
        t.set_role(4, D)
    with pytest.raises(WorkerStateError, match="training workers are fixed"):
        t.set_role(5, T)
    with pytest.raises(WorkerStateError, match="already has role decode"):
        t.set_role(5, D)


def test_gpu_bindings_are_exclusive_per_zone():
    t = cluster()
    with pytest.raises(WorkerStateError, match=r"GPU 1 is in dedicated slots \[0, 7\]"):
        t.add_slot((1, 20), Zone.DEDICATED, P)
    with pytest.raises(WorkerStateError, match="which no training slot owns"):
        t.add_slot((20, 21), Zone.OVERLAP, D)
    with pytest.raises(WorkerStateError, match="GPU 0 is in dedicated slot"):
        t.add_slot((0, 1), Zone.OVERLAP, T)
    with pytest.raises(WorkerStateError, match="in zone dedicated, not overlap"):
        t.add_slot((30, 31), Zone.DEDICATED, T)
    with pytest.raises(WorkerStateError, match=r"GPU 9 is in overlap rollout slots \[5, 7\]"):
        t.add_slot((9, 10), Zone.OVERLAP, P)
    with pytest.raises(WorkerStateError, match="empty or repeats"):
        t.add_slot((), Zone.DEDICATED, P)
    with pytest.raises(WorkerStateError, match="GPU ids must be ints"):
        t.add_slot(("a",), Zone.DEDICATED, P)
    assert t.version == 7  # nothing committed
    t.check()


def test_training_and_borrowing_rollout_hand_gpus_off():
    t = cluster()
    with pytest.raises(WorkerStateError, match="GPU 8 is held by non-inactive slots"):
        t.set_status(5, TRANSITIONING)  # training still holds GPUs 8-11
    t.set_status(4, TRANSITIONING)  # Training Finished: release device state
    t.set_status(4, INACTIVE)
    t.set_statuses({5: TRANSITIONING, 6: TRANSITIONING})
    t.set_statuses({5: ACTIVE, 6: ACTIVE})
    assert t.snapshot().routable(D) == (2, 3, 5, 6)
    with pytest.raises(WorkerStateError, match="held by non-inactive"):
        t.set_status(4, TRANSITIONING)  # Training Begin must wait for the return
    t.set_statuses({5: TRANSITIONING, 6: INACTIVE})
    with pytest.raises(WorkerStateError):
        t.set_status(4, TRANSITIONING)  # slot 5 still drains
    t.set_status(5, INACTIVE)
    t.set_status(4, TRANSITIONING)
    t.set_status(4, ACTIVE)
    t.check()


def test_group_status_change_is_all_or_nothing():
    t = cluster()
    t.set_status(3, INACTIVE)
    v = t.version
    with pytest.raises(WorkerStateError, match="slot 3 cannot go from inactive to active"):
        t.set_statuses({2: TRANSITIONING, 3: ACTIVE})
    assert t.version == v
    assert t.snapshot().slot(2).status is ACTIVE
    with pytest.raises(WorkerStateError, match="at least one"):
        t.set_statuses({})


def test_snapshots_are_immutable_and_do_not_follow_the_table():
    t = cluster()
    before = t.snapshot()
    t.set_status(0, INACTIVE)
    assert before.slot(0).status is ACTIVE
    assert t.snapshot().slot(0).status is INACTIVE
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.slot(0).status = INACTIVE  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.version = 3  # type: ignore[misc]


def test_check_reports_every_broken_invariant():
    bad = TableSnapshot(
        version=5,
        slots=(
            WorkerSlot(0, (0, 1), Zone.DEDICATED, P, ACTIVE),
            WorkerSlot(1, (1, 2), Zone.DEDICATED, D, INACTIVE),
            WorkerSlot(2, (8,), Zone.OVERLAP, D, INACTIVE),
        ),
    )
    problems = bad.violations()
    assert len(problems) == 2
    with pytest.raises(WorkerStateError, match="version 5 is inconsistent.*GPU 1.*GPU 8"):
        bad.check()


def test_topology_modes_and_labels():
    assert Topology.colocation(8).label == "8C" and Topology.colocation(8).mode is Mode.COLOCATED
    assert Topology.split(5, 3).label == "5P3D" and Topology.split(5, 3).is_valid
    assert Topology.split(4, 0).mode is Mode.DISAGGREGATED and not Topology.split(4, 0).is_valid
    assert Topology(1, 1, 1).mode is None and not Topology(1, 1, 1).is_valid
    assert Topology().mode is None and not Topology().is_valid
    assert Topology.from_counts({P: 2, D: 3}).role_counts() == {C: 0, P: 2, D: 3}
    with pytest.raises(ValueError, match="Topology.decode must be an int >= 0, got -1"):
        Topology(1, -1)
    with pytest.raises(ValueError, match="no training workers"):
        Topology.from_counts({T: 1})


# Random sequences of writer operations: every accepted change keeps the table consistent,
# bumps the version by one, and never renames a slot or rebinds its GPUs.
operation = st.one_of(
    st.tuples(st.just("status"), st.integers(0, 8), st.sampled_from(list(WorkerStatus))),
    st.tuples(st.just("role"), st.integers(0, 8), st.sampled_from(list(WorkerRole))),
    st.tuples(
        st.just("add"),
        st.lists(st.integers(0, 13), min_size=1, max_size=2, unique=True),
        st.sampled_from([(Zone.DEDICATED, P), (Zone.OVERLAP, D), (Zone.OVERLAP, T)]),
    ),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(operation, max_size=25))
def test_random_operation_sequences_keep_invariants(ops):
    t = cluster()
    bindings = {s.slot_id: s.gpus for s in t.snapshot().slots}
    for kind, a, b in ops:
        before = t.snapshot()
        try:
            if kind == "status":
                t.set_status(a, b)
            elif kind == "role":
                t.set_role(a, b)
            else:
                new_id = t.add_slot(a, b[0], b[1])
                bindings[new_id] = tuple(a)
        except WorkerStateError:
            assert t.snapshot() is before  # rejected changes leave no trace
            continue
        assert t.version == before.version + 1
        t.check()
        assert {s.slot_id: s.gpus for s in t.snapshot().slots} == bindings
        for s in t.snapshot().slots:
            assert s.is_routable == (s.slot_id in t.snapshot().active_roles())


def test_a_failed_slot_holds_nothing_and_restarts_only_through_transitioning():
    table = WorkerTable()
    slot = table.add_slot([0, 1], Zone.DEDICATED, WorkerRole.COLOCATED)
    table.set_status(slot, WorkerStatus.TRANSITIONING)
    table.set_status(slot, WorkerStatus.ACTIVE)
    table.set_status(slot, WorkerStatus.FAILED)
    assert table.snapshot().routable(WorkerRole.COLOCATED) == ()
    with pytest.raises(WorkerStateError, match="cannot go from failed to active"):
        table.set_status(slot, WorkerStatus.ACTIVE)
    table.set_status(slot, WorkerStatus.TRANSITIONING)  # restart
    table.set_status(slot, WorkerStatus.ACTIVE)
    table.set_status(slot, WorkerStatus.FAILED)
    table.set_status(slot, WorkerStatus.INACTIVE)  # released
    table.check()
