import math

import numpy as np
import pytest

from pearl.control.decision import WorkloadParams
from pearl.control.tracker import (
    Ema,
    IterationObservation,
    RuntimeTracker,
    TrajectoryObservation,
    TurnObservation,
)

PRIOR = WorkloadParams(
    turns=1,
    decode_tokens_per_turn=1,
    appended_tokens_per_turn=1,
    bubble_ratio=0,
    decode_step_fixed_s=1,
    decode_step_per_sequence_s=1,
    prefill_s_per_token=1,
    switch_overhead_s=0,
    env_time_s=0,
    kv_bytes_per_token=1,
    pd_bandwidth_bytes_per_s=math.inf,
    kv_bytes_per_trajectory=1,
    kv_capacity_bytes_per_worker=math.inf,
    batch_trajectories=1,
)


def test_iteration_costs_are_recovered_from_worker_reports():
    tr = RuntimeTracker(PRIOR, alpha=1.0)
    a, b, t = 0.02, 0.0005, 0.0001
    for n in (1, 2, 4, 8, 16, 24, 32, 64):
        tr.observe_iteration(IterationObservation(n, 0, a + b * n))
    for p in (128, 512, 2048):
        tr.observe_iteration(IterationObservation(0, p, t * p))
    tr.observe_iteration(IterationObservation(8, 256, a + b * 8 + t * 256))
    params = tr.end_step(batch_size=8, makespan_s=10)
    assert params.decode_step_fixed_s == pytest.approx(a)
    assert params.decode_step_per_sequence_s == pytest.approx(b)
    assert params.prefill_s_per_token == pytest.approx(t)
    assert params.batch_trajectories == 8
    report = tr.fit_report
    assert report["decode_step_per_sequence_s"].samples == 8
    assert report["prefill_s_per_token"].samples == 4
    assert {report[k].source for k in report} == {"fit"}


def test_decode_costs_from_noisy_iterations_with_growing_contexts_within_5_percent():
    """Synthetic iterations from known A and per-token KV cost c (b = c x mean context):
    batches shrink as trajectories finish while contexts grow, as in a rollout."""
    rng = np.random.default_rng(0)
    A, c = 0.012, 2e-8  # 12 ms weight reads; 20 ns per context token read
    tr = RuntimeTracker(PRIOR, alpha=1.0)
    weighted_ctx = weighted_n = 0
    for _step in range(400):
        n = int(rng.integers(1, 33))
        ctx = n * int(rng.integers(2_000, 30_000))
        k = int(rng.integers(1, 50))  # a fast-forwarded stretch of k iterations
        seconds = (A + c * ctx) * (1 + 0.02 * rng.standard_normal())
        tr.observe_iteration(IterationObservation(n, 0, seconds, ctx, k))
        weighted_ctx += k * ctx
        weighted_n += k * n
    params = tr.end_step(batch_size=64, makespan_s=100)
    b = c * weighted_ctx / weighted_n
    assert params.decode_step_fixed_s == pytest.approx(A, rel=0.05)
    assert params.decode_step_per_sequence_s == pytest.approx(b, rel=0.05)


def test_without_varied_decode_batches_b_keeps_its_prior_and_never_goes_non_positive():
    tr = RuntimeTracker(PRIOR, alpha=1.0)
    for _ in range(20):  # always 16 sequences: b is not identifiable
        tr.observe_iteration(IterationObservation(16, 0, 0.05))
    params = tr.end_step(batch_size=16, makespan_s=10)
    assert params.decode_step_per_sequence_s == PRIOR.decode_step_per_sequence_s
    assert tr.fit_report["decode_step_per_sequence_s"].source == "kept"
    # Times that fall as batches grow (noise, interference) would fit b < 0: kept instead.
    tr = RuntimeTracker(PRIOR, alpha=1.0)
    for n in range(1, 30):
        tr.observe_iteration(IterationObservation(n, 0, 1.0 - 0.01 * n))
    params = tr.end_step(batch_size=16, makespan_s=10)
    assert params.decode_step_per_sequence_s > 0 and params.decode_step_fixed_s > 0
    assert params.prefill_s_per_token == PRIOR.prefill_s_per_token


def test_workload_shape_and_bubbles_come_from_trajectory_telemetry():
    tr = RuntimeTracker(PRIOR, alpha=1.0)
    turn = TurnObservation(
        appended_tokens=100, generated_tokens=50, kept_tokens=50, env_time_s=2.0, decode_s=1.0
    )
    tr.observe_trajectory(TrajectoryObservation((turn,) * 4, lifetime_s=20))
    tr.observe_trajectory(TrajectoryObservation((turn,) * 2, lifetime_s=10))
    params = tr.end_step(batch_size=2, makespan_s=20)
    assert params.turns == 4  # the slowest trajectory
    assert params.decode_tokens_per_turn == 50
    assert params.appended_tokens_per_turn == 150
    assert params.env_time_s == 8.0
    f = 6 * 1.0 / (2 * 20)  # decoding time over trajectory-seconds
    assert params.bubble_ratio == pytest.approx((1 - f) / f)


def test_the_critical_path_follows_the_slowest_trajectory_and_the_load_the_whole_batch():
    """S, r, dL and T_env are the last trajectory to finish's (not the maxima of different
    trajectories); W_D and W_P are the batch's means."""
    tr = RuntimeTracker(PRIOR, alpha=1.0)
    many = TurnObservation(100, 10, 0, env_time_s=1.0, decode_s=0.1)
    long = TurnObservation(300, 500, 20, env_time_s=30.0, decode_s=5.0)
    tr.observe_trajectory(TrajectoryObservation((many,) * 10, lifetime_s=20))  # most turns
    tr.observe_trajectory(  # finishes last
        TrajectoryObservation((long,) * 3, lifetime_s=120, setup_s=10.0)
    )
    params = tr.end_step(batch_size=2, makespan_s=120)
    assert (params.turns, params.decode_tokens_per_turn) == (3, 500)
    # its environment: setup and every turn's time (the reward is in the last turn's)
    assert params.appended_tokens_per_turn == 320 and params.env_time_s == 100
    assert params.decode_tokens_per_trajectory == (100 + 1500) / 2
    assert params.prefill_tokens_per_trajectory == (1000 + 960) / 2


def test_iteration_costs_come_from_the_last_step_only():
    tr = RuntimeTracker(PRIOR, alpha=1.0)
    for step, fixed in enumerate((0.01, 0.03)):
        for n in range(1, 17):
            tr.observe_iteration(IterationObservation(n, 0, fixed + 0.001 * n))
        params = tr.end_step(batch_size=1, makespan_s=1)
        assert params.decode_step_fixed_s == pytest.approx(fixed), step


def test_parameters_are_smoothed_across_steps():
    tr = RuntimeTracker(PRIOR, alpha=0.5)
    for gen in (100, 200):
        turn = TurnObservation(10, gen, gen, 0.0, 1.0)
        tr.observe_trajectory(TrajectoryObservation((turn,), lifetime_s=1))
        params = tr.end_step(1, 1)
    assert params.decode_tokens_per_turn == 150


def test_without_observations_the_prior_stands():
    params = RuntimeTracker(PRIOR).end_step(batch_size=4, makespan_s=0)
    assert params.decode_step_fixed_s == PRIOR.decode_step_fixed_s
    assert params.batch_trajectories == 4


def test_toggle_cost_ema():
    e = Ema(0.5)
    assert e.update(10) == 10 and e.update(20) == 15
    with pytest.raises(ValueError):
        Ema(0)


def test_measured_borrowing_saving_needs_batches_with_and_without_borrowing():
    tr = RuntimeTracker(PRIOR, alpha=1.0)
    tr.observe_borrowing(90.0, 100.0, borrowed=True)
    assert tr.measured_borrow_saving() is None  # nothing to compare with yet
    tr.observe_borrowing(110.0, 100.0, borrowed=False)
    # dedicated batches ran at 1.1x the model, borrowed ones at 0.9x: borrowing saved 18%
    assert tr.measured_borrow_saving() == pytest.approx((1.1 - 0.9) / 1.1)
    tr.observe_borrowing(0.0, 100.0, borrowed=False)  # ignored: no makespan
    assert tr.measured_borrow_saving() == pytest.approx((1.1 - 0.9) / 1.1)
