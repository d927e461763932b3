"""Episodes in the control plane: why each one ended (the environment, the turn budget, the
context budget, an environment failure) and what a failed one leaves for the trainer."""

import pytest
from flat_cost import FlatCost

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.episode import EpisodeAborted, EpisodeBatch, run_episode_batch
from pearl.control.interfaces import AsyncioClock
from pearl.control.router import Router
from pearl.sim.clock import run_virtual
from pearl.sim.worker import SimEngineConfig, SimulatedWorker


class Scripted:
    """An episode that rewards every turn with 1, ends after ``turns`` turns, and fails
    (``EpisodeAborted``) at start or at turn ``fail_at``."""

    def __init__(self, group, turns=3, fail_at=None, observation=10):
        self.group, self.turns, self.fail_at, self.observation = group, turns, fail_at, observation
        self.k = 0

    async def start(self):
        if self.fail_at == 0:
            raise EpisodeAborted("env_error", "reset raised")
        return list(range(1, 21))

    async def respond(self, reply):
        self.k += 1
        if self.fail_at == self.k:
            raise EpisodeAborted("env_timeout", f"step {self.k} hung")
        return [7] * self.observation, 1.0, self.k >= self.turns

    @property
    def success(self):
        return self.k >= self.turns


def run(episodes, max_new_tokens=4, max_context_tokens=1000, max_turns=None):
    async def main():
        worker = SimulatedWorker(
            "w0", FlatCost(), SimEngineConfig(num_kv_blocks=256), vocab_size=100
        )
        router = Router()
        router.set_topology(colocated=[worker])
        batch = EpisodeBatch(
            [(f"s{i}", e) for i, e in enumerate(episodes)],
            max_new_tokens,
            max_context_tokens,
            max_turns,
        )
        cfg = AgentLoopConfig(vocab_size=100, seed=0)
        result = await run_episode_batch(batch, router, AsyncioClock(), cfg)
        worker.close()
        return result.trajectories

    return run_virtual(main)[0]


def test_each_episode_says_why_it_ended():
    done, capped, full = run([Scripted("a", turns=2), Scripted("b", turns=9)], max_turns=3) + run(
        [Scripted("c", turns=99, observation=200)], max_context_tokens=500
    )
    assert (done.stop_reason, len(done.turns), done.reward) == ("done", 2, 2.0)
    assert (capped.stop_reason, len(capped.turns), capped.reward) == ("max_turns", 3, 3.0)
    assert full.stop_reason == "context_full" and full.sample.stop_reason == "context_full"
    # The observation that left no room for a reply is dropped: the sample ends with the
    # model's last reply and stays within the budget.
    assert len(full.sample.token_ids) <= 500 and full.sample.loss_mask[-1] == 1
    assert all(t.error is None for t in (done, capped, full))


def test_a_failed_environment_ends_its_episode_with_reward_0_and_the_batch_goes_on():
    ok, hung, dead = run([Scripted("a"), Scripted("a", fail_at=2), Scripted("a", fail_at=0)])
    assert ok.stop_reason == "done" and ok.reward == 3.0
    # Failed at its second step: its two turns' tokens are kept, the reward is 0.
    assert (hung.stop_reason, hung.reward, len(hung.turns)) == ("env_timeout", 0.0, 2)
    assert hung.error == "step 2 hung" and hung.sample.reward == 0.0
    assert not hung.sample.success and sum(hung.sample.loss_mask) == sum(
        len(t.token_ids) for t in hung.turns
    )
    # Failed at reset: no turn ran, the sample is empty.
    assert (dead.stop_reason, dead.turns, dead.sample.token_ids) == ("env_error", [], ())


@pytest.mark.parametrize("max_turns", [0, -1])
def test_turn_budget_below_one_runs_no_turn(max_turns):
    (t,) = run([Scripted("a")], max_turns=max_turns)
    assert t.stop_reason == "max_turns" and t.turns == []


def test_an_episodes_tool_calls_are_counted_in_its_trajectory_and_the_steps_row():
    from types import SimpleNamespace

    from pearl.apps.train.metrics import step_row

    caller = Scripted("a")
    caller.tool_calls, caller.malformed_calls = 3, 1  # as TextEpisode counts them
    with_tools, plain = run([caller, Scripted("a")])
    assert (with_tools.tool_calls, with_tools.malformed_calls) == (3, 1)
    assert (plain.tool_calls, plain.malformed_calls) == (0, 0)  # an episode without tools
    rec = SimpleNamespace(
        train_stats={},
        result=SimpleNamespace(trajectories=[with_tools, plain]),
        rollout_started=0.0,
        rollout_finished=1.0,
        train_started=1.0,
        train_finished=2.0,
        rollout_tokens=10,
        step=0,
        tokens_by_version={(0, 0): 10},
        sampling=None,
    )
    row = step_row(rec, version=1, offset=0, elapsed=2.0)
    assert (row["tool_calls"], row["malformed_tool_calls"]) == (3, 1)


def test_staleness_counts_the_kv_behind_each_token():
    from pearl.apps.train.metrics import staleness

    # Trained by v2: 10 tokens of v1 on v1's KV, 5 of v2 sampled on v1's KV, 5 all v2.
    got = staleness({(1, 1): 10, (2, 1): 5, (2, 2): 5}, trained=2)
    assert got == {"staleness": 1, "staleness_mean": 0.75, "tokens_on_older_kv": 5}
    # Tagged by its sampling weights only, the (2, 1) tokens would look fresh.
    assert staleness({(2, 1): 5}, trained=2)["staleness"] == 1
    assert staleness({}, trained=2)["staleness"] == 0


def test_every_turn_of_every_sibling_and_step_gets_its_own_seed():
    """Siblings of a group share a prompt: with one seed they would sample the same replies
    (a group with nothing to compare). Seeds differ per sibling, turn and step (the train
    run's session ids: split, task index continuing across steps, sibling)."""
    seeds = {}

    class Recording(Router):
        async def run_turn(self, turn):
            seeds[turn.request_id] = turn.seed
            return await super().run_turn(turn)

    async def main():
        worker = SimulatedWorker(
            "w0", FlatCost(), SimEngineConfig(num_kv_blocks=512), vocab_size=100
        )
        router = Recording()
        router.set_topology(colocated=[worker])
        for step in range(2):
            episodes = [
                (f"train{step * 2 + t}/{g}", Scripted("x")) for t in range(2) for g in range(4)
            ]
            batch = EpisodeBatch(episodes, 4, 1000)
            await run_episode_batch(batch, router, AsyncioClock(), AgentLoopConfig(100, seed=7))
        worker.close()

    run_virtual(main)
    assert len(seeds) == 2 * 2 * 4 * 3  # steps x tasks x siblings x turns
    assert len(set(seeds.values())) == len(seeds) and None not in seeds.values()


class Closing(Scripted):
    """A Scripted episode that counts its ``close()`` calls (a sandbox to end)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.closed = 0

    async def close(self):
        self.closed += 1


def test_an_episode_is_closed_once_however_it_ends():
    episodes = [
        Closing("a", turns=2),  # its environment ends it
        Closing("b", turns=9),  # the turn budget
        Closing("c", fail_at=2),  # its environment fails
        Closing("d", fail_at=0),  # fails at start
    ]
    out = run(episodes, max_turns=3)
    assert [t.stop_reason for t in out] == ["done", "max_turns", "env_timeout", "env_error"]
    assert [e.closed for e in episodes] == [1, 1, 1, 1]
    (full,) = run([episode := Closing("e", turns=99, observation=200)], max_context_tokens=500)
    assert full.stop_reason == "context_full" and episode.closed == 1
