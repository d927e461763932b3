"""The makespan model against hand-computed cases and its own equations."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.control.makespan import (
    WorkloadParams,
    colocated,
    disaggregated,
    paper_makespan,
    predict,
)
from pearl.control.state import Topology


def params(**overrides) -> WorkloadParams:
    """S=10, r=100, dL=1000, A=0.01, t_prefill=1e-4, T_over=2, T_env=50, K=1e5, BW=1e10,
    B=48; b=0 unless overridden (the concurrency then costs nothing, so the cases solve by
    hand); W_D = S*r = 1000, W_P = S*dL = 10000 unless overridden."""
    base = dict(
        turns=10,
        decode_tokens_per_turn=100,
        appended_tokens_per_turn=1000,
        bubble_ratio=1.0,
        decode_step_fixed_s=0.01,
        decode_step_per_sequence_s=0.0,
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


def test_colocated_by_hand():
    # D = S*r*A = 10; own prefill + T_over: 10*(0.1 + 2) = 21; P = 48*10000*1e-4/8 = 6 s of
    # prefill per worker, the share landing in the slowest trajectory's decoding P*D/T:
    # T = 50 + 10 + 21 + 60/T  ->  T^2 - 81 T - 60 = 0
    pred = colocated(params(), 8)
    assert pred.makespan_s == pytest.approx((81 + math.sqrt(81**2 + 240)) / 2, rel=1e-9)
    assert pred.decode_s == pytest.approx(10.0)
    assert pred.prefill_s == pytest.approx(21 + 60 / pred.makespan_s)
    assert pred.prefill_utilization is None


def test_disaggregated_by_hand():
    # 2P6D: D = 10; the prefill pool is busy 48*10000*1e-4/2 = 24 s, rho = 24/T; per turn the
    # slowest trajectory waits 0.1 s of prefill times the M/D/1 factor, plus 1000*1e5/1e10
    # = 0.01 s of KV move: T = 50 + 10 + 10*(0.1*(1 + rho/(2(1-rho))) + 0.01)
    pred = disaggregated(params(), 2, 6)
    T = pred.makespan_s
    rho = 24 / T
    assert pred.prefill_utilization == pytest.approx(rho)
    assert T == pytest.approx(60 + 10 * (0.1 * (1 + rho / (2 * (1 - rho))) + 0.01), rel=1e-9)
    assert 61.1 < T < 61.6
    # free transfer drops exactly the 0.1 s of KV moves (the fixed point moves a little)
    free = disaggregated(params(pd_bandwidth_bytes_per_s=math.inf), 2, 6)
    assert T - 0.1 - 1e-3 < free.makespan_s < T - 0.1 + 1e-3


def test_concurrency_follows_work_conservation():
    # with b > 0: each colocated worker decodes W = 48*2000/8 = 12000 tokens at concurrency c
    # in the time prefill (P = 48*40*1000*1e-4/8 = 24 s) leaves it, W*(A/c + b) = T - P, and
    # the slowest trajectory's decode steps cost A + b*c
    p = params(
        decode_step_per_sequence_s=1e-3,
        turns=40,
        decode_tokens_per_trajectory=2000,
        env_time_s=0,
        switch_overhead_s=0,
    )
    pred = colocated(p, 8)
    W, P = 12000, 24
    c = pred.concurrency
    assert 1 < c < 6
    assert W * (0.01 / c + 1e-3) == pytest.approx(pred.makespan_s - P, rel=1e-9)
    assert pred.decode_s == pytest.approx(40 * 100 * (0.01 + 1e-3 * c))
    # disaggregated, the decode pool's W = 48*2000/N_D tokens fill the whole makespan
    split = disaggregated(p, 2, 6)
    assert 1 < split.concurrency < 8
    assert 16000 * (0.01 / split.concurrency + 1e-3) == pytest.approx(split.makespan_s, rel=1e-9)


def test_concurrency_is_capped_by_the_trajectories_a_worker_holds():
    # no prefill, no environment, every trajectory as long as the slowest: all decode all
    # the time, c = B/N
    p = params(
        decode_step_per_sequence_s=1e-2,
        env_time_s=0,
        switch_overhead_s=0,
        prefill_s_per_token=0,
        kv_bytes_per_token=0,
    )
    assert colocated(p, 8).concurrency == pytest.approx(6)
    assert disaggregated(p, 4, 4).concurrency == pytest.approx(12)
    # a tenth of the tokens elsewhere in the batch: fewer decode at once
    assert colocated(params(decode_tokens_per_trajectory=100), 8).concurrency == 1


def test_a_saturated_prefill_pool_sets_the_makespan():
    # 1P7D with 10x the prompt tokens: the pool alone is busy 480 s
    p = params(appended_tokens_per_turn=10_000)
    pred = disaggregated(p, 1, 7)
    assert pred.makespan_s > 480 and pred.prefill_utilization < 1
    assert pred.prefill_utilization == pytest.approx(480 / pred.makespan_s)


def test_the_paper_forms_by_hand():
    # with b=0 and theta=1: T_decode = 10*100*0.01*2 = 20, T_prefill(2, 6) = 10*(48*1000*1e-4/2
    # + 48*1000*1e5/(1e10*2)) = 26.4; T_dis = 26.4 + 50; T_coloc(8) = 10*(0.6 + 1 + 2) + 50
    assert paper_makespan(params(), Topology.split(2, 6)) == pytest.approx(76.4)
    assert paper_makespan(params(), Topology.colocation(8)) == pytest.approx(86.0)


@st.composite
def workloads(draw) -> WorkloadParams:
    return WorkloadParams(
        turns=draw(st.integers(1, 50)),
        decode_tokens_per_turn=draw(st.floats(1, 2000)),
        appended_tokens_per_turn=draw(st.floats(0, 20000)),
        bubble_ratio=0.0,
        decode_step_fixed_s=draw(st.floats(1e-4, 0.1)),
        decode_step_per_sequence_s=draw(st.floats(0, 1e-2)),
        prefill_s_per_token=draw(st.floats(0, 1e-3)),
        switch_overhead_s=draw(st.floats(0, 10)),
        env_time_s=draw(st.floats(0, 500)),
        kv_bytes_per_token=draw(st.floats(0, 2e5)),
        pd_bandwidth_bytes_per_s=draw(st.floats(1e8, 1e12)),
        kv_bytes_per_trajectory=1.0,
        kv_capacity_bytes_per_worker=1e9,
        batch_trajectories=draw(st.integers(1, 256)),
    )


@settings(max_examples=150, deadline=None)
@given(workloads(), st.integers(1, 16), st.integers(1, 16))
def test_every_prediction_solves_its_own_equation(p, n_p, n_d):
    """T equals the right-hand side rebuilt here from T and the prediction's concurrency."""
    S, r, dL, A, b, t = (
        p.turns,
        p.decode_tokens_per_turn,
        p.appended_tokens_per_turn,
        p.decode_step_fixed_s,
        p.decode_step_per_sequence_s,
        p.prefill_s_per_token,
    )
    B = p.batch_trajectories
    for pred, decoders in (
        (predict(p, Topology.colocation(n_p + n_d)), n_p + n_d),
        (predict(p, Topology.split(n_p, n_d)), n_d),
    ):
        T, c = pred.makespan_s, pred.concurrency
        assert 1 <= c <= max(1, B / decoders) + 1e-9
        assert pred.decode_s == pytest.approx(S * r * (A + b * c))
        if pred.prefill_utilization is None:
            P = B * p.prefill_tokens_per_trajectory * t / decoders
            own = S * (dL * t + p.switch_overhead_s)
            rhs = p.env_time_s + pred.decode_s + own + P * min(1, pred.decode_s / T)
        else:
            rho = B * p.prefill_tokens_per_trajectory * t / (n_p * T)
            assert rho == pytest.approx(pred.prefill_utilization) and rho < 1
            move = dL * p.kv_bytes_per_token / p.pd_bandwidth_bytes_per_s
            rhs = p.env_time_s + pred.decode_s + S * (dL * t * (1 + rho / (2 * (1 - rho))) + move)
        assert T == pytest.approx(rhs, rel=1e-7, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    workers=st.integers(1, 300),
    b=st.sampled_from([0.0, 1e-5, 3e-4]),
    t=st.floats(1e-7, 1e-2),
    env=st.floats(0.0, 500.0),
    batch=st.integers(1, 4096),
    dL=st.integers(1, 50_000),
)
def test_all_splits_at_once_are_bitwise_each_split_alone(workers, b, t, env, batch, dL):
    """disaggregated_splits (numpy lanes) gives exactly disaggregated(n_p, N - n_p) for
    every split: overloaded prefill pools (rho >= 1 lanes) and free-decode cases too."""
    from pearl.control.makespan import disaggregated_splits

    p = params(
        decode_step_per_sequence_s=b,
        prefill_s_per_token=t,
        env_time_s=env,
        batch_trajectories=batch,
        appended_tokens_per_turn=dL,
    )
    together = disaggregated_splits(p, workers)
    assert together == [disaggregated(p, n_p, workers - n_p) for n_p in range(1, workers)]
