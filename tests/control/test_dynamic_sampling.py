"""Dynamic sampling in the pipeline: a step trains on groups whose rewards differ, rolled
out in extra rounds of fresh tasks until it has as many as its batch's groups."""

import pytest
from flat_cost import FlatCost

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.dynamic_sampling import informative_groups, next_round_tasks
from pearl.control.episode import (
    STOP_ENV_ERROR,
    EpisodeAborted,
    EpisodeBatch,
    run_episode_batch,
)
from pearl.control.interfaces import AsyncioClock, TrainMetrics
from pearl.control.pipeline import PipelineConfig, PipelineScheduler, WeightSync
from pearl.control.router import Router
from pearl.sim.clock import run_virtual
from pearl.sim.worker import SimEngineConfig, SimulatedWorker

GROUP = 4


class Task:
    """One turn; task ``t``'s member ``k`` gets reward ``k % 2`` if ``informative(t)``, else
    1 for all (a group that ties)."""

    def __init__(self, group, reward):
        self.group, self.reward = group, reward

    async def start(self):
        return list(range(1, 11))

    async def respond(self, reply):
        return [], self.reward, True

    @property
    def success(self):
        return self.reward == 1.0


class FailingTask(Task):
    """A member whose environment fails at its first answer."""

    def __init__(self, group):
        super().__init__(group, 1.0)

    async def respond(self, reply):
        raise EpisodeAborted(STOP_ENV_ERROR, "the environment raised")


def batch(name, tasks, informative):
    episodes = [
        (f"{name}{t}/{k}", Task(f"{name}{t}", float(k % 2) if informative(t) else 1.0))
        for t in tasks
        for k in range(GROUP)
    ]
    return EpisodeBatch(episodes, 4, 1000)


class Recorder:
    """A trainer that records what it was given."""

    def __init__(self, fail_at=None):
        self.weight_version = 0
        self.batches = []
        self.fail_at = fail_at

    async def train_step(self, b):
        if b.step == self.fail_at:
            raise RuntimeError(f"the trainer failed at step {b.step}")
        self.batches.append(b)
        self.weight_version += 1
        return TrainMetrics(b.step, self.weight_version, 0.0, 0.0, b.tokens)


def run(steps, tasks_per_step, informative, max_extra_rounds=4, fail_at=None):
    asked = []

    def more(i, r, n):
        asked.append((i, r, n))
        first = 1000 * (i + 1) + 100 * r
        return batch(f"x{i}.{r}.", range(first, first + n), informative)

    async def main():
        worker = SimulatedWorker(
            "w0", FlatCost(), SimEngineConfig(num_kv_blocks=512), vocab_size=50
        )
        router = Router()
        router.set_topology(colocated=[worker])
        trainer = Recorder(fail_at)
        pipeline = PipelineScheduler(
            lambda i: batch(
                f"s{i}.", range(i * tasks_per_step, (i + 1) * tasks_per_step), informative
            ),
            router,
            trainer,
            WeightSync(lambda: [worker], lambda n: 0.0),
            AsyncioClock(),
            AgentLoopConfig(vocab_size=50),
            PipelineConfig(steps, dynamic_sampling=True, max_extra_rounds=max_extra_rounds),
            more_tasks=more,
        )
        try:
            records = await pipeline.run()
        finally:
            worker.close()
        return records, trainer.batches

    records, batches = run_virtual(main)[0]
    return records, batches, asked


def test_a_step_rolls_out_more_tasks_until_it_has_its_groups_informative():
    # tasks whose index is divisible by 3 tie: step 0 (tasks 0-5) has 4 informative of 6
    records, batches, asked = run(3, 6, lambda t: t % 3 != 0)
    for rec, b in zip(records, batches, strict=True):
        groups = {s.group for s in b.samples}
        assert len(groups) == 6 and b.trajectories == 6 * GROUP  # exactly the batch's count
        assert all(len({s.reward for s in b.samples if s.group == g}) == 2 for g in groups)
        row = rec.sampling.row()
        assert row["groups_trained"] == 6 and row["groups_tied"] >= 2
        assert row["groups_rolled_out"] == 6 + sum(n for i, _, n in asked if i == rec.step)
        assert len(rec.result.trajectories) == GROUP * row["groups_rolled_out"]
    # step 0 lacked 2 of 6 with 4/6 informative: 3 tasks asked (2 / (4/6)), from fresh seeds
    assert asked[0] == (0, 0, 3)


def test_rounds_are_bounded_and_a_step_of_tied_groups_still_trains():
    records, batches, asked = run(2, 4, lambda t: False, max_extra_rounds=2)
    assert len(asked) == 4 and all(n == 4 for _, _, n in asked)  # 4 missing, none seen: cap
    for rec, b in zip(records, batches, strict=True):
        assert rec.sampling.row() == {
            "groups_rolled_out": 12,
            "groups_tied": 12,
            "groups_trained": 0,
            "extra_rounds": 2,
        }
        assert b.trajectories == 12 * GROUP  # nothing informative: the whole (inert) batch


def test_without_a_source_of_more_tasks_dynamic_sampling_is_refused():
    with pytest.raises(ValueError, match="more_tasks"):
        PipelineScheduler(
            lambda i: None,
            Router(),
            None,
            None,
            None,
            None,
            PipelineConfig(1, dynamic_sampling=True),
        )


def test_informative_groups_ignore_environment_failures_and_round_sizes_follow_the_rate():
    async def main():
        worker = SimulatedWorker(
            "w0", FlatCost(), SimEngineConfig(num_kv_blocks=256), vocab_size=50
        )
        router = Router()
        router.set_topology(colocated=[worker])
        b = batch("g", range(3), lambda t: t != 1)
        # Group g1 ties (reward 1 each) but its first member's environment fails: reward 0,
        # which would make the group look informative if failures counted.
        episodes = [(sid, FailingTask("g1") if sid == "g1/0" else e) for sid, e in b.episodes]
        b = EpisodeBatch(episodes, 4, 1000)
        out = await run_episode_batch(b, router, AsyncioClock(), AgentLoopConfig(vocab_size=50))
        worker.close()
        return out.trajectories

    trajectories = run_virtual(main)[0]
    failed = [s for t in trajectories for s in t.samples if s.stop_reason == STOP_ENV_ERROR]
    assert [(s.group, s.reward) for s in failed] == [("g1", 0.0)]  # the failure happened
    assert informative_groups(trajectories) == ["g0", "g2"]
    assert next_round_tasks(2, 4, 6, 6) == 3
    assert next_round_tasks(1, 1, 8, 8) == 8  # capped
    assert next_round_tasks(3, 0, 6, 6) == 6  # none informative yet: a quarter assumed, capped
    assert next_round_tasks(5, 9, 10, 3) == 5  # never fewer than missing


def test_a_failed_step_ends_the_run_while_an_extra_round_is_in_flight():
    """The trainer raises while the next step's rollout (with its extra rounds) runs: the
    error ends the run at once. (The rollout used to go on after the error, and with its
    worker closed by the caller the router resumed its turns on it forever.)"""
    with pytest.raises(RuntimeError, match="the trainer failed at step 1"):
        run(3, 6, lambda t: t % 3 != 0, fail_at=1)
