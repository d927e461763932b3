"""Episodes: trajectories whose turns an environment decides, as token ids.

The synthetic agent loop (``agent_loop.py``) replays turns whose lengths a workload fixed in
advance; an episode instead asks its environment, after every reply, what the model sees
next, what it earned and whether it is over. The control plane only sees token ids: the
world's ``Episode`` turns replies into text for its environment and observations back into
tokens. The result carries a ``TrainSample`` (every context token, the loss mask over the
model's own tokens, their behaviour log-probabilities, the reward) for the trainer.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pearl.control.agent_loop import AgentLoopConfig, TrajectoryResult
from pearl.control.interfaces import Clock, TrainSample, TurnRequest
from pearl.control.rollout import BatchResult
from pearl.control.router import Router

# Why an episode ended (``TrajectoryResult.stop_reason``, ``TrainSample.stop_reason``).
STOP_DONE = "done"  # the environment said so
STOP_MAX_TURNS = "max_turns"  # the per-trajectory turn budget
STOP_CONTEXT_FULL = "context_full"  # no room left under max_context_tokens for a reply
STOP_ENV_ERROR = "env_error"  # the environment raised or answered with the wrong type
STOP_ENV_TIMEOUT = "env_timeout"  # the environment did not answer in time
ENV_FAILURES = (STOP_ENV_ERROR, STOP_ENV_TIMEOUT)


class EpisodeAborted(Exception):
    """Raised by an episode whose environment failed (``reason``: one of ENV_FAILURES):
    the trajectory ends there with reward 0, and the run goes on."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Episode(Protocol):
    """One trajectory's environment, seen in tokens."""

    group: str
    """The task: GRPO normalizes rewards among a group's trajectories."""

    async def start(self) -> list[int]:
        """The first context (system prompt, task, the assistant's header)."""

    async def respond(self, reply: list[int]) -> tuple[list[int], float, bool]:
        """The environment's answer to ``reply``: (tokens appended to the context, reward,
        done). The reward of an episode is the sum over its turns."""

    @property
    def success(self) -> bool: ...

    # Optional: ``async def close(self)``, called once when the episode has ended, however it
    # ended (a sandbox to end); run_episode_batch calls it.


@runtime_checkable
class DrivenEpisode(Protocol):
    """An episode that runs its own turns through the router (an agent program that calls
    a model endpoint, ``pearl.agents``) instead of answering them one by one."""

    group: str

    async def drive(
        self,
        session_id: str,
        router: Router,
        clock: Clock,
        config: AgentLoopConfig,
        max_new_tokens: int,
        max_context_tokens: int,
        max_turns: int | None,
    ) -> TrajectoryResult:
        """Run the episode to its end; the result carries its samples."""


@dataclass(slots=True, frozen=True)
class EpisodeBatch:
    """A rollout batch of episodes: ``(session id, episode)`` pairs, G per task."""

    episodes: list[tuple[str, Episode | DrivenEpisode]]
    max_new_tokens: int  # per turn
    max_context_tokens: int  # per trajectory
    max_turns: int | None = None  # per trajectory (None: until the environment ends it)

    @property
    def num_trajectories(self) -> int:
        return len(self.episodes)


def turn_request(
    session_id: str, k: int, context: list[int], budget: int, config: AgentLoopConfig
) -> TurnRequest:
    """An episode's turn ``k``: the model answers ``context`` in up to ``budget`` tokens,
    stopping at its end of turn, seeded per request when the run is seeded (an agent's
    calls too, ``pearl.agents.episode``: their seeds and ids are a built-in episode's)."""
    request_id = f"{session_id}/t{k}"
    return TurnRequest(
        request_id=request_id,
        session_id=session_id,
        token_ids=context,
        max_new_tokens=budget,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        seed=None if config.seed is None else zlib.crc32(f"{config.seed}/{request_id}".encode()),
        ignore_eos=False,
        stop_token_ids=config.stop_token_ids,
    )


async def run_episode(
    session_id: str,
    episode: Episode,
    router: Router,
    clock: Clock,
    config: AgentLoopConfig,
    max_new_tokens: int,
    max_context_tokens: int,
    max_turns: int | None = None,
) -> TrajectoryResult:
    """Run ``episode`` until it ends, its context is full or it used ``max_turns`` turns;
    the result says which (``stop_reason``). An environment failure ends it with reward 0."""
    result = TrajectoryResult(session_id, None, started_at=clock.now())
    try:
        context = list(await episode.start())
    except EpisodeAborted as exc:
        return _aborted(result, exc, [], [], [], episode, clock)
    mask = [0] * len(context)
    logprobs = [0.0] * len(context)
    reward = 0.0
    appended = len(context)
    k = 0
    stop = STOP_DONE
    while True:
        budget = min(max_new_tokens, max_context_tokens - len(context))
        if (max_turns is not None and k >= max_turns) or budget < 1:
            stop = STOP_MAX_TURNS if max_turns is not None and k >= max_turns else STOP_CONTEXT_FULL
            break
        out = await router.run_turn(turn_request(session_id, k, context, budget, config))
        result.turns.append(out)
        result.generated.append(len(out.token_ids))
        result.appended_tokens.append(appended)
        result.kept_tokens.append(0)
        context = context + out.token_ids
        mask += [1] * len(out.token_ids)
        logprobs += list(out.logprobs)
        env_start = clock.now()
        try:
            observation, turn_reward, done = await episode.respond(out.token_ids)
        except EpisodeAborted as exc:
            result.env_s.append(clock.now() - env_start)
            await router.end_session(session_id)
            return _aborted(result, exc, context, mask, logprobs, episode, clock)
        result.env_s.append(clock.now() - env_start)
        reward += turn_reward
        k += 1
        if done:
            break
        if len(context) + len(observation) >= max_context_tokens:
            # No room for a reply after it: the observation is dropped (never trained on),
            # so a sample stays within the trajectory's token budget.
            stop = STOP_CONTEXT_FULL
            break
        context = context + observation
        mask += [0] * len(observation)
        logprobs += [0.0] * len(observation)
        appended = len(observation)
    await router.end_session(session_id)
    return _finish(result, context, mask, logprobs, reward, episode, stop, clock)


def _finish(
    result: TrajectoryResult,
    context: list[int],
    mask: list[int],
    logprobs: list[float],
    reward: float,
    episode: Episode,
    stop: str,
    clock: Clock,
    success: bool | None = None,
) -> TrajectoryResult:
    result.finished_at = clock.now()
    result.context_tokens = len(context)
    result.reward = reward
    result.stop_reason = stop
    # An episode whose environment declares tools counts its calls (TextEpisode does).
    result.tool_calls = getattr(episode, "tool_calls", 0)
    result.malformed_calls = getattr(episode, "malformed_calls", 0)
    success = episode.success if success is None else success
    result.sample = TrainSample(
        tuple(context), tuple(mask), tuple(logprobs), reward, episode.group, success, stop
    )
    return result


def _aborted(
    result: TrajectoryResult,
    exc: EpisodeAborted,
    context: list[int],
    mask: list[int],
    logprobs: list[float],
    episode: Episode,
    clock: Clock,
) -> TrajectoryResult:
    result.error = str(exc)
    return _finish(result, context, mask, logprobs, 0.0, episode, exc.reason, clock, False)


async def run_episode_batch(
    batch: EpisodeBatch,
    router: Router,
    clock: Clock,
    config: AgentLoopConfig,
    on_trajectory: Callable[[TrajectoryResult], None] | None = None,
) -> BatchResult:
    """All of the batch's episodes at once; returns when the last one ends."""
    start = clock.now()
    limits = (batch.max_new_tokens, batch.max_context_tokens, batch.max_turns)

    async def one(session_id: str, episode: Episode | DrivenEpisode) -> TrajectoryResult:
        try:
            if isinstance(episode, DrivenEpisode):
                result = await episode.drive(session_id, router, clock, config, *limits)
            else:
                result = await run_episode(session_id, episode, router, clock, config, *limits)
        finally:
            # An episode with an ``async close()`` (a sandbox to end) is closed however it ended.
            close = getattr(episode, "close", None)
            if close is not None:
                await close()
        if on_trajectory is not None:
            on_trajectory(result)
        return result

    results = await asyncio.gather(*(one(sid, ep) for sid, ep in batch.episodes))
    return BatchResult(list(results), start, clock.now())
