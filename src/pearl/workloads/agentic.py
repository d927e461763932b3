"""Agentic rollout workloads: generate a rollout batch from a workload profile.

A rollout batch is ``num_tasks`` tasks x ``group_size`` trajectories (GRPO groups). The
workload fixes every length in advance, so the simulator and a live engine see
trajectories of the *same shape*: live generation runs with ``ignore_eos`` and
``max_new_tokens = response_tokens``. Token contents come from
:mod:`pearl.workloads.token_ids`, deterministic in (seed, task, trajectory, turn).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pearl.errors import ConfigError
from pearl.workloads.batch import RolloutBatch, StopReason, TaskGroup, Trajectory, Turn, _is_int
from pearl.workloads.distributions import _check, _tokens
from pearl.workloads.profiles import AgenticProfile


def _rng(seed: int, *key: int) -> np.random.Generator:
    # spawn_key makes each task's and trajectory's stream independent of how many others
    # there are: task i of a 4-task batch equals task i of an 8-task batch with the same seed.
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def _draw_turn(
    profile: AgenticProfile,
    rng: np.random.Generator,
    prompt_tokens: int | None,
    image_tokens: int,
) -> tuple[int, int, int, float]:
    """A turn's observation (``prompt_tokens`` on the first), response, kept and env latency."""
    # Every quantity is drawn before the caller decides whether the turn fits, so a turn's
    # values do not depend on the context cap (changing the cap only truncates).
    if prompt_tokens is not None:
        observation = prompt_tokens
    else:
        observation = _tokens(profile.observation_tokens, rng, 1) + image_tokens
    response = _tokens(profile.response_tokens, rng, 1)
    kept = response
    if profile.kept_response_tokens is not None:
        kept = min(response, _tokens(profile.kept_response_tokens, rng, 1))
    latency = profile.env_latency_s.sample(rng)
    if profile.env_timeout_s is not None:
        latency = min(latency, profile.env_timeout_s)
    return observation, response, kept, latency + profile.env_overhead_s


def _trajectory(
    profile: AgenticProfile,
    rng: np.random.Generator,
    task_id: str,
    index: int,
    prompt_tokens: int,
    image_tokens: int,
) -> Trajectory:
    drawn = round(profile.turns.sample(rng))
    planned = min(profile.max_turns, max(profile.min_turns, drawn))
    env_setup_s = profile.env_setup_s.sample(rng)
    reward_latency_s = profile.reward_latency_s.sample(rng)
    max_ctx = profile.max_context_tokens
    turns: list[Turn] = []
    context = 0
    window, stub = profile.observation_window, profile.collapsed_observation_tokens
    # Only a draw the cap cut short is a turn-limit stop; one that lands on the cap finished.
    stop = StopReason.MAX_TURNS if drawn > profile.max_turns else StopReason.DONE
    for k in range(planned):
        if window is not None and k - window >= 1:  # an observation leaves the window
            old = turns[k - window].observation_tokens
            context -= old - min(old, stub)
        observation, response, kept, latency = _draw_turn(
            profile, rng, prompt_tokens if k == 0 else None, image_tokens
        )
        room = max_ctx - context - observation  # tokens left to generate this turn
        if room < 1:
            stop = StopReason.MAX_CONTEXT
            break
        if response >= room:
            # Generation is cut at the cap; a truncated action is not executed.
            response = room
            kept = min(kept, response)
            turns.append(Turn(observation, response, kept, 0.0))
            stop = StopReason.MAX_CONTEXT
            break
        turns.append(Turn(observation, response, kept, latency))
        context += observation + kept
    else:
        # The last response is the answer/submission: no environment step follows
        # (its evaluation is reward_latency_s).
        turns[-1] = dataclasses.replace(turns[-1], env_latency_s=0.0)
    return Trajectory(
        task_id=task_id,
        index_in_group=index,
        turns=tuple(turns),
        shared_prefix_tokens=profile.shared_prefix_tokens,
        env_setup_s=env_setup_s,
        reward_latency_s=reward_latency_s,
        stop=stop,
        observation_window=window,
        collapsed_observation_tokens=stub,
    )


def generate_batch(
    profile: AgenticProfile,
    num_tasks: int | None = None,
    group_size: int | None = None,
    seed: int = 0,
) -> RolloutBatch:
    """Draw ``num_tasks`` x ``group_size`` trajectories (defaults: the profile's); same seed, same batch.

    Siblings share their task's initial prompt; each samples its own turns. Task ``i``
    and trajectory ``(i, j)`` do not depend on the batch's size.
    """
    num_tasks = profile.num_tasks if num_tasks is None else num_tasks
    group_size = profile.group_size if group_size is None else group_size
    _check(
        _is_int(num_tasks) and num_tasks >= 1, f"num_tasks must be an int >= 1, got {num_tasks!r}"
    )
    _check(
        _is_int(group_size) and group_size >= 1,
        f"group_size must be an int >= 1, got {group_size!r}",
    )
    _check(_is_int(seed) and seed >= 0, f"seed must be an int >= 0, got {seed!r}")
    groups = []
    for i in range(num_tasks):
        task_rng = _rng(seed, i)
        task_id = f"{profile.name}-s{seed}-t{i:04d}"
        image = 0 if profile.image_tokens is None else _tokens(profile.image_tokens, task_rng, 0)
        room = profile.max_prompt_tokens - profile.shared_prefix_tokens - image
        if room < 1:
            raise ConfigError(
                f"AgenticProfile({profile.name}): max_prompt_tokens {profile.max_prompt_tokens} "
                f"leaves no room for a task prompt after the shared prefix "
                f"({profile.shared_prefix_tokens}) and a {image}-token screenshot"
            )
        prompt = (
            profile.shared_prefix_tokens
            + _tokens(profile.task_prompt_tokens, task_rng, 1, room)
            + image
        )
        groups.append(
            TaskGroup(
                task_id,
                tuple(
                    _trajectory(profile, _rng(seed, i, j + 1), task_id, j, prompt, image)
                    for j in range(group_size)
                ),
            )
        )
    return RolloutBatch(tuple(groups), profile.max_context_tokens, profile.name, seed)


# ---------------------------------------------------------------------------
# Summary statistics
# ---------------------------------------------------------------------------


def step_batch(profile: AgenticProfile, seed: int, step: int) -> RolloutBatch:
    """The rollout batch of RL step ``step`` in a run of workload seed ``seed`` (every step
    a different batch; the same one for every policy and every replay)."""
    return generate_batch(profile, seed=seed * 100_003 + step)
