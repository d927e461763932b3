import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pearl.errors import ConfigError, PearlError, WorkloadError
from pearl.workloads.agentic import generate_batch
from pearl.workloads.batch import RolloutBatch, StopReason, TaskGroup, Trajectory, Turn, summarize
from pearl.workloads.distributions import Fixed, LogNormal, UniformInt
from pearl.workloads.profiles import get_profile, profile_from_dict, profile_names, scaled
from pearl.workloads.token_ids import (
    context_token_ids,
    observation_token_ids,
    response_token_ids,
    shared_prefix_token_ids,
)

SWE = get_profile("swe")


def hand_trajectory(index=0, prompt=10, task_id="t"):
    return Trajectory(
        task_id=task_id,
        index_in_group=index,
        turns=(
            Turn(prompt, 5, 5, 1.0),
            Turn(7, 4, 2, 0.5),  # thinking stripped: 2 of 4 kept
            Turn(3, 6, 6, 0.0),
        ),
        shared_prefix_tokens=4,
        env_setup_s=2.0,
        reward_latency_s=3.0,
    )


def test_trajectory_helpers_follow_the_turn_arithmetic():
    traj = hand_trajectory()
    assert traj.context_lengths() == (10, 10 + 5 + 7, 22 + 2 + 3)
    assert traj.context_before(2) == 27
    assert traj.peak_context_tokens == 33
    assert traj.final_context_tokens == 33
    assert traj.generated_tokens == 15
    assert traj.appended_tokens == 10
    assert traj.prompt_tokens == 10
    assert traj.env_time_s == pytest.approx(2.0 + 1.5 + 3.0)
    with pytest.raises(WorkloadError, match="turn_index 3"):
        traj.context_before(3)


@pytest.mark.parametrize(
    "args, match",
    [
        ((-1, 5, 5, 0.0), "observation_tokens"),
        ((1, 0, 0, 0.0), "response_tokens must"),
        ((1, 5, 6, 0.0), "response_tokens_kept"),
        ((1, 5, 5, -0.1), "env_latency_s"),
        ((1, 5, 5, float("nan")), "env_latency_s"),
        ((1.5, 5, 5, 0.0), "observation_tokens"),
    ],
)
def test_turn_rejects_invalid_values(args, match):
    with pytest.raises(WorkloadError, match=match) as info:
        Turn(*args)
    assert isinstance(info.value, PearlError) and isinstance(info.value, ValueError)


def test_groups_and_batches_check_their_members():
    a, b = hand_trajectory(0), hand_trajectory(1)
    group = TaskGroup("t", (a, b))
    assert group.group_size == 2 and group.prompt_tokens == 10
    with pytest.raises(WorkloadError, match="index_in_group"):
        TaskGroup("t", (b, a))
    with pytest.raises(WorkloadError, match="siblings must share"):
        TaskGroup("t", (a, hand_trajectory(1, prompt=11)))
    with pytest.raises(WorkloadError, match="max_context_tokens"):
        RolloutBatch((group,), max_context_tokens=32)
    with pytest.raises(WorkloadError, match="appears twice"):
        RolloutBatch((group, group), max_context_tokens=64)


def test_same_seed_same_batch_and_other_seed_differs():
    first = generate_batch(SWE, seed=7)
    assert generate_batch(SWE, seed=7) == first
    assert generate_batch(SWE, seed=8) != first
    assert first.num_trajectories == 64 and first.num_tasks == 4 and first.group_size == 16


def test_tasks_and_trajectories_do_not_depend_on_batch_size():
    small = generate_batch(SWE, num_tasks=2, group_size=3, seed=1)
    large = generate_batch(SWE, num_tasks=4, group_size=5, seed=1)
    for g_small, g_large in zip(small.groups, large.groups[:2], strict=True):
        assert g_small.trajectories == g_large.trajectories[:3]


def test_swe_defaults_match_the_spec_and_siblings_diverge():
    assert (SWE.max_context_tokens, SWE.group_size, SWE.num_tasks) == (32_768, 16, 4)
    batch = generate_batch(SWE, seed=0)
    for group in batch.groups:
        prompts = {t.prompt_tokens for t in group.trajectories}
        assert len(prompts) == 1 and 2_048 < prompts.pop() <= 4_096
        assert len({t.num_turns for t in group.trajectories}) > 1  # siblings diverge
    assert all(t.peak_context_tokens <= 32_768 for t in batch.trajectories)


def test_swe_planned_turns_are_lognormal_25_with_mean_about_32():
    # Without the context cap the realized turns are the planned draw: median 25, sigma 0.75,
    # clipped to [3, 100] -> mean ~31.9 (docs/workloads.md: "mean ~33" before the clip).
    unbounded = dataclasses.replace(SWE, max_context_tokens=10**8)
    turns = np.array([t.num_turns for t in generate_batch(unbounded, 32, 16, seed=3).trajectories])
    assert 28 <= turns.mean() <= 36
    assert 22 <= np.median(turns) <= 28
    assert turns.min() >= 3 and turns.max() <= 100


def test_swe_context_cap_truncates_about_two_thirds():
    batch = generate_batch(SWE, 16, 16, seed=5)
    summary = summarize(batch)
    assert 10 <= summary.turns_mean <= 22
    assert 0.5 <= summary.stop_fractions["max_context"] <= 0.85
    assert summary.final_context_p90 <= 32_768
    assert sum(summary.stop_fractions.values()) == pytest.approx(1.0)


def test_context_cap_only_truncates_never_changes_earlier_turns():
    capped = generate_batch(SWE, 2, 4, seed=9)
    free = generate_batch(dataclasses.replace(SWE, max_context_tokens=10**8), 2, 4, seed=9)
    for a, b in zip(capped.trajectories, free.trajectories, strict=True):
        n = a.num_turns
        if a.stop is StopReason.MAX_CONTEXT:
            assert a.turns[: n - 1] == b.turns[: n - 1]
            if a.final_context_tokens == SWE.max_context_tokens:
                # The response was cut at the cap; a truncated action is not executed.
                assert a.turns[-1].env_latency_s == 0.0
                assert a.turns[-1].response_tokens <= b.turns[n - 1].response_tokens
            else:
                # The next observation did not fit; the last action still ran.
                assert a.turns[-1] == b.turns[n - 1]
        else:
            assert a == b


def test_response_truncated_at_the_cap_fills_the_context_exactly():
    profile = dataclasses.replace(
        SWE,
        max_context_tokens=6_000,
        turns=Fixed(50),
        response_tokens=LogNormal(median=2_000, sigma=0.0, low=1, high=2_048),
        observation_tokens=Fixed(100),
    )
    for traj in generate_batch(profile, 2, 2, seed=0).trajectories:
        assert traj.stop is StopReason.MAX_CONTEXT
        assert traj.final_context_tokens == 6_000
        assert traj.turns[-1].env_latency_s == 0.0


def test_thinking_profile_strips_thoughts_from_the_next_context():
    batch = generate_batch(get_profile("swe_thinking"), 2, 4, seed=2)
    turns = [turn for t in batch.trajectories for turn in t.turns]
    assert sum(t.response_tokens_kept < t.response_tokens for t in turns) > len(turns) / 2
    assert np.median([t.response_tokens for t in turns]) > 500


@pytest.mark.parametrize("name", profile_names())
def test_every_profile_generates_valid_batches(name):
    profile = get_profile(name)
    batch = generate_batch(profile, num_tasks=2, group_size=4, seed=11)
    assert batch.profile_name == name
    for traj in batch.trajectories:
        assert 1 <= traj.num_turns <= profile.max_turns
        assert traj.peak_context_tokens <= profile.max_context_tokens
        assert traj.turns[0].observation_tokens <= profile.max_prompt_tokens
        assert traj.shared_prefix_tokens == profile.shared_prefix_tokens


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(profile_names()),
    seed=st.integers(0, 2**32),
    tasks=st.integers(1, 3),
    group=st.integers(1, 3),
)
def test_generated_trajectories_keep_their_invariants(name, seed, tasks, group):
    profile = get_profile(name)
    batch = generate_batch(profile, tasks, group, seed)
    assert batch.num_trajectories == tasks * group
    for g in batch.groups:
        assert len({(t.prompt_tokens, t.shared_prefix_tokens) for t in g.trajectories}) == 1
        for traj in g.trajectories:
            assert traj.peak_context_tokens <= profile.max_context_tokens
            if traj.stop is not StopReason.MAX_CONTEXT:
                assert traj.turns[-1].env_latency_s == 0.0
            if traj.stop is StopReason.MAX_TURNS:
                assert traj.num_turns == profile.max_turns
            lat = [t.env_latency_s for t in traj.turns[:-1]]
            assert all(x >= profile.env_overhead_s for x in lat)
            if profile.env_timeout_s is not None:
                assert all(x <= profile.env_timeout_s + profile.env_overhead_s for x in lat)


def test_gui_observations_carry_one_screenshot_per_turn():
    gui = get_profile("gui")
    batch = generate_batch(gui, 3, 2, seed=4)
    for traj in batch.trajectories:
        assert traj.num_turns <= 15
        later = [t.observation_tokens for t in traj.turns[1:]]
        # One screenshot (1,000-2,700 tokens, fixed per task) plus a little text.
        assert all(1_000 < n <= 2_700 + 1_000 for n in later)


def test_search_turns_follow_the_search_count_distribution():
    batch = generate_batch(get_profile("search"), 40, 16, seed=0)
    turns = np.array([t.num_turns for t in batch.trajectories])
    freq = [(turns == k).mean() for k in (1, 2, 3, 4)]
    assert freq == pytest.approx([0.10, 0.40, 0.35, 0.15], abs=0.04)
    assert all(t.peak_context_tokens <= 4_096 for t in batch.trajectories)


def test_game_profile_has_many_short_turns():
    batch = generate_batch(get_profile("game"), 4, 4, seed=0)
    for traj in batch.trajectories:
        assert 10 <= traj.num_turns <= 40 and traj.stop is StopReason.DONE
        assert all(20 <= t.observation_tokens <= 80 for t in traj.turns[1:])
        assert all(5 <= t.response_tokens <= 30 for t in traj.turns)
        assert all(t.env_latency_s <= 0.1 for t in traj.turns)


def test_tiny_and_scaled_profiles_shrink_tokens_and_time():
    tiny = get_profile("tiny")
    assert tiny.max_context_tokens == 2_048 and tiny.batch_size == 8
    batch = generate_batch(tiny, seed=0)
    assert max(t.peak_context_tokens for t in batch.trajectories) <= 2_048
    half = scaled(SWE, token_factor=0.5, time_factor=2.0)
    assert half.max_context_tokens == 16_384 and half.shared_prefix_tokens == 1_024
    assert half.observation_tokens == LogNormal(375, 1.4, 0.5, 5_000)
    assert half.env_overhead_s == pytest.approx(0.6)
    with pytest.raises(ConfigError, match="factors must be > 0"):
        scaled(SWE, token_factor=0)
    assert scaled(get_profile("game"), 0.5).response_tokens == UniformInt(2, 15)


def test_profiles_are_validated_and_loadable_from_config_dicts():
    with pytest.raises(ConfigError, match="valid: swe"):
        get_profile("nope")
    with pytest.raises(ConfigError, match="max_context_tokens must be"):
        dataclasses.replace(SWE, max_context_tokens=4_096)
    with pytest.raises(ConfigError, match="sigma"):
        LogNormal(100, -1)
    custom = profile_from_dict(
        {"base": "swe", "group_size": 8, "turns": {"kind": "uniform_int", "low": 5, "high": 9}}
    )
    assert custom.group_size == 8 and custom.turns == UniformInt(5, 9)
    assert custom.env_latency_s == SWE.env_latency_s
    with pytest.raises(ConfigError, match=r"run\.yaml: field turns\.lognormal\.sigma"):
        profile_from_dict(
            {"base": "swe", "turns": {"kind": "lognormal", "median": 3, "sigma": "x"}}, "run.yaml"
        )


def test_token_ids_are_deterministic_and_siblings_share_prompts():
    batch = generate_batch(SWE, 2, 2, seed=0)
    (a, b), (c, _) = (g.trajectories for g in batch.groups)
    vocab = 1_000
    prompt_a = observation_token_ids(a, 0, vocab, seed=1)
    assert prompt_a == observation_token_ids(b, 0, vocab, seed=1)  # siblings
    assert len(prompt_a) == a.prompt_tokens and all(0 <= i < vocab for i in prompt_a)
    prompt_c = observation_token_ids(c, 0, vocab, seed=1)
    shared = SWE.shared_prefix_tokens
    assert prompt_c[:shared] == prompt_a[:shared] == shared_prefix_token_ids(shared, vocab, 1)
    assert prompt_c[shared:] != prompt_a[shared : len(prompt_c)]
    assert observation_token_ids(a, 1, vocab, seed=1) != observation_token_ids(b, 1, vocab, seed=1)
    assert observation_token_ids(a, 1, vocab, seed=2) != observation_token_ids(a, 1, vocab, seed=1)
    assert len(observation_token_ids(a, 1, vocab)) == a.turns[1].observation_tokens
    ids = response_token_ids(a, 0, vocab, first_id=900)
    assert len(ids) == a.turns[0].response_tokens and min(ids) >= 900
    with pytest.raises(WorkloadError, match="first_id"):
        observation_token_ids(a, 0, vocab, first_id=vocab)


def test_context_token_ids_concatenate_observations_and_kept_responses():
    traj = hand_trajectory()
    vocab = 50
    ctx = context_token_ids(traj, 2, vocab, seed=3)
    assert len(ctx) == traj.context_before(2)
    obs = [observation_token_ids(traj, k, vocab, 3) for k in range(3)]
    resp = [response_token_ids(traj, k, vocab, 3) for k in range(2)]
    assert ctx == obs[0] + resp[0] + obs[1] + resp[1][-2:] + obs[2]
    live = [[1] * 5, [2, 3, 4, 5]]
    assert context_token_ids(traj, 2, vocab, 3, responses=live) == (
        obs[0] + live[0] + obs[1] + [4, 5] + obs[2]
    )
    with pytest.raises(WorkloadError, match=r"responses\[1\] must hold 4 ids"):
        context_token_ids(traj, 2, vocab, 3, responses=[[1] * 5, [1]])


def test_observation_window_collapses_old_observations_in_every_context():
    turns = tuple(Turn(obs, 5, 5, 0.1) for obs in (10, 40, 50, 60, 70))
    traj = Trajectory("t", 0, turns, observation_window=2, collapsed_observation_tokens=3)
    # Turn 3 sees observations 2 and 3 whole, observation 1 collapsed to 3 tokens.
    assert traj.observation_shown(1, 3) == 3 and traj.observation_shown(2, 3) == 50
    assert traj.context_before(3) == 10 + 5 + 3 + 5 + 50 + 5 + 60
    for k in range(len(turns)):
        assert len(context_token_ids(traj, k, 97)) == traj.context_before(k)
    ctx3 = context_token_ids(traj, 3, 97)
    obs1 = observation_token_ids(traj, 1, 97)
    assert ctx3[15:18] == obs1[:3]  # the stub is the observation's first tokens
    with pytest.raises(WorkloadError, match="observation_window"):
        Trajectory("t", 0, turns, observation_window=0)


def test_profiles_with_an_observation_window_fit_more_turns_under_the_cap():
    base = dataclasses.replace(get_profile("swe"), turns=Fixed(100), max_turns=100)
    windowed = dataclasses.replace(base, observation_window=5, collapsed_observation_tokens=16)
    a, b = (generate_batch(p, 1, 8, seed=1) for p in (base, windowed))
    assert sum(t.num_turns for t in b.trajectories) > 1.5 * sum(t.num_turns for t in a.trajectories)
    for traj in b.trajectories:
        assert traj.observation_window == 5
        assert traj.peak_context_tokens <= windowed.max_context_tokens
