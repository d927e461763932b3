"""The PD Decision Engine against hand-computed makespans, and its hysteresis properties."""

import dataclasses
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pearl.control.decision import (
    DecisionConfig,
    DecisionError,
    DecisionReason,
    Infeasibility,
    WorkloadParams,
    borrow_gate,
    decide,
    decide_split,
    evaluate_candidates,
)
from pearl.control.makespan import bubble_ratio, predict_makespan
from pearl.control.state import Mode, Topology

KEEP, RATIO, MODE, FORCED = (
    DecisionReason.KEEP,
    DecisionReason.RATIO_CHANGE,
    DecisionReason.MODE_SWITCH,
    DecisionReason.FORCED,
)


def params(**overrides) -> WorkloadParams:
    """S=10, r=100, dL=1000, A=0.01, b=0.001, t_prefill=1e-4, T_over=2, T_env=50, K=1e5,
    BW=1e10, K_seq=1e9, H_max=2e10, B=48 (W_D = S*r, W_P = S*dL). The makespans come from
    ``pearl.control.makespan`` (checked by hand in test_makespan.py); these tests check the
    decisions taken on them. KV: 48*1e9 <= N_D*2e10  <=>  N_D >= 3."""
    base = dict(
        turns=10,
        decode_tokens_per_turn=100,
        appended_tokens_per_turn=1000,
        bubble_ratio=1.0,
        decode_step_fixed_s=0.01,
        decode_step_per_sequence_s=0.001,
        prefill_s_per_token=1e-4,
        switch_overhead_s=2.0,
        env_time_s=50,
        kv_bytes_per_token=1e5,
        pd_bandwidth_bytes_per_s=1e10,
        kv_bytes_per_trajectory=1e9,
        kv_capacity_bytes_per_worker=2e10,
        batch_trajectories=48,
    )
    return WorkloadParams(**(base | overrides))


def makespans(p: WorkloadParams, n: int) -> dict[str, float]:
    return {c.topology.label: c.makespan_s for c in evaluate_candidates(p, n, DecisionConfig())}


def gain(old: float, new: float) -> float:
    return (old - new) / old


def test_candidates_and_feasibility():
    cands = {c.topology.label: c for c in evaluate_candidates(params(), 8, DecisionConfig())}
    assert list(cands) == ["8C", "1P7D", "2P6D", "3P5D", "4P4D", "5P3D", "6P2D", "7P1D"]
    for c in cands.values():
        assert c.makespan_s == predict_makespan(params(), c.topology)
    assert cands["8C"].feasible and cands["8C"].prediction.prefill_utilization is None
    # 6P2D and 7P1D: 48e9 bytes of KV > 2 * 2e10
    assert cands["6P2D"].violations == (Infeasibility.KV_MEMORY,)
    assert cands["7P1D"].violations == (Infeasibility.KV_MEMORY,)
    # 1P7D's single prefill worker is the busiest pool: a lower load limit drops it alone
    rho = cands["1P7D"].prediction.prefill_utilization
    assert rho == max(c.prediction.prefill_utilization or 0 for c in cands.values())
    strict = {
        c.topology.label: c.violations
        for c in evaluate_candidates(
            params(), 8, DecisionConfig(max_prefill_utilization=rho - 1e-9)
        )
    }
    assert strict["1P7D"] == (Infeasibility.PREFILL_BACKLOG,) and strict["2P6D"] == ()
    # KV memory exactly full is feasible: 48e9 <= 3 * 1.6e10
    full = evaluate_candidates(params(kv_capacity_bytes_per_worker=1.6e10), 8, DecisionConfig())
    assert next(c for c in full if c.topology == Topology.split(5, 3)).feasible


def test_best_split_beats_colocation_and_becomes_the_initial_topology():
    m = makespans(params(), 8)
    best = min(("2P6D", "3P5D", "4P4D", "5P3D"), key=m.get)
    assert m[best] < m["8C"]
    d = decide(params(), 8, None)
    assert d.target.label == best and d.reason is FORCED
    assert d.target_makespan_s == m[best] and d.current_makespan_s is None


def test_mode_switch_only_when_the_gain_clears_the_mode_threshold():
    m = makespans(params(), 8)
    d = decide(params(), 8, Topology.colocation(8))
    g = gain(m["8C"], d.target_makespan_s)
    assert d.reason is MODE and d.target.mode is Mode.DISAGGREGATED and g > 0.05
    assert d.current_makespan_s == m["8C"]
    held = decide(params(), 8, Topology.colocation(8), DecisionConfig(mode_switch_threshold=g))
    assert (held.target, held.reason) == (Topology.colocation(8), KEEP) and not held.changed
    assert held.best.topology == d.target  # the model prefers it; hysteresis holds


def test_ratio_change_uses_the_smaller_threshold():
    m = makespans(params(), 8)
    d = decide(params(), 8, Topology.split(5, 3))
    g = gain(m["5P3D"], d.target_makespan_s)
    assert d.reason is RATIO and d.target.mode is Mode.DISAGGREGATED and g > 0.02
    held = decide(params(), 8, Topology.split(5, 3), DecisionConfig(ratio_change_threshold=g))
    assert (held.target, held.reason) == (Topology.split(5, 3), KEEP)
    # the same gain is enough for a ratio change even when the mode threshold is not
    d = decide(params(), 8, Topology.split(5, 3), DecisionConfig(mode_switch_threshold=0.9))
    assert d.reason is RATIO


def test_shrink_that_breaks_the_split_forces_a_change():
    # 4P4D with 7 workers left: the counts no longer sum to N_k; stays disaggregated
    m = makespans(params(), 7)
    d = decide(params(), 7, Topology.split(4, 4))
    assert d.reason is FORCED and d.target.mode is Mode.DISAGGREGATED
    assert d.target_makespan_s == min(v for k, v in m.items() if k not in ("7C", "5P2D", "6P1D"))


def test_no_feasible_split_falls_back_to_colocation():
    # 4 workers, the only decode worker gone (4P0D); no split of 4 holds 48 GB on >= 3 decode
    # workers but 1P3D, and a load limit of 1% drops that one
    config = DecisionConfig(max_prefill_utilization=0.01)
    d = decide(params(), 4, Topology.split(4, 0), config)
    assert (d.target, d.reason) == (Topology.colocation(4), FORCED)
    assert decide(params(), 1, Topology.split(1, 1)).target == Topology.colocation(1)


def test_forced_disaggregation_takes_the_best_split_even_when_colocation_wins():
    p = params(switch_overhead_s=0.0, prefill_s_per_token=1e-6)
    m = makespans(p, 8)  # little prefill: every worker decoding beats fewer decode workers
    assert decide(p, 8, None).target == Topology.colocation(8)
    d = decide_split(p, 8, None)
    assert d.reason is FORCED and d.target.mode is Mode.DISAGGREGATED
    feasible = {c.topology.label for c in d.candidates if c.feasible}
    assert d.target_makespan_s == min(m[k] for k in feasible if k != "8C")
    held = decide_split(p, 8, Topology.split(5, 3), DecisionConfig(ratio_change_threshold=0.99))
    assert (held.target, held.reason) == (Topology.split(5, 3), KEEP)
    # 2 workers: 1P1D is the only split, infeasible (48 GB of KV on one 20 GB worker) yet taken
    two = decide_split(p, 2, Topology.colocation(2))
    assert two.target == Topology.split(1, 1) and not two.candidates[1].feasible
    with pytest.raises(DecisionError, match=">= 2 workers"):
        decide_split(p, 1, None)


def test_forced_growth_stays_in_mode_unless_the_other_wins_by_the_mode_threshold():
    p = params()
    m = makespans(p, 9)
    best_split = min((v for k, v in m.items() if k != "9C"))
    g = gain(m["9C"], best_split)
    assert g > 0
    # 8C plus one joiner, N_k=9: the split's gain under the mode threshold keeps colocation
    d = decide(p, 9, Topology.colocation(8), DecisionConfig(mode_switch_threshold=g))
    assert (d.target, d.reason) == (Topology.colocation(9), FORCED)
    assert d.target_makespan_s == m["9C"]
    free = decide(
        p,
        9,
        Topology.colocation(8),
        DecisionConfig(mode_switch_threshold=g, mode_hysteresis_when_forced=False),
    )
    assert free.reason is FORCED and free.target.mode is Mode.DISAGGREGATED


def test_decision_serializes_for_the_event_log():
    d = decide(params(), 4, Topology.split(2, 2)).to_dict()
    assert d["reason"] == "forced"
    two = d["candidates"][2]
    assert two["topology"] == "2P2D" and two["violations"] == ["kv_memory"]
    assert set(two) == {
        "topology",
        "makespan_s",
        "decode_s",
        "prefill_s",
        "concurrency",
        "prefill_utilization",
        "violations",
    }
    assert two["makespan_s"] == predict_makespan(params(), Topology.split(2, 2))
    assert 0 < two["prefill_utilization"] < 1


def test_borrow_gate_by_hand():
    # (32/64) * (300 - 280) = 10 s of benefit
    assert borrow_gate(32, 64, 300.0, 280.0, 9.44)
    assert not borrow_gate(32, 64, 300.0, 280.0, 10.0)  # strictly greater
    assert not borrow_gate(0, 64, 300.0, 100.0, 0.0)  # nothing left to speed up
    assert not borrow_gate(64, 64, 280.0, 300.0, 0.0)  # borrowing predicted slower
    with pytest.raises(DecisionError, match=r"R must be in \[0, B=64\], got 65"):
        borrow_gate(65, 64, 1.0, 0.0, 0.0)
    with pytest.raises(DecisionError, match="T_toggle must be >= 0 seconds"):
        borrow_gate(1, 64, 1.0, 0.0, -1.0)


def test_bad_inputs_name_the_field_and_the_valid_range():
    with pytest.raises(DecisionError, match="WorkloadParams.bubble_ratio must be >= 0, got -0.5"):
        params(bubble_ratio=-0.5)
    with pytest.raises(DecisionError, match="pd_bandwidth_bytes_per_s must be > 0, got 0"):
        params(pd_bandwidth_bytes_per_s=0)
    with pytest.raises(DecisionError, match="turns must be a number, got nan"):
        params(turns=math.nan)
    with pytest.raises(DecisionError, match="env_time_s must be finite"):
        params(env_time_s=math.inf)
    with pytest.raises(DecisionError, match="available workers N_k must be an int >= 1, got 0"):
        decide(params(), 0, None)
    with pytest.raises(DecisionError, match=r"ratio_change_threshold must be in \[0, 1\)"):
        DecisionConfig(ratio_change_threshold=1.5)
    with pytest.raises(DecisionError, match="cannot predict topology 3P0D"):
        predict_makespan(params(), Topology.split(3, 0))
    with pytest.raises(DecisionError, match=r"active decoding fraction f must be in \(0, 1\]"):
        bubble_ratio(0.0)
    with pytest.raises(DecisionError, match=r"max_prefill_utilization must be in \(0, 1\]"):
        DecisionConfig(max_prefill_utilization=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params().turns = 3  # type: ignore[misc]


# --- properties ---------------------------------------------------------------------------

small = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


@st.composite
def workloads(draw) -> WorkloadParams:
    return WorkloadParams(
        turns=draw(st.integers(1, 50)),
        decode_tokens_per_turn=draw(st.floats(1, 2000)),
        appended_tokens_per_turn=draw(st.floats(0, 20000)),
        bubble_ratio=draw(small),
        decode_step_fixed_s=draw(st.floats(1e-4, 0.1)),
        decode_step_per_sequence_s=draw(st.floats(0, 1e-2)),
        prefill_s_per_token=draw(st.floats(0, 1e-3)),
        switch_overhead_s=draw(small),
        env_time_s=draw(st.floats(0, 500)),
        kv_bytes_per_token=draw(st.floats(0, 2e5)),
        pd_bandwidth_bytes_per_s=draw(st.floats(1e8, 1e12)),
        kv_bytes_per_trajectory=draw(st.floats(0, 1e10)),
        kv_capacity_bytes_per_worker=draw(st.floats(1e8, 1e11)),
        batch_trajectories=draw(st.integers(1, 256)),
    )


configs = st.builds(
    DecisionConfig,
    mode_switch_threshold=st.floats(0, 0.3),
    ratio_change_threshold=st.floats(0, 0.3),
    max_prefill_utilization=st.sampled_from([0.5, 0.9, 1.0]),
    mode_hysteresis_when_forced=st.booleans(),
)


def topologies(n: int):
    return st.one_of(
        st.just(Topology.colocation(n)),
        st.integers(1, max(1, n - 1)).map(lambda p: Topology.split(p, max(0, n - p))),
    )


@settings(max_examples=100, deadline=None)
@given(workloads(), st.integers(1, 31))
def test_more_workers_never_lengthen_a_batch(p, n):
    assert predict_makespan(p, Topology.colocation(n + 1)) <= predict_makespan(
        p, Topology.colocation(n)
    ) * (1 + 1e-9)
    assert predict_makespan(p, Topology.split(n + 1, n + 1)) <= predict_makespan(
        p, Topology.split(n, n)
    ) * (1 + 1e-9)
    assert predict_makespan(p, Topology.split(n, n + 1)) <= predict_makespan(
        p, Topology.split(n, n)
    ) * (1 + 1e-9)


@settings(max_examples=100, deadline=None)
@given(workloads(), st.integers(1, 16), st.data(), configs)
def test_decisions_are_feasible_and_never_worse_than_keeping(p, n, data, config):
    current = data.draw(st.one_of(st.none(), topologies(n), topologies(max(1, n - 2))))
    d = decide(p, n, current, config)
    chosen = next(c for c in d.candidates if c.topology == d.target)
    assert chosen.feasible and d.target.is_valid and d.target.num_workers == n
    assert d.target_makespan_s == chosen.makespan_s
    if d.current_makespan_s is not None:  # current was feasible: a change must pay off
        assert d.target_makespan_s <= d.current_makespan_s
        assert d.reason is not FORCED
    else:
        assert d.reason is FORCED and d.target != current


@settings(max_examples=100, deadline=None)
@given(workloads(), st.integers(2, 16), st.data(), configs)
def test_hysteresis_keeps_the_current_topology_below_threshold(p, n, data, config):
    current = data.draw(topologies(n))
    cands = evaluate_candidates(p, n, config)
    incumbent = next(c for c in cands if c.topology == current)
    assume(incumbent.feasible)
    d = decide(p, n, current, config)

    def threshold(c):
        same = c.topology.mode is current.mode
        return config.ratio_change_threshold if same else config.mode_switch_threshold

    def gain(c):
        return (incumbent.makespan_s - c.makespan_s) / incumbent.makespan_s

    if all(gain(c) <= threshold(c) for c in cands if c.feasible):
        assert (d.target, d.reason) == (current, KEEP)
    if d.reason is not KEEP:
        chosen = next(c for c in cands if c.topology == d.target)
        assert gain(chosen) > threshold(chosen)
        expected = RATIO if chosen.topology.mode is current.mode else MODE
        assert d.reason is expected


@settings(max_examples=100, deadline=None)
@given(workloads(), st.integers(1, 16), st.data(), configs)
def test_infeasible_current_topology_forces_a_feasible_one(p, n, data, config):
    current = data.draw(
        st.one_of(
            st.just(Topology.split(n, 0)),  # a shrink took every decode worker
            st.just(Topology.split(0, n)),
            topologies(n + 1),  # N_k changed
            st.just(Topology(1, 1, max(1, n - 2))),  # mixed
        )
    )
    d = decide(p, n, current, config)
    assert d.reason is FORCED and d.current_makespan_s is None
    assert d.target.is_valid and d.target.num_workers == n
    assert next(c for c in d.candidates if c.topology == d.target).feasible
    if not any(c.feasible for c in d.candidates if c.topology.mode is Mode.DISAGGREGATED):
        assert d.target == Topology.colocation(n)
