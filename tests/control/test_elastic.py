"""Inter-scale elasticity driven by an availability trace, with the pipeline running."""

import asyncio

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.elastic import ElasticScheduler
from pearl.control.interfaces import AsyncioClock, WorkerRole
from pearl.control.pipeline import PipelineConfig, PipelineScheduler, WeightSync
from pearl.control.rebuilder import InterScaleRebuilder
from pearl.control.router import Router
from pearl.control.state import WorkerStatus, WorkerTable, Zone
from pearl.sim.clock import run_virtual
from pearl.sim.costmodel import CostModel
from pearl.sim.hardware import get_gpu
from pearl.sim.shapes import load_model_shape
from pearl.sim.trainer import SimulatedTrainer
from pearl.sim.worker import SimEngineConfig, SimulatedWorker
from pearl.workloads.agentic import generate_batch
from pearl.workloads.profiles import get_profile


class CheckedFactory:
    """Simulated workers that fail the run if a turn reaches a slot the table says is not active."""

    def __init__(self, cost, table, prepare_s):
        self.cost, self.table, self.prepare_s = cost, table, prepare_s
        self.stopped = 0

    async def start(self, slot, role):
        await asyncio.sleep(self.prepare_s)
        table, slot_id = self.table, slot.slot_id

        class Checked(SimulatedWorker):
            async def generate(self, turn):
                assert table.snapshot().slot(slot_id).status is WorkerStatus.ACTIVE
                return await super().generate(turn)

        return Checked(f"w{slot_id}", self.cost, SimEngineConfig(num_kv_blocks=8192), role=role)

    async def stop(self, slot_id, worker):
        worker.close()
        self.stopped += 1


def run(changes, steps=3):
    cost = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)

    async def main():
        clock = AsyncioClock()
        table = WorkerTable()
        slots = [
            table.add_slot([2 * i, 2 * i + 1], Zone.DEDICATED, WorkerRole.COLOCATED)
            for i in range(5)
        ]
        router = Router()
        trainer = SimulatedTrainer(cost, num_gpus=4)
        factory = CheckedFactory(cost, table, prepare_s=cost.worker_latencies().prepare_s)
        rebuilder = InterScaleRebuilder(
            table,
            router,
            factory,
            lambda: trainer.weight_version,
            cost.weight_sync_time,
            finalize_s=11.05,
        )
        elastic = ElasticScheduler(rebuilder, slots[:1], slots[1:], gpus_per_worker=2, clock=clock)
        await elastic.start()
        pipeline = PipelineScheduler(
            lambda i: generate_batch(get_profile("swe"), num_tasks=1, group_size=8, seed=i),
            router,
            trainer,
            WeightSync(lambda: list(rebuilder.workers.values()), cost.weight_sync_time),
            clock,
            AgentLoopConfig(vocab_size=151_936),
            PipelineConfig(num_steps=steps, max_staleness=1),
        )
        replay = asyncio.ensure_future(elastic.replay(changes))
        records = await pipeline.run()
        replay.cancel()
        await elastic.settle()
        table.check()
        for w in rebuilder.workers.values():
            w.close()
        return records, elastic, rebuilder, table

    return run_virtual(main)[0]


def test_preemptible_workers_come_and_go_and_every_trajectory_completes_once():
    # 0 -> 8 GPUs (4 workers) -> 2 -> 6 -> 0, in seconds
    changes = [(10.0, 8), (120.0, 2), (200.0, 6), (400.0, 0)]
    records, elastic, rebuilder, table = run(changes)
    for i, rec in enumerate(records):
        batch = generate_batch(get_profile("swe"), num_tasks=1, group_size=8, seed=i)
        assert sorted(t.session_id for t in rec.result.trajectories) == sorted(
            f"{t.task_id}/{t.index_in_group}" for t in batch.trajectories
        )
        for traj in rec.result.trajectories:
            assert [len(o.token_ids) for o in traj.turns] == [
                t.response_tokens for t in traj.trajectory.turns
            ]
    assert [e.workers_target for e in elastic.events] == [5, 2, 4, 1]
    assert rebuilder.router.turns_resumed >= 0  # shrinks may cut turns; they resume


def test_a_shrink_during_an_expansion_cancels_the_whole_group():
    # 8 GPUs arrive, then are reclaimed 20 s later, before the 56 s preparation ends.
    records, elastic, rebuilder, table = run([(10.0, 8), (30.0, 0)], steps=1)
    assert rebuilder.expansions_cancelled == 1
    assert set(rebuilder.workers) == {0}
    assert all(table.snapshot().slot(s).status is WorkerStatus.INACTIVE for s in range(1, 5))


def test_a_failed_worker_is_marked_failed_then_restarted_on_its_slot():
    cost = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)

    class RecordingTable(WorkerTable):
        def __init__(self):
            super().__init__()
            self.history = []

        def set_statuses(self, changes):
            super().set_statuses(changes)
            self.history += [(s, WorkerStatus(v)) for s, v in changes.items()]

    async def main():
        table = RecordingTable()
        slots = [
            table.add_slot([2 * i, 2 * i + 1], Zone.DEDICATED, WorkerRole.COLOCATED)
            for i in range(2)
        ]
        factory = CheckedFactory(cost, table, prepare_s=5.0)
        rebuilder = InterScaleRebuilder(table, Router(), factory, lambda: 0, cost.weight_sync_time)
        events = []
        elastic = ElasticScheduler(
            rebuilder,
            slots[:1],
            slots[1:],
            gpus_per_worker=2,
            clock=AsyncioClock(),
            log=events.append,
        )
        await elastic.start()
        dead = rebuilder.workers[0]
        dead.close()  # the process dies
        await elastic.on_worker_failed(0)
        marked = table.snapshot().slot(0).status
        await elastic.settle()
        table.check()
        restarted = rebuilder.workers[0]
        for w in rebuilder.workers.values():
            w.close()
        return table, events, marked, dead, restarted, elastic

    table, events, marked, dead, restarted, elastic = run_virtual(main)[0]
    assert marked in (WorkerStatus.FAILED, WorkerStatus.TRANSITIONING)
    slot0 = [status for s, status in table.history if s == 0]
    assert slot0[-3:] == [WorkerStatus.FAILED, WorkerStatus.TRANSITIONING, WorkerStatus.ACTIVE]
    assert restarted is not dead and table.snapshot().slot(0).status is WorkerStatus.ACTIVE
    assert [e["kind"] for e in events if e["kind"] in ("failure", "restart")] == [
        "failure",
        "restart",
    ]
    assert elastic.failures == 1
