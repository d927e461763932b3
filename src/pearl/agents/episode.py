"""One trajectory of an agent program: its calls to the endpoint are the turns.

The agent is a function ``agent(seed, client, **kwargs)`` that talks to the model
through an OpenAI-compatible ``client`` (``ClientConfig``: base URL, key and model name)
and returns its reward: a number (success: reward >= ``success_reward``) or a mapping
``{"reward": r, "success": bool}``. An agent in a process of its own (started by the
function) may instead post that mapping to ``<base_url>/reward``; the function then
returns ``None`` once the process is done. Each call is a turn through the control plane's router
(session affinity, PD, KV moves, preemption: an aborted turn resumes and the agent sees one
answer); the calls form the trajectory's segments (``pearl.agents.conversation``). An
``async def`` agent runs on the run's event loop, a plain ``def`` in a thread of its own
(``pearl.agents.agent_call``); the episode's limits hold for both.

The agent is someone else's code, so the episode ends, without ending the run, when it
raises or returns something else (``env_error``, reward 0, not trained on), runs past
``timeout_s`` (``env_timeout``), makes no call at all (``env_error``), uses up the turn
budget (``max_turns``, ``DEFAULT_MAX_TURNS`` when the run sets none) or overflows the
context (``context_full``): the call gets an OpenAI-style error, the agent has
``END_GRACE_S`` to return before it is cancelled, and what it did so far is trained on with
reward 0, as for an environment that runs out of turns. Once the episode has ended, every
call to its URL is refused (404), whenever it was sent: nothing joins a finished trajectory.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pearl.agents.agent_call import start_agent
from pearl.agents.conversation import Conversation, OpenTurn
from pearl.agents.loop_watch import agent_name
from pearl.agents.messages import ApiError, ChatRequest
from pearl.agents.replies import Reply, make_reply
from pearl.control.agent_loop import AgentLoopConfig, TrajectoryResult
from pearl.control.episode import (
    ENV_FAILURES,
    STOP_CONTEXT_FULL,
    STOP_DONE,
    STOP_ENV_ERROR,
    STOP_ENV_TIMEOUT,
    STOP_MAX_TURNS,
    turn_request,
)
from pearl.control.interfaces import Clock, TrainSample, TurnOutput
from pearl.control.router import Router
from pearl.models.chat import ChatFormat


@dataclass(slots=True, frozen=True)
class ClientConfig:
    """What an agent needs to reach the model: ``openai.AsyncOpenAI(base_url=...,
    api_key=...)`` and ``model`` in each call."""

    base_url: str
    api_key: str
    model: str


AgentFn = Callable[..., Awaitable[Any] | Any]
END_GRACE_S = 2.0  # how long an agent whose episode a budget ended may take to return
# Calls per episode when the run sets no rollout.max_turns. A built-in environment ends its
# own episodes; an agent is user code that may loop (a retry on every error starts a new
# segment, so the context never fills), bounded only by its timeout, meanwhile decoding.
# 100 is far past what one conversation holds at the default context (768 tokens, replies
# of up to 64: about 12 calls) and leaves room for retries and branches.
DEFAULT_MAX_TURNS = 100
# A request whose messages' text is larger than this is tokenized off the event loop.
RENDER_OFF_LOOP_BYTES = 64 << 10
# Text of n bytes is at least n / max_token_bytes tokens; halved again, for normalizers
# that shorten text before tokenizing (NFC composing a character, say).
TOKEN_BOUND_SAFETY = 2


def episode_not_found() -> ApiError:
    """What a call to an ended (or never opened) episode's URL gets."""
    return ApiError(
        404,
        "no open episode has this base URL (it ended, or the URL is wrong)",
        code="episode_not_found",
    )


class Endpoint(Protocol):
    """What an episode needs of the HTTP endpoint (``pearl.agents.endpoint``)."""

    def open(self, episode: AgentEpisode) -> ClientConfig:
        """Start routing calls to ``episode``; the configuration its agent gets."""

    def close(self, episode: AgentEpisode) -> None:
        """Refuse the episode's calls from now on."""


@dataclass(slots=True)
class _Run:
    """An episode's state while it runs."""

    session_id: str
    router: Router
    clock: Clock
    config: AgentLoopConfig
    max_new_tokens: int
    max_context_tokens: int
    max_turns: int
    result: TrajectoryResult
    last_answer: float
    calls: int = 0  # calls taken so far, those in flight included
    # The last answered call's prompt and reply ids: what the next call's prompt is measured
    # against for the trajectory's shape (rollouts.jsonl), whichever segment it belongs to.
    last_prompt: list[int] = field(default_factory=list)
    last_context: list[int] = field(default_factory=list)


class AgentEpisode:
    """The agent on task ``seed``; ``group`` names the task (GRPO groups)."""

    def __init__(
        self,
        agent: AgentFn,
        seed: int,
        group: str,
        chat: ChatFormat,
        endpoint: Endpoint,
        timeout_s: float | None = None,
        kwargs: Mapping[str, Any] | None = None,
        success_reward: float = 1.0,
        log: Callable[[dict], None] | None = None,
    ) -> None:
        self.agent, self.seed, self.group, self.chat = agent, seed, group, chat
        self.endpoint, self.timeout_s, self.kwargs = endpoint, timeout_s, dict(kwargs or {})
        self.success_reward, self.log = success_reward, log
        self.conversation = Conversation(chat)
        self.success = False
        self.tool_calls = 0
        self.malformed_calls = 0
        self._run: _Run | None = None
        self._ended: asyncio.Event | None = None
        self._open = False  # calls are taken: from the agent's start until the episode ends
        self._stop: str | None = None  # set when the endpoint ends the episode
        self._inflight: set[asyncio.Task] = set()
        self.posted: dict | None = None  # a reward reported to ``<base_url>/reward``

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
        result = TrajectoryResult(session_id, None, started_at=clock.now())
        self._run = _Run(
            session_id,
            router,
            clock,
            config,
            max_new_tokens,
            max_context_tokens,
            DEFAULT_MAX_TURNS if max_turns is None else max_turns,
            result,
            clock.now(),
        )
        self._ended = asyncio.Event()
        ended = asyncio.ensure_future(self._ended.wait())
        client = self.endpoint.open(self)
        self._open = True
        task = start_agent(
            self.agent, (self.seed, client), self.kwargs, f"pearl-agent-{session_id}"
        )
        try:
            await asyncio.wait({task, ended}, timeout=self.timeout_s, return_when="FIRST_COMPLETED")
            if self._stop is not None:  # ended by a budget: the agent gets its error first
                await asyncio.wait({task}, timeout=END_GRACE_S)
        finally:
            # Before any await: a call already past the endpoint's lookup (reading its body)
            # is refused by ``complete``, and those in flight are all in ``_inflight`` now.
            self._open = False
            ended.cancel()
            self.endpoint.close(self)  # later calls are refused
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await self._settle_inflight()
        try:
            reward, stop, error = self._outcome(task)
        except Exception as exc:  # a careless result (a Mapping or __str__ that raises)
            reward, stop = 0.0, STOP_ENV_ERROR
            error = f"{self._who()} returned a result that could not be read ({type(exc).__name__})"
        for segment in self.conversation.segments:
            await router.end_session(self._session(segment.index))
        return self._finish(result, reward, stop, error)

    async def _settle_inflight(self) -> None:
        """Let calls still in flight finish (their turns join the trajectory) for up to
        ``END_GRACE_S``, then cancel them: one waiting for workers that are gone must not
        hold the episode past its timeout."""
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=END_GRACE_S)
        for call in list(self._inflight):
            call.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)

    def _outcome(self, task: asyncio.Future) -> tuple[float, str, str | None]:
        """(reward, stop reason, error) of the finished agent ``task``."""
        who = self._who()
        if self._stop is not None:
            return 0.0, self._stop, None
        if not task.done() or task.cancelled():
            timeout = "no" if self.timeout_s is None else f"{self.timeout_s:g} s"
            return 0.0, STOP_ENV_TIMEOUT, f"{who} took more than {timeout}"
        if task.exception() is not None:
            exc = task.exception()
            return 0.0, STOP_ENV_ERROR, f"{who} raised {type(exc).__name__}: {exc}"
        if not self.conversation.used:
            return 0.0, STOP_ENV_ERROR, f"{who} returned without calling the model"
        value = task.result()
        if value is None and self.posted is not None:  # reported by a process of its own
            value = self.posted
        reward, success = _reward(value, self.success_reward)
        if reward is None:
            return (
                0.0,
                STOP_ENV_ERROR,
                (
                    f"{who} returned {type(value).__name__}; expected a finite number or "
                    '{"reward": number, "success": bool}'
                ),
            )
        self.success = success
        return reward, STOP_DONE, None

    def _finish(
        self, result: TrajectoryResult, reward: float, stop: str, error: str | None
    ) -> TrajectoryResult:
        assert self._run is not None
        result.finished_at = self._run.clock.now()
        result.reward = reward
        result.stop_reason = stop
        result.error = error
        result.tool_calls, result.malformed_calls = self.tool_calls, self.malformed_calls
        samples = [
            TrainSample(
                tuple(s.token_ids),
                tuple(s.loss_mask),
                tuple(s.logprobs),
                reward,
                self.group,
                self.success,
                stop,
            )
            for s in self.conversation.used
        ]
        if not samples:  # nothing answered: an empty sample, never trained on, says why
            if stop not in ENV_FAILURES:
                error = error or f"{self._who()} ended ({stop}) before any answer"
                stop = result.stop_reason = STOP_ENV_ERROR
                result.error = error
            samples = [TrainSample((), (), (), 0.0, self.group, False, stop)]
        if result.turns:  # the agent's time after its last answer
            result.env_s.append(result.finished_at - self._run.last_answer)
        result.sample, result.extra_samples = samples[0], samples[1:]
        result.context_tokens = max(len(s.token_ids) for s in samples)  # the longest segment
        if result.error is not None and self.log is not None:
            event = {"kind": result.stop_reason, "group": self.group, "seed": self.seed}
            self.log({**event, "error": result.error})
        return result

    # -- the endpoint's side ----------------------------------------------------------
    @property
    def takes_calls(self) -> bool:
        """Whether the episode is running and no budget has ended it."""
        return self._open and self._ended is not None and not self._ended.is_set()

    async def complete(self, request: ChatRequest) -> tuple[Reply, list[int]]:
        """Answer one call: (the reply, the prompt's ids); ``ApiError`` if refused."""
        run = self._run
        if run is None or not self.takes_calls:
            raise episode_not_found()
        task = asyncio.current_task()
        assert task is not None
        self._inflight.add(task)
        try:
            return await self._complete(run, request)
        finally:
            self._inflight.discard(task)

    async def _complete(self, run: _Run, request: ChatRequest) -> tuple[Reply, list[int]]:
        turn, tools = await self._admit(run, request)
        room = run.max_context_tokens - len(turn.prompt)
        if room < 1:
            self.conversation.cancel(turn)
            self._end(STOP_CONTEXT_FULL)
            raise _context_exceeded(str(len(turn.prompt)), run.max_context_tokens)
        budget = min(run.max_new_tokens, room, request.token_limit or run.max_new_tokens)
        env_s = run.clock.now() - run.last_answer
        try:
            out = await run.router.run_turn(
                turn_request(
                    self._session(turn.segment.index),
                    turn.segment.calls,
                    turn.prompt,
                    budget,
                    run.config,
                )
            )
        except BaseException:
            self.conversation.cancel(turn)
            raise
        truncated = out.finish_reason == "length"
        reply = make_reply(self.chat, out.token_ids, out.logprobs, truncated, request.stops, tools)
        self.tool_calls += len(reply.message.tool_calls or ())
        self.malformed_calls += reply.malformed_calls
        self.conversation.close(turn, reply.token_ids, reply.logprobs, reply.message)
        self._record(run, turn.prompt, out, reply, env_s)
        return reply, turn.prompt

    async def _admit(
        self, run: _Run, request: ChatRequest
    ) -> tuple[OpenTurn, list[dict[str, Any]] | None]:
        """Count the call against the turn budget and render its prompt: (the turn, the tools
        offered); ``ApiError`` (the episode ended) when the budget is used or it cannot fit."""
        # Counted as calls start, not as turns end: concurrent calls must not pass the budget.
        run.calls += 1
        if run.calls > run.max_turns:
            self._end(STOP_MAX_TURNS)
            raise ApiError(
                400, f"the episode's turn budget of {run.max_turns} calls is used", code="max_turns"
            )
        tools = request.offered_tools
        least = math.ceil(
            request.text_bytes / (self.chat.tokenizer.max_token_bytes * TOKEN_BOUND_SAFETY)
        )
        if least >= run.max_context_tokens:  # cannot fit: refused without tokenizing it
            self._end(STOP_CONTEXT_FULL)
            raise _context_exceeded(f"at least {least}", run.max_context_tokens)
        new = self.conversation.start(request.messages, tools)
        try:
            if request.size_bytes > RENDER_OFF_LOOP_BYTES:  # long: other episodes go on meanwhile
                turn = await asyncio.to_thread(self.conversation.render, new)
            else:
                turn = self.conversation.render(new)
        except BaseException:
            self.conversation.cancel(new)
            raise
        if not self.takes_calls:  # it ended while the prompt was tokenized
            self.conversation.cancel(turn)
            raise episode_not_found()
        return turn, tools

    @staticmethod
    def _record(run: _Run, prompt: list[int], out: TurnOutput, reply: Reply, env_s: float) -> None:
        """Add an answered call to the episode's result and remember its context."""
        result = run.result
        if result.turns:
            result.env_s.append(env_s)
        result.turns.append(out)
        result.generated.append(len(out.token_ids))
        appended, kept = _shape(run.last_prompt, run.last_context, prompt)
        result.appended_tokens.append(appended)
        result.kept_tokens.append(kept)
        run.last_prompt, run.last_context = prompt, prompt + list(reply.token_ids)
        run.last_answer = run.clock.now()

    def _end(self, stop: str) -> None:
        """End the episode now (the agent is cancelled): ``stop`` says why."""
        if self._stop is None:
            self._stop = stop
        assert self._ended is not None
        self._ended.set()

    def _who(self) -> str:
        return f"agent {agent_name(self.agent)} on task seed {self.seed}"

    def _session(self, segment: int) -> str:
        """The engine session of a segment: the episode's own for the first, so its turns
        are the requests (ids, hence sampling seeds) a built-in environment's would be."""
        assert self._run is not None
        return self._run.session_id if segment == 0 else f"{self._run.session_id}/s{segment}"


def _context_exceeded(tokens: str, context: int) -> ApiError:
    return ApiError(
        400,
        f"the prompt is {tokens} tokens; this model's context for a trajectory is "
        f"{context} tokens, a reply included",
        param="messages",
        code="context_length_exceeded",
    )


def _reward(value: Any, success_reward: float) -> tuple[float | None, bool]:
    if isinstance(value, Mapping):
        reward = finite_number(value.get("reward"))
        return reward, bool(value.get("success", reward is not None and reward >= success_reward))
    reward = finite_number(value)
    return reward, reward is not None and reward >= success_reward


def finite_number(value: Any) -> float | None:
    """``value`` as a float if it is a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        value = float(value)
    except OverflowError:  # an int past the float range (10**400)
        return None
    return value if math.isfinite(value) else None


def _shape(last_prompt: list[int], last_context: list[int], prompt: list[int]) -> tuple[int, int]:
    """A call as one session's growth, the shape the simulator replays: (``appended`` new
    tokens, ``kept`` tokens of the previous reply before them). A call that extends the
    previous one keeps its reply and appends the rest. Any other call appends what follows
    the longest prefix it shares with the previous prompt and reply, which is what a prefix
    cache spares it: an agent that resends its last prompt without the reply (mini-swe-agent
    after a reply it cannot parse) appends only its complaint. The replay cannot take tokens
    back, so its context then stays longer than the call's by the previous prompt's
    unshared tail (a chat template's few-token generation header, for that agent). At
    least one token is appended: an engine computes the last prompt token, cached or not."""
    if not last_prompt:
        return len(prompt), 0
    common = min(len(os.path.commonprefix([last_context, prompt])), len(prompt) - 1)
    return len(prompt) - common, max(0, common - len(last_prompt))
