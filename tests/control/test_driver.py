"""The driver's sizing and availability: what every program's run is laid out on."""

from __future__ import annotations

import pytest

from pearl.control.driver import Availability, ClusterSize
from pearl.control.policies import get_policy
from pearl.workloads.availability import AvailabilityTrace


def test_an_elastic_policy_keeps_every_slot_and_training_starts_on_a_node():
    size = ClusterSize(
        tp=2, reserved_gpus=4, max_preemptible_gpus=12, training_gpus=16, gpus_per_node=8
    )
    layout = size.layout_for(get_policy("pearl"), mean_preemptible_gpus=5.0)
    assert (layout.reserved_workers, layout.preemptible_workers) == (2, 6)
    assert layout.training_base == 16  # 16 dedicated GPUs fill two nodes


@pytest.mark.parametrize(("policy", "workers"), [("roll", 2), ("roll-large", 5), ("rlboost", 2)])
def test_fixed_pools_get_their_size_from_the_policy(policy, workers):
    """ROLL: the reserved GPUs; ROLL-Large: reserved + the trace's mean, whole workers."""
    size = ClusterSize(
        tp=2, reserved_gpus=4, max_preemptible_gpus=12, training_gpus=16, gpus_per_node=8
    )
    layout = size.layout_for(get_policy(policy), mean_preemptible_gpus=5.0)
    if policy == "rlboost":  # elastic: every preemptible slot exists, the trace decides
        assert (layout.reserved_workers, layout.preemptible_workers) == (2, 6)
    else:
        assert (layout.reserved_workers, layout.preemptible_workers) == (workers, 0)
        assert layout.training_base == (8 if workers * 2 <= 8 else 16)


def test_availability_from_changes_holds_the_last_listed_change_of_a_time():
    avail = Availability.from_changes([(60.0, 0), (0.0, 1), (30.0, 2), (30.0, 0)])
    assert avail.initial == 1
    assert avail.changes == ((30.0, 2), (30.0, 0), (60.0, 0))  # replayed in this order
    # mean over [0, 60]: 1 for 30 s, then 0
    assert avail.mean == pytest.approx(0.5)
    assert Availability.from_changes([]) == Availability(0, (), 0.0)
    assert Availability.from_changes([(0.0, 3)]).mean == 3.0


def test_availability_from_a_trace_counts_from_its_first_time():
    trace = AvailabilityTrace((100.0, 160.0, 400.0), (4, 8, 2), 700.0, "t")
    avail = Availability.from_trace(trace)
    assert avail.initial == 4
    assert avail.changes == ((60.0, 8), (300.0, 2))
    assert avail.mean == pytest.approx(trace.mean())
