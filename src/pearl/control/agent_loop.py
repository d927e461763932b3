"""The multi-turn agent loop: one trajectory's turns through the router.

Each turn appends the environment's observation to the context, asks the router
for a response of the workload's length, keeps the response tokens the workload
keeps, and waits the environment's latency. The same loop runs live (wall clock,
real workers) and simulated (virtual clock, simulated workers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pearl.control.interfaces import Clock, TrainSample, TurnOutput, TurnRequest
from pearl.control.router import Router
from pearl.token_runs import TokenRuns
from pearl.workloads.batch import Trajectory
from pearl.workloads.token_ids import observation_token_ids


@dataclass(slots=True)
class TrajectoryResult:
    """What one trajectory produced: its turns' outputs, timing and tokens."""

    session_id: str
    trajectory: Trajectory | None  # None for an episode (its environment decides the turns)
    started_at: float
    finished_at: float = 0.0
    turns: list[TurnOutput] = field(default_factory=list)
    context_tokens: int = 0
    # What the loop itself observed per turn (for the runtime tracker): tokens appended to
    # the context before the turn (observation), tokens of the previous response kept in it,
    # tokens it generated (kept here: with ``AgentLoopConfig.keep_tokens`` False a turn's
    # ids are dropped), and environment seconds after the turn (the last one includes
    # reward evaluation).
    appended_tokens: list[int] = field(default_factory=list)
    kept_tokens: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    env_s: list[float] = field(default_factory=list)
    setup_s: float = 0.0  # environment start before turn 0 (container, VM)
    reward: float | None = None  # episodes: the environment's reward
    sample: TrainSample | None = None  # episodes: what the trainer trains on
    extra_samples: list[TrainSample] = field(default_factory=list)
    """Episodes whose agent branched: the samples of its later conversation segments."""
    stop_reason: str | None = None  # episodes: why it ended (pearl.control.episode.STOP_*)
    error: str | None = None  # episodes: the environment's failure, when it failed
    tool_calls: int = 0  # episodes with tools: calls run, and calls refused as malformed
    malformed_calls: int = 0

    @property
    def generated_tokens(self) -> int:
        return sum(self.generated)

    @property
    def samples(self) -> list[TrainSample]:
        """Everything the trainer trains on from this trajectory."""
        return ([self.sample] if self.sample is not None else []) + self.extra_samples

    def tokens_by_version(self) -> dict[tuple[int, int], int]:
        """Generated tokens by ``(weights, kv)`` versions (``TurnOutput.tokens_by_version``)."""
        out: dict[tuple[int, int], int] = {}
        for turn, n in zip(self.turns, self.generated, strict=True):
            for key, count in turn.tokens_by_version(n).items():
                out[key] = out.get(key, 0) + count
        return out


@dataclass(slots=True, frozen=True)
class AgentLoopConfig:
    """Sampling and token ids for the loop."""

    vocab_size: int
    token_seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    """Episodes: a turn ends when the model samples one of these (the chat format's end of
    turn and the model's end-of-sequence ids)."""
    # False: a finished turn is kept in ``TrajectoryResult.turns`` without its token ids and
    # log-probabilities (the simulator, where nothing trains on them: a batch in flight
    # would otherwise hold every response it generated, ~16 bytes a token).
    keep_tokens: bool = True
    # True: contexts are ``TokenRuns`` (runs over the workload's id walks, not per-token
    # lists): the simulator, whose engine works on runs; a live engine needs lists.
    token_runs: bool = False


def session_id_of(trajectory: Trajectory) -> str:
    return f"{trajectory.task_id}/{trajectory.index_in_group}"


def _collapse_window(trajectory: Trajectory, k: int, context: list[int], starts: list[int]) -> int:
    """Before turn ``k``: where the context the previous turn saw (a prefill worker holds
    it) stops being valid. Its end when the scaffold only appends; earlier when it
    collapses an observation that left the observation window (SWE-agent's
    ``last_n_observations``): that observation is cut down in ``context`` and the later
    observations' ``starts`` move with it."""
    diverge = len(context)
    old = k - trajectory.observation_window if trajectory.observation_window else 0
    if old >= 1 and trajectory.observation_shown(old, k - 1) > (
        shown := trajectory.observation_shown(old, k)
    ):
        cut = trajectory.observation_shown(old, k - 1) - shown
        diverge = starts[old] + shown
        starts[old + 1 :] = [s - cut for s in starts[old + 1 :]]
        del context[diverge : diverge + cut]
    return diverge


async def run_trajectory(
    trajectory: Trajectory,
    router: Router,
    clock: Clock,
    config: AgentLoopConfig,
    on_turn: Callable[[TrajectoryResult, TurnOutput], None] | None = None,
) -> TrajectoryResult:
    """Run every turn of ``trajectory``; return when its reward is computed."""
    sid = session_id_of(trajectory)
    result = TrajectoryResult(sid, trajectory, started_at=clock.now())
    await clock.sleep(trajectory.env_setup_s)
    result.setup_s = clock.now() - result.started_at
    # A list, or runs that act as one (TurnRequest.token_ids takes either).
    context: list[int] = TokenRuns.empty(config.vocab_size) if config.token_runs else []  # type: ignore[assignment]
    kept_response: list[int] = []  # the previous response's tokens the context keeps
    kept_before = 0
    starts: list[int] = []  # where each observation starts in the context
    for k, turn in enumerate(trajectory.turns):
        observation = observation_token_ids(
            trajectory, k, config.vocab_size, config.token_seed, as_runs=config.token_runs
        )
        diverge = _collapse_window(trajectory, k, context, starts)
        # In place: the previous turn is over and nothing reads its request's list any more
        # (an engine copies a prompt when it admits it; a remote worker receives a copy).
        context.extend(kept_response)
        starts.append(len(context))
        context += observation
        # What a prefill worker must compute: the context past the previous one (kept
        # response tail + observation when appending; more when the context was edited).
        new = len(context) - diverge
        result.appended_tokens.append(new - kept_before)
        result.kept_tokens.append(kept_before)
        out = await router.run_turn(
            TurnRequest(
                f"{sid}/t{k}",
                sid,
                context,
                turn.response_tokens,
                temperature=config.temperature,
                top_p=config.top_p,
                seed=config.seed,
            )
        )
        result.generated.append(len(out.token_ids))
        kept = turn.response_tokens_kept
        kept_response = out.token_ids[len(out.token_ids) - kept :] if kept else []
        if not config.keep_tokens:
            out = out.without_tokens()
        result.turns.append(out)
        if on_turn is not None:
            on_turn(result, out)
        kept_before = kept
        env_start = clock.now()
        await clock.sleep(turn.env_latency_s)
        result.env_s.append(clock.now() - env_start)
    result.context_tokens = len(context) + len(kept_response)
    await _end_session(result, router, clock, trajectory.reward_latency_s)
    return result


async def _end_session(
    result: TrajectoryResult, router: Router, clock: Clock, reward_latency_s: float
) -> None:
    """The trajectory's session ended and its reward computed; the reward's time counts
    as its last environment wait."""
    env_start = clock.now()
    await router.end_session(result.session_id)
    await clock.sleep(reward_latency_s)
    result.finished_at = clock.now()
    if result.env_s:
        result.env_s[-1] += result.finished_at - env_start
