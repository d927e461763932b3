"""Run one rollout batch: every trajectory's agent loop, concurrently, through one router."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from pearl.control.agent_loop import AgentLoopConfig, TrajectoryResult, run_trajectory
from pearl.control.interfaces import Clock
from pearl.control.router import Router
from pearl.workloads.batch import RolloutBatch


@dataclass(slots=True)
class BatchResult:
    """A finished rollout batch: its trajectories and when it started and ended."""

    trajectories: list[TrajectoryResult]
    started_at: float
    finished_at: float
    # When each scripted reconfiguration had taken effect (``run_scripted_batch``; on the
    # clock the batch ran on): a turn its worker received later ran on the new topology.
    reconfigured_at: list[float] = field(default_factory=list)

    @property
    def makespan_s(self) -> float:
        return self.finished_at - self.started_at

    @property
    def generated_tokens(self) -> int:
        return sum(t.generated_tokens for t in self.trajectories)

    @property
    def num_turns(self) -> int:
        return sum(len(t.turns) for t in self.trajectories)

    def prefill_tokens(self) -> tuple[int, int]:
        """(computed, served from cached KV) prompt tokens over the batch's turns."""
        computed = cached = 0
        for t in self.trajectories:
            for o in t.turns:
                computed += o.telemetry.prefill_tokens_computed
                cached += o.telemetry.prefill_tokens_cached
        return computed, cached

    def turn_latencies(self) -> list[float]:
        return [
            o.telemetry.finished_at - o.telemetry.submitted_at
            for t in self.trajectories
            for o in t.turns
        ]


async def run_rollout_batch(
    batch: RolloutBatch,
    router: Router,
    clock: Clock,
    config: AgentLoopConfig,
    on_trajectory: Callable[[TrajectoryResult], None] | None = None,
) -> BatchResult:
    """Start all of the batch's trajectories at once; return when the last one finishes.
    ``on_trajectory`` is called as each trajectory finishes."""
    start = clock.now()

    async def one(trajectory) -> TrajectoryResult:
        result = await run_trajectory(trajectory, router, clock, config)
        if on_trajectory is not None:
            on_trajectory(result)
        return result

    results = await asyncio.gather(*(one(t) for t in batch.trajectories))
    return BatchResult(list(results), start, clock.now())
