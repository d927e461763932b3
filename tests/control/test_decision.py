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
    bubble_ratio,
    colocated_makespan,
    decide,
    decide_split,
    decode_path_makespan,
    disaggregated_makespan,
    evaluate_candidates,
    predict_makespan,
    prefill_path_makespan,
    split_violations,
)
from pearl.control.state import Mode, Topology

KEEP, RATIO, MODE, FORCED = (
    DecisionReason.KEEP,
    DecisionReason.RATIO_CHANGE,
    DecisionReason.MODE_SWITCH,
    DecisionReason.FORCED,
)


def params(**overrides) -> WorkloadParams:
    """S=10, r=100, dL=1000, theta=1, A=0.01, b=0.001, t_prefill=1e-4, T_over=2, T_env=50,
    K=1e5, BW=1e10, K_seq=1e9, H_max=2e10, B=48. By hand, for these values:
      T_decode(N_D)  = 10*100*(0.01 + 0.001*48/(N_D*2))*2 = 20 + 48/N_D
      T_prefill(N_P, N_D) = 10*(48*1000*1e-4/N_P + 48*1000*1e5/(1e10*min(N_P, N_D)))
                          = 48/N_P + 4.8/min(N_P, N_D)
      KV: 48*1e9 <= N_D*2e10  <=>  N_D >= 3
    """
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


def approx(x):
    return pytest.approx(x, rel=1e-12)


def test_makespan_formulas_by_hand():
    p = params()
    # T_coloc(8) = 10*[(48*1000/8)*1e-4 + 100*(0.01 + 0.001*48/8) + 2] + 50 = 10*(0.6+1.6+2) + 50
    assert colocated_makespan(p, 8) == approx(92.0)
    assert decode_path_makespan(p, 5) == approx(29.6)  # 20 + 48/5
    assert decode_path_makespan(p, 6) == approx(28.0)  # 20 + 48/6
    assert prefill_path_makespan(p, 3, 5) == approx(17.6)  # 48/3 + 4.8/3
    assert prefill_path_makespan(p, 3, 1) == approx(20.8)  # 48/3 + 4.8/1: one decode link
    assert disaggregated_makespan(p, 3, 5) == approx(79.6)  # max(17.6, 29.6) + 50
    assert disaggregated_makespan(p, 2, 6) == approx(78.0)  # max(26.4, 28.0) + 50
    assert predict_makespan(p, Topology.split(4, 4)) == approx(82.0)  # max(13.2, 32) + 50
    assert predict_makespan(p, Topology.colocation(8)) == approx(92.0)
    # free transfer (BW = inf) drops the 4.8 s transfer term
    assert prefill_path_makespan(params(pd_bandwidth_bytes_per_s=math.inf), 3, 5) == approx(16.0)
    assert bubble_ratio(0.5) == 1.0 and bubble_ratio(0.8) == approx(0.25)


def test_candidates_and_feasibility_by_hand():
    cands = {c.topology.label: c for c in evaluate_candidates(params(), 8, DecisionConfig())}
    assert list(cands) == ["8C", "1P7D", "2P6D", "3P5D", "4P4D", "5P3D", "6P2D", "7P1D"]
    assert cands["8C"].makespan_s == approx(92.0) and cands["8C"].feasible
    # 1P7D: prefill path 52.8 > decode path 20 + 48/7 = 26.857 -> the prefill pool backs up
    assert cands["1P7D"].violations == (Infeasibility.PREFILL_BACKLOG,)
    # 2P6D: 24 + 4.8/2 = 26.4 <= 28.0 (two links move KV at once)
    assert cands["2P6D"].feasible and cands["2P6D"].makespan_s == approx(78.0)
    assert cands["3P5D"].feasible and cands["5P3D"].feasible
    # 6P2D: 48e9 bytes of KV > 2 * 2e10
    assert cands["6P2D"].violations == (Infeasibility.KV_MEMORY,)
    assert cands["7P1D"].makespan_s == approx(118.0)  # 20 + 48 + 50
    # a slack of 1 admits 1P7D: 52.8 <= 2 * 26.857
    assert split_violations(params(), 1, 7, DecisionConfig(prefill_slack=1.0)) == ()
    # KV memory exactly full is feasible: 48e9 <= 3 * 1.6e10
    assert (
        split_violations(params(kv_capacity_bytes_per_worker=1.6e10), 5, 3, DecisionConfig()) == ()
    )


def test_best_split_beats_colocation_and_becomes_the_initial_topology():
    d = decide(params(), 8, None)
    assert d.target == Topology.split(2, 6) and d.reason is FORCED
    assert d.target_makespan_s == approx(78.0) and d.current_makespan_s is None
    # a lower bandwidth backs 2P6D's prefill pool up (24 + 9.6/2 = 28.8 > 28): 3P5D
    assert decide(params(pd_bandwidth_bytes_per_s=5e9), 8, None).target == Topology(3, 5)


def test_mode_switch_when_the_gain_clears_the_mode_threshold():
    d = decide(params(), 8, Topology.colocation(8))
    # (92.0 - 78.0) / 92.0 = 0.152 > 0.05
    assert (d.target, d.reason) == (Topology.split(2, 6), MODE)
    assert d.current_makespan_s == approx(92.0)
    held = decide(params(), 8, Topology.colocation(8), DecisionConfig(mode_switch_threshold=0.16))
    assert (held.target, held.reason) == (Topology.colocation(8), KEEP)


def test_small_mode_gain_keeps_colocation():
    # T_over = 1: T_coloc(8) = 10*(0.6 + 1.6 + 1) + 50 = 82.0; gain to 2P6D = 4/82 = 0.049
    d = decide(params(switch_overhead_s=1.0), 8, Topology.colocation(8))
    assert (d.target, d.reason) == (Topology.colocation(8), KEEP)
    assert d.best.topology == Topology.split(2, 6)  # the model prefers it, hysteresis holds
    assert not d.changed


def test_ratio_change_uses_the_smaller_threshold():
    # 4P4D = 82.0 -> 2P6D = 78.0: gain 4/82 = 0.0488 > 0.02
    d = decide(params(), 8, Topology.split(4, 4))
    assert (d.target, d.reason) == (Topology.split(2, 6), RATIO)
    held = decide(params(), 8, Topology.split(4, 4), DecisionConfig(ratio_change_threshold=0.05))
    assert (held.target, held.reason) == (Topology.split(4, 4), KEEP)
    # same gain vs colocation (T_over=1: 82.0) is not enough for a mode switch, but is for a ratio
    d = decide(params(switch_overhead_s=1.0), 8, Topology.split(4, 4))
    assert (d.target, d.reason) == (Topology.split(2, 6), RATIO)


def test_shrink_that_breaks_the_split_forces_a_change():
    # 4P4D with 7 workers left: the counts no longer sum to N_k.
    # N_k=7: 2P5D = max(26.4, 29.6) + 50 = 79.6; 3P4D = 82; 4P3D = 86; 1P6D backs up;
    # T_coloc(7) = 10*(0.6857 + 1.6857 + 2) + 50 = 93.71
    d = decide(params(), 7, Topology.split(4, 4))
    assert (d.target, d.reason) == (Topology.split(2, 5), FORCED)
    assert d.target_makespan_s == approx(79.6)


def test_no_feasible_split_falls_back_to_colocation():
    # 4 workers, the only decode worker gone (4P0D): 1P3D backs up (52.8 > 36),
    # 2P2D and 3P1D cannot hold 48 GB of KV. T_coloc(4) = 10*(1.2 + 2.2 + 2) + 50 = 104
    d = decide(params(), 4, Topology.split(4, 0))
    assert (d.target, d.reason) == (Topology.colocation(4), FORCED)
    assert d.target_makespan_s == approx(104.0)
    assert decide(params(), 1, Topology.split(1, 1)).target == Topology.colocation(1)


def test_forced_disaggregation_takes_the_best_split_even_when_colocation_wins():
    # T_over = 0: T_coloc(8) = 10*(0.6 + 1.6) + 50 = 72 beats every split (2P6D = 78)
    p = params(switch_overhead_s=0.0)
    assert decide(p, 8, None).target == Topology.colocation(8)
    d = decide_split(p, 8, None)
    assert (d.target, d.reason) == (Topology.split(2, 6), FORCED)
    # from 4P4D (82): 78 is a 4.9% gain, over the 2% ratio threshold; under 5% it stays
    assert decide_split(p, 8, Topology.split(4, 4)).target == Topology.split(2, 6)
    held = decide_split(p, 8, Topology.split(4, 4), DecisionConfig(ratio_change_threshold=0.05))
    assert (held.target, held.reason) == (Topology.split(4, 4), KEEP)
    # 2 workers: 1P1D is the only split, infeasible (48 GB of KV on one 20 GB worker) yet taken
    two = decide_split(p, 2, Topology.colocation(2))
    assert two.target == Topology.split(1, 1) and not two.candidates[1].feasible
    with pytest.raises(DecisionError, match=">= 2 workers"):
        decide_split(p, 1, None)


def test_forced_growth_stays_in_mode_unless_the_other_wins_by_the_mode_threshold():
    p = params(switch_overhead_s=1.0)
    # 8C plus one joiner, N_k=9: T_coloc(9) = 10*(0.5333 + 1.5333 + 1) + 50 = 80.667;
    # best split 2P7D = max(26.4, 26.857) + 50 = 76.857; gain 3.81/80.667 = 0.047 < 0.05
    d = decide(p, 9, Topology.colocation(8))
    assert (d.target, d.reason) == (Topology.colocation(9), FORCED)
    assert d.target_makespan_s == approx(80.0 + 2 / 3)
    free = decide(p, 9, Topology.colocation(8), DecisionConfig(mode_hysteresis_when_forced=False))
    assert (free.target, free.reason) == (Topology.split(2, 7), FORCED)


def test_decision_serializes_for_the_event_log():
    d = decide(params(), 4, Topology.split(2, 2)).to_dict()
    assert d["target"] == "4C" and d["reason"] == "forced"
    assert d["candidates"][2] == {
        "topology": "2P2D",
        "makespan_s": pytest.approx(94.0),  # max(26.4, 44) + 50
        "prefill_path_s": pytest.approx(26.4),
        "decode_path_s": pytest.approx(44.0),
        "violations": ["kv_memory"],
    }


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
    prefill_slack=st.sampled_from([0.0, 0.1, math.inf]),
    mode_hysteresis_when_forced=st.booleans(),
)


def topologies(n: int):
    return st.one_of(
        st.just(Topology.colocation(n)),
        st.integers(1, max(1, n - 1)).map(lambda p: Topology.split(p, max(0, n - p))),
    )


@settings(max_examples=100, deadline=None)
@given(workloads(), st.integers(1, 31))
def test_more_workers_never_lengthen_a_path(p, n):
    assert decode_path_makespan(p, n + 1) <= decode_path_makespan(p, n)
    assert prefill_path_makespan(p, n + 1, n + 1) <= prefill_path_makespan(p, n, n)
    assert prefill_path_makespan(p, n + 1, 1) <= prefill_path_makespan(p, n, 1)
    assert colocated_makespan(p, n + 1) <= colocated_makespan(p, n)


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
