"""Whole simulated RL runs under every policy: the control plane's invariants on random traces."""

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pearl.control.elastic import RoleDecider
from pearl.control.policies import POLICIES, PDMode, Pool, get_policy
from pearl.control.state import Topology
from pearl.errors import ConfigError
from pearl.sim.ablation import RUNGS, relative_to_roll, rung_policy
from pearl.sim.costmodel import CostModel
from pearl.sim.experiment import run_summary
from pearl.sim.hardware import get_gpu
from pearl.sim.models import load_model_shape
from pearl.sim.rl import RLSetting, run_policy
from pearl.workloads.agentic import generate_batch, get_profile, scaled
from pearl.workloads.availability import (
    SEGMENTS,
    ChangeModel,
    SyntheticAvailability,
    load_segment,
    synthetic_availability,
)

COST = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)
# Compute-heavy and short: contexts to 8K, environment times x 1/100, 2 tasks x 4.
PROFILE = scaled(get_profile("tiny"), token_factor=4, time_factor=0.01, name="tiny-x4")


class AlternatingDecider(RoleDecider):
    """Switches mode after every refit (colocated, then 1:N-1 split, ...): exercises mode
    switches in the middle of batches, together with shrinks, expansions and borrowing."""

    def counts(self, n, current):
        if n < 2 or self.tracker is None or self.tracker.steps % 2 == 0:
            return Topology.colocation(n)
        return Topology.split(1, n - 1)


def setting(duration_s=150.0, seed=0, **kw):
    return RLSetting(
        COST,
        PROFILE,
        reserved_gpus=4,
        max_preemptible_gpus=8,
        training_gpus=8,
        duration_s=duration_s,
        seed=seed,
        check_invariants=True,
        **kw,
    )


def check_run(result, s):
    assert result.records, "no step completed"
    for rec in result.records:
        batch = generate_batch(s.profile, seed=s.seed * 100_003 + rec.step)
        # Every trajectory of the batch completed exactly once ...
        assert sorted(t.session_id for t in rec.result.trajectories) == sorted(
            f"{t.task_id}/{t.index_in_group}" for t in batch.trajectories
        )
        by_session = {f"{t.task_id}/{t.index_in_group}": t for t in batch.trajectories}
        for traj in rec.result.trajectories:
            # ... with every turn's full response: cut-short turns lost no generated token.
            assert [len(o.token_ids) for o in traj.turns] == [
                t.response_tokens for t in by_session[traj.session_id].turns
            ]
            assert all(o.finish_reason not in ("abort", "handed_back") for o in traj.turns)
        assert rec.weight_versions[0] >= rec.step - s.max_staleness
        assert rec.train_started >= rec.rollout_finished


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    policy=st.sampled_from([*POLICIES, "alternating"]),
    trace_seed=st.integers(0, 10_000),
    model=st.sampled_from(list(ChangeModel)),
    interval=st.floats(10.0, 120.0),
    seed=st.integers(0, 3),
    overlap=st.booleans(),
)
@example(  # found by CI: a batch started once its weights were trained, before they were synced
    policy="pearl-ungated",
    trace_seed=320,
    model=ChangeModel.RANDOM_WALK,
    interval=21.0,
    seed=3,
    overlap=False,
)
def test_invariants_hold_on_random_availability_traces(
    policy, trace_seed, model, interval, seed, overlap
):
    """Invariants checked during the run (check_invariants): no turn reaches a worker not
    active in the role it is sent for; training never starts while a borrowed GPU serves.
    After it: every trajectory completes once, no token lost, staleness bounded."""
    run_random_case(policy, trace_seed, model, interval, seed, overlap, trace_s=400.0)


def run_random_case(
    policy, trace_seed, model, interval, seed, overlap, trace_s, run_s=150.0
) -> int:
    """One random availability trace of ``trace_s`` under one policy for ``run_s``, checked;
    returns how many availability changes the run replayed."""
    trace = synthetic_availability(
        SyntheticAvailability(
            duration_s=trace_s,
            max_available=8,
            mean_change_interval_s=interval,
            model=model,
            low_level=1,
            high_level=7,
        ),
        seed=trace_seed,
    )
    s = setting(duration_s=run_s, seed=seed, overlap_batches=overlap)
    decider = None
    if policy == "alternating":
        policy, decider = "pearl-ungated", AlternatingDecider(get_policy("pearl-ungated"))
    result = run_policy(s, get_policy(policy), trace, decider=decider)
    check_run(result, s)
    return sum(t < run_s for t, _ in trace.changes())  # the events the run replayed


@pytest.mark.slow
def test_invariants_hold_at_scale():
    """The same checks on 60 random (not derandomized) 600 s runs on traces with changes
    every 5-60 s: thousands of availability events, with borrowing and mode switches."""
    events: list[int] = []

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        policy=st.sampled_from([*POLICIES, "alternating"]),
        trace_seed=st.integers(0, 10**6),
        model=st.sampled_from(list(ChangeModel)),
        interval=st.floats(5.0, 60.0),
        seed=st.integers(0, 7),
        overlap=st.booleans(),
    )
    def case(policy, trace_seed, model, interval, seed, overlap):
        events.append(
            run_random_case(
                policy, trace_seed, model, interval, seed, overlap, trace_s=600.0, run_s=600.0
            )
        )

    case()
    print(f"{len(events)} runs, {sum(events)} availability events, no invariant broken")
    assert len(events) >= 50 and sum(events) >= 1000


def test_mode_switches_mid_run_lose_nothing():
    trace = synthetic_availability(
        SyntheticAvailability(duration_s=400.0, max_available=8, mean_change_interval_s=40.0),
        seed=3,
    )
    s = setting(duration_s=300.0)
    result = run_policy(
        s, get_policy("pearl-pd"), trace, decider=AlternatingDecider(get_policy("pearl-pd"))
    )
    check_run(result, s)
    assert result.counters["role_switches"] > 0
    kinds = {e["kind"] for e in result.events}
    assert {"availability", "shrink", "expand", "admit", "reassign", "refit"} <= kinds
    assert any(e.get("dedicated_prefill") for e in result.timeline)


def test_borrowing_returns_gpus_before_every_training_step():
    trace = synthetic_availability(SyntheticAvailability(duration_s=400.0, max_available=4), seed=1)
    s = setting(duration_s=300.0)
    result = run_policy(s, get_policy("pearl-ungated"), trace)
    check_run(result, s)
    assert result.counters["borrow_rounds"] >= 2
    assert any(e.get("overlap_colocated") for e in result.timeline)
    # Overlap workers never hold GPUs while the trainer trains (checked at every step start
    # by the run itself); here: each give-back precedes the training step it belongs to.
    give_backs = [e["t"] for e in result.events if e["kind"] == "give_back"]
    for t in give_backs:
        assert any(abs(r.train_started - t) < 60 for r in result.records)


def test_the_gate_keeps_training_gpus_when_borrowing_does_not_pay():
    trace = synthetic_availability(SyntheticAvailability(duration_s=400.0, max_available=8), seed=2)
    s = setting(duration_s=300.0)
    gated = run_policy(s, get_policy("pearl"), trace)
    gates = [e for e in gated.events if e["kind"] == "gate"]
    # At the start nothing is measured: the whole first batch is the window, so it borrows.
    first, measured = gates[0], gates[1:]
    assert first["step"] == -1 and first["reason"] == "no measurements yet" and first["borrow"]
    assert measured and all(
        e["borrow_by_model"] == ((e["R"] / e["B"]) * (e["T_ded"] - e["T_full"]) > e["T_toggle"])
        for e in measured
    )
    # The model decides until borrowing's saving was measured; then the measurement does.
    for e in measured:
        if e["measured_saving"] is None:
            assert e["borrow"] == e["borrow_by_model"]
        else:
            assert e["borrow"] == (e["measured_saving"] * e["T_ded"] > e["T_toggle"])
    assert gated.counters["borrow_rounds"] == sum(e["borrow"] for e in gates)


def test_same_seed_same_run():
    trace = synthetic_availability(SyntheticAvailability(duration_s=400.0, max_available=8), seed=5)
    s = setting(duration_s=200.0)
    a = run_policy(s, get_policy("pearl-ungated"), trace)
    b = run_policy(s, get_policy("pearl-ungated"), trace)
    assert json.dumps(a.step_rows()) == json.dumps(b.step_rows())
    assert json.dumps(a.events) == json.dumps(b.events)
    assert json.dumps(a.timeline) == json.dumps(b.timeline)


def test_roll_large_pool_is_the_segment_mean_rounded_to_workers():
    # docs/paper.md: ROLL-Large uses 14 / 10 / 12 rollout GPUs in segments 1 / 2 / 3.
    large = get_policy("roll-large")
    gpus = [2 * large.pool_workers(4, 12, load_segment(name).mean(), tp=2) for name in SEGMENTS]
    assert gpus == [14, 10, 12]
    assert get_policy("roll").pool_workers(4, 12, 9.6, tp=2) == 2
    assert large.pool is Pool.FIXED


def test_policy_errors_name_the_valid_choices():
    with pytest.raises(ConfigError, match="valid: roll, roll-large"):
        get_policy("pearl2")
    with pytest.raises(ConfigError, match="static_split"):
        get_policy("static-pd", static_split=(0, 1))
    with pytest.raises(ValueError, match="availability trace"):
        run_policy(setting(), get_policy("rlboost"), None)


def test_a_constant_availability_trace_gives_elastic_policies_its_gpus():
    from pearl.workloads.availability import AvailabilityTrace

    constant = AvailabilityTrace((0.0,), (8,), end_s=400.0, source="constant")
    result = run_policy(setting(duration_s=100.0), get_policy("rlboost"), constant)
    # 4 reserved + 8 preemptible rollout GPUs from the start, as roll-large would get.
    assert {gpus for _, gpus in result.rollout_gpus} == {12}
    assert max(sum(v for k, v in e.items() if k != "t") for e in result.timeline) == 6


# --- the ablation ladder (Fig 7) on a fixed pool -----------------------------------------


def test_rung_policies_are_fixed_pools_of_the_given_size():
    a = rung_policy("A", 8)
    assert (a.pool, a.pd, a.fixed_rollout_gpus) == (Pool.FIXED, PDMode.DISAGGREGATED, 8)
    assert a.pool_workers(4, 12, 0.0, 2) == 4  # 8 GPUs at TP2, whatever the trace
    assert list(RUNGS) == ["roll", "A", "B", "C", "pearl"]
    with pytest.raises(ValueError, match="unknown rung 'D'; valid: roll, A, B, C, pearl"):
        rung_policy("D", 8)


def test_forced_disaggregation_and_borrowing_on_a_fixed_pool():
    s = setting(duration_s=200.0)
    runs = {}
    for rung in ("roll", "A", "B"):
        result = run_policy(s, rung_policy(rung, 4))
        check_run(result, s)  # every trajectory exactly once, invariants held throughout
        runs[rung] = run_summary(rung, "4 GPUs", result, 4.0)
    roles = {
        rung: {k for e in r["timeline"] for k, v in e.items() if k != "t" and v}
        for rung, r in runs.items()
    }
    assert roles["roll"] == {"dedicated_colocated"}
    # forced disaggregation: the only split of 2 workers from the first step on
    assert {"dedicated_prefill", "dedicated_decode"} <= roles["A"]
    assert "dedicated_colocated" not in roles["A"]
    assert any(k.startswith("overlap_") for k in roles["B"])  # borrowed between updates
    assert not any(k.startswith("overlap_") for k in roles["A"])
    decisions = [e for e in runs["A"]["events"] if e["kind"] == "decision"]
    assert decisions and all(e["target"] == "1P1D" for e in decisions)
    rel = relative_to_roll(list(runs.values()))["4 GPUs"]
    assert rel["roll"] == 0.0
    assert rel["A"] == pytest.approx(
        100 * (runs["A"]["throughput"] / runs["roll"]["throughput"] - 1)
    )


def test_topology_labels_of_the_role_timeline():
    from pearl.sim.experiment import topology_at

    timeline = [
        {"t": 0.0, "dedicated_colocated": 4},
        {"t": 10.0, "dedicated_prefill": 2, "dedicated_decode": 2, "overlap_decode": 8},
        {"t": 20.0, "dedicated_colocated": 8, "overlap_colocated": 8},
    ]
    assert topology_at(timeline, 5.0) == "4C"
    assert topology_at(timeline, 10.0) == "2P2D +8Do"
    assert topology_at(timeline, 25.0) == "8C +8Co"
    assert topology_at([], 0.0) == "-"


# --- scripted reconfigurations mid-batch (fidelity cases' mode switch and shrink) -------


@pytest.mark.parametrize("to", ["1P1D", "1C"])
def test_a_mode_switch_or_shrink_mid_batch_resumes_every_cut_turn(to):
    from pearl.control.deployment import Deployment
    from pearl.control.scripted import ScriptedChange
    from pearl.sim.world import simulate_fixed_rollout

    batch = generate_batch(PROFILE, seed=3)
    plain = simulate_fixed_rollout(batch, COST, Deployment.parse("2C"))
    at = plain.makespan_s / 3
    change = ScriptedChange(at, Deployment.parse(to).topology)
    report = simulate_fixed_rollout(batch, COST, Deployment.parse("2C"), changes=[change])
    result = report.result
    # Every trajectory completes once with all its turns and the workload's response lengths.
    assert sorted(t.session_id for t in result.trajectories) == sorted(
        t.session_id for t in plain.result.trajectories
    )
    by_session = {f"{t.task_id}/{t.index_in_group}": t for t in batch.trajectories}
    for traj in result.trajectories:
        spec = by_session[traj.session_id]
        assert [len(o.token_ids) for o in traj.turns] == [t.response_tokens for t in spec.turns]
        assert all(o.finish_reason not in ("abort", "handed_back") for o in traj.turns)
    late = [
        o.telemetry
        for t in result.trajectories
        for o in t.turns
        if o.telemetry.submitted_at > at + 1e-6
    ]
    assert late, "no turn started after the change"
    # None: a one-token turn needs no decode worker, a small append is prefilled where its
    # KV lives (the decode worker)
    if to == "1P1D":  # after the switch: prefill on w0, decode on w1
        assert all(t.prefill_worker in ("w0", None) for t in late)
        assert all(t.decode_worker in ("w1", None) for t in late)
        assert any((t.prefill_worker, t.decode_worker) == ("w0", "w1") for t in late)
    else:  # after the shrink only w0 serves
        assert all({t.prefill_worker, t.decode_worker} <= {"w0", None} for t in late)
    with pytest.raises(ValueError, match="servable topology"):
        ScriptedChange(1.0, Topology(prefill=1))
