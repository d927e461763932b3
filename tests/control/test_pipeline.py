"""Asynchronous GRPO pipeline with bounded staleness, in the simulated world."""

import asyncio

import pytest

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.interfaces import AsyncioClock
from pearl.control.pipeline import PipelineConfig, PipelineScheduler, WeightSync, throughput
from pearl.control.router import Router
from pearl.errors import StalenessError
from pearl.sim.clock import run_virtual
from pearl.sim.costmodel import CostModel
from pearl.sim.hardware import get_gpu
from pearl.sim.shapes import load_model_shape
from pearl.sim.trainer import SimulatedTrainer
from pearl.sim.worker import SimEngineConfig, SimulatedWorker
from pearl.workloads.agentic import generate_batch
from pearl.workloads.profiles import get_profile


class Events:
    def __init__(self, clock):
        self.clock = clock
        self.log = []

    async def on_rollout_finished(self, step, result):
        self.log.append(("rollout", step, self.clock.now()))

    async def on_training_begin(self, step):
        self.log.append(("begin", step, self.clock.now()))

    async def on_training_finished(self, step, version):
        self.log.append(("finished", step, self.clock.now(), version))


class SlowTrainer(SimulatedTrainer):
    """A simulated trainer that starts at a given version and trains ``extra_s`` longer."""

    def __init__(self, cost, start_version=0, extra_s=0.0):
        super().__init__(cost, num_gpus=4)
        self._version = start_version
        self.extra_s = extra_s

    async def train_step(self, batch):
        await asyncio.sleep(self.extra_s)
        return await SimulatedTrainer.train_step(self, batch)


def run_pipeline(steps, staleness, overlap=False, start_version=0, extra_train_s=0.0, sync=True):
    """``sync=False``: a broken weight sync that reaches no worker (they keep v0)."""
    cost = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)
    profile = get_profile("tiny")

    async def main():
        clock = AsyncioClock()
        workers = [
            SimulatedWorker(
                f"w{i}",
                cost,
                SimEngineConfig(num_kv_blocks=4096),
                vocab_size=151_936,
                weight_version=start_version,
            )
            for i in range(2)
        ]
        router = Router()
        router.set_topology(colocated=workers)
        trainer = SlowTrainer(cost, start_version, extra_train_s)
        weight_sync = WeightSync(lambda: workers if sync else [], cost.weight_sync_time)
        events = Events(clock)
        pipeline = PipelineScheduler(
            lambda i: generate_batch(profile, seed=100 + i),
            router,
            trainer,
            weight_sync,
            clock,
            AgentLoopConfig(vocab_size=151_936),
            PipelineConfig(num_steps=steps, max_staleness=staleness, overlap_batches=overlap),
            events,
        )
        try:
            records = await pipeline.run()
        finally:
            for w in workers:
                w.close()
        return records, events.log, weight_sync.syncs

    return run_virtual(main)[0]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_every_batch_completes_once_within_the_staleness_bound(staleness, overlap):
    records, log, syncs = run_pipeline(steps=4, staleness=staleness, overlap=overlap)
    assert syncs == 4
    for i, rec in enumerate(records):
        batch = generate_batch(get_profile("tiny"), seed=100 + i)
        assert len(rec.result.trajectories) == batch.num_trajectories
        assert sorted(t.session_id for t in rec.result.trajectories) == sorted(
            f"{t.task_id}/{t.index_in_group}" for t in batch.trajectories
        )
        assert rec.weight_versions[0] >= i - staleness  # no turn older than the bound
        assert rec.train_started >= rec.rollout_finished
        if i:
            assert rec.train_started >= records[i - 1].sync_finished
    # The trainer idles at the start (Training Finished of step -1); then Training Begin
    # precedes Training Finished for every step, in order.
    hooks = [(e[0], e[1]) for e in log if e[0] != "rollout"]
    assert hooks == [("finished", -1)] + [(k, i) for i in range(4) for k in ("begin", "finished")]
    # Each step's rollout-finished hook comes before its training begins.
    for i in range(4):
        assert log.index(("rollout", i, records[i].rollout_finished)) < [
            (e[0], e[1]) for e in log
        ].index(("begin", i))


def test_staleness_lets_rollout_overlap_training():
    strict, _, _ = run_pipeline(steps=3, staleness=0)
    overlapped, _, _ = run_pipeline(steps=3, staleness=1)
    # With staleness 1, batch i+1 starts while step i trains; with 0 it waits for the sync.
    assert overlapped[1].rollout_started < overlapped[0].train_finished
    assert strict[1].rollout_started >= strict[0].sync_finished
    assert overlapped[-1].sync_finished < strict[-1].sync_finished
    assert all(t > 0 for t in throughput(overlapped))


def test_weight_sync_reaches_the_workers_and_tags_turns():
    records, _, _ = run_pipeline(steps=3, staleness=0)
    # Without staleness, batch i runs entirely on the weights of step i - 1 (version i).
    assert [rec.weight_versions for rec in records] == [(0, 0), (1, 1), (2, 2)]


def test_weight_sync_skips_workers_that_already_have_the_version():
    cost = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)

    async def main():
        a, b = SimulatedWorker("a", cost), SimulatedWorker("b", cost)
        await a.sync_weights(3, 5.0)  # e.g. restored the newest snapshot when borrowed
        t0 = asyncio.get_running_loop().time()
        await WeightSync(lambda: [a, b], lambda n: 10.0 * n).sync(3)
        elapsed = asyncio.get_running_loop().time() - t0
        a.close(), b.close()
        return elapsed, a.requested_version, b.requested_version

    elapsed, va, vb = run_virtual(main)[0]
    assert (va, vb) == (3, 3)
    assert elapsed == 10.0  # one receiver (b), not two


def test_overlapping_batches_start_before_the_previous_batch_finishes():
    sequential, _, _ = run_pipeline(steps=4, staleness=1)
    overlapped, _, _ = run_pipeline(steps=4, staleness=1, overlap=True)
    for i in range(1, 4):  # one batch at a time
        assert sequential[i].rollout_started >= sequential[i - 1].rollout_finished
    # Batch i + 1 needs only version i (step i - 1 synced): it starts during batch i's tail.
    assert any(
        overlapped[i].rollout_started < overlapped[i - 1].rollout_finished for i in range(1, 4)
    )
    for i in range(2, 4):
        assert overlapped[i].rollout_started >= overlapped[i - 2].sync_finished
        assert overlapped[i].weight_versions[0] >= i - 1
    assert overlapped[-1].sync_finished < sequential[-1].sync_finished


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("staleness", [0, 1])
def test_a_resumed_run_keeps_the_staleness_bound(staleness, overlap):
    # From a checkpoint at v20 with training far slower than rollout: batch i must wait for
    # v20 + i - staleness (the bound counted steps from 0 let batches run ahead, staleness
    # growing by one per step).
    records, log, _ = run_pipeline(
        steps=5, staleness=staleness, overlap=overlap, start_version=20, extra_train_s=200.0
    )
    trained = [e[3] for e in log if e[0] == "finished" and e[1] >= 0]
    assert trained == [21, 22, 23, 24, 25]
    for i, rec in enumerate(records):
        assert rec.weight_versions[0] >= 20 + i - staleness
        # The trainer trains weights v20 + i on it: at most `staleness` versions newer.
        assert 20 + i - rec.weight_versions[0] <= staleness


def test_a_batch_older_than_the_bound_is_refused_before_training():
    # A weight sync that reaches no worker leaves every turn on v0: step 2 (trainer at v2,
    # staleness 0 allowed) must not train on it.
    with pytest.raises(StalenessError, match="staleness 2 exceeds max_staleness=1"):
        run_pipeline(steps=4, staleness=1, sync=False)


def test_each_token_counts_the_oldest_weights_behind_it():
    # Staleness 1: batch i + 1 rolls out while step i trains, and the new weights land with
    # its turns in flight. Their later tokens are sampled by the new weights on KV the old
    # ones computed: counted under (new, old), and the batch's oldest version is the KV's.
    records, _, _ = run_pipeline(steps=4, staleness=1)
    for rec in records:
        assert sum(rec.tokens_by_version.values()) == rec.rollout_tokens
        assert rec.weight_versions[0] == min(kv for _, kv in rec.tokens_by_version)
        assert rec.weight_versions[1] == max(w for w, _ in rec.tokens_by_version)
        assert all(kv <= w for w, kv in rec.tokens_by_version)
    assert any(kv < w for rec in records for w, kv in rec.tokens_by_version)


def test_joined_turn_outputs_keep_each_tokens_versions():
    from pearl.control.interfaces import TurnOutput

    a = TurnOutput("r", "s", [1, 2, 3], [0.0] * 3, "abort", 4, version_spans=((0, 3, 3), (2, 4, 3)))
    b = TurnOutput("r/resume1", "s", [5, 6], [0.0] * 2, "stop", 4)  # recomputed under v4
    c = TurnOutput("r", "s", [], [], "abort", 3)
    joined = a.joined(b, request_id="r")
    assert joined.token_ids == [1, 2, 3, 5, 6] and joined.request_id == "r"
    assert joined.version_spans == ((0, 3, 3), (2, 4, 3), (3, 4, 4))
    assert joined.tokens_by_version() == {(3, 3): 2, (4, 3): 1, (4, 4): 2}
    assert joined.oldest_version == 3 and joined.weight_version == 4
    assert c.joined(b).version_spans == ((0, 4, 4),)  # an empty first part adds no span
    assert a.joined(c).version_spans == a.version_spans
    assert b.tokens_by_version(n=7) == {(4, 4): 7}  # a turn whose ids were dropped


def test_a_turn_without_tokens_keeps_every_other_field():
    import dataclasses

    from pearl.control.interfaces import TurnOutput, TurnTelemetry

    out = TurnOutput(
        "r", "s", [1, 2], [0.5, 0.25], "stop", 4, TurnTelemetry(decode_worker="w"), ((0, 3, 3),)
    )
    dropped = out.without_tokens()
    assert dropped == dataclasses.replace(out, token_ids=[], logprobs=[])
    assert out.token_ids == [1, 2] and dropped.telemetry is out.telemetry
    fields = {f.name for f in dataclasses.fields(TurnOutput)}  # a new field must be carried over
    assert fields == {"request_id", "session_id", "token_ids", "logprobs", "finish_reason"} | {
        "weight_version",
        "telemetry",
        "version_spans",
    }
