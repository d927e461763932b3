"""Intra-scale borrowing of training GPUs around the training steps of the pipeline."""

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.interfaces import AsyncioClock, WorkerRole
from pearl.control.pipeline import PipelineConfig, PipelineScheduler, WeightSync
from pearl.control.rebuilder import InterScaleRebuilder
from pearl.control.router import Router
from pearl.control.state import WorkerStatus, WorkerTable, Zone
from pearl.control.toggle import IntraScaleToggleManager
from pearl.sim.clock import run_virtual
from pearl.sim.costmodel import CostModel
from pearl.sim.hardware import get_gpu
from pearl.sim.shapes import load_model_shape
from pearl.sim.trainer import SimulatedTrainer
from pearl.sim.worker import SimEngineConfig, SimulatedWorker
from pearl.workloads.agentic import generate_batch
from pearl.workloads.profiles import get_profile


class SimFactory:
    def __init__(self, cost):
        self.cost = cost

    async def start(self, slot, role):
        return SimulatedWorker(
            f"w{slot.slot_id}", self.cost, SimEngineConfig(num_kv_blocks=4096), role=role
        )

    async def stop(self, slot_id, worker):
        worker.close()


def run(gate_open: bool, steps=3):
    cost = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)
    lat = cost.worker_latencies()

    async def main():
        table = WorkerTable()
        dedicated = [
            table.add_slot([2 * i, 2 * i + 1], Zone.DEDICATED, WorkerRole.COLOCATED)
            for i in range(2)
        ]
        training = table.add_slot(
            range(100, 104), Zone.OVERLAP, WorkerRole.TRAINING, WorkerStatus.ACTIVE
        )
        overlap = [
            table.add_slot([100 + 2 * i, 101 + 2 * i], Zone.OVERLAP, WorkerRole.COLOCATED)
            for i in range(2)
        ]
        router = Router()
        trainer = SimulatedTrainer(cost, num_gpus=4)
        rebuilder = InterScaleRebuilder(
            table, router, SimFactory(cost), lambda: trainer.weight_version, cost.weight_sync_time
        )
        await rebuilder.expand({s: WorkerRole.COLOCATED for s in dedicated})
        retained = {
            s: SimulatedWorker(f"o{s}", cost, SimEngineConfig(num_kv_blocks=4096)) for s in overlap
        }
        toggle = IntraScaleToggleManager(
            rebuilder,
            trainer,
            [training],
            retained,
            lat.activate_s,
            lat.deactivate_s,
            gate=lambda: gate_open,
        )
        served = []
        original = router.run_turn

        async def watched(turn):
            out = await original(turn)
            served.append(out.telemetry.decode_worker)
            # A borrowed worker only ever serves while the trainer's GPUs are lent out.
            table.check()
            return out

        router.run_turn = watched
        pipeline = PipelineScheduler(
            lambda i: generate_batch(get_profile("swe"), num_tasks=1, group_size=8, seed=i),
            router,
            trainer,
            WeightSync(lambda: list(rebuilder.workers.values()), cost.weight_sync_time),
            AsyncioClock(),
            AgentLoopConfig(vocab_size=151_936),
            PipelineConfig(num_steps=steps, max_staleness=1),
            toggle,
        )
        records = await pipeline.run()
        for w in list(rebuilder.workers.values()) + list(retained.values()):
            w.close()
        return records, served, toggle, trainer

    return run_virtual(main)[0]


def test_borrowed_workers_serve_between_updates_and_are_back_before_training():
    records, served, toggle, trainer = run(gate_open=True)
    assert trainer.steps == 3  # SimulatedTrainer refuses to train while its GPUs are lent
    assert toggle.rounds >= 2
    assert any(w.startswith("o") for w in served)  # overlap workers did serve turns
    assert all(len(r.result.trajectories) == 8 for r in records)


def test_the_gate_can_keep_the_gpus_with_the_trainer():
    records, served, toggle, trainer = run(gate_open=False)
    # Evaluated at the start (the trainer idles until batch 0) and after each of 3 steps.
    assert toggle.rounds == 0 and toggle.skipped_by_gate == 4
    assert not any(w.startswith("o") for w in served)
    assert trainer.steps == 3


def test_a_dead_overlap_worker_is_marked_failed_replaced_and_borrowed_again():
    from pearl.control.elastic import ElasticScheduler

    cost = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)

    async def main():
        table = WorkerTable()
        dedicated = table.add_slot([0, 1], Zone.DEDICATED, WorkerRole.COLOCATED)
        training = table.add_slot(
            range(100, 104), Zone.OVERLAP, WorkerRole.TRAINING, WorkerStatus.ACTIVE
        )
        o0, o1 = (
            table.add_slot([100 + 2 * i, 101 + 2 * i], Zone.OVERLAP, WorkerRole.COLOCATED)
            for i in range(2)
        )
        trainer = SimulatedTrainer(cost, num_gpus=4)
        rebuilder = InterScaleRebuilder(
            table, Router(), SimFactory(cost), lambda: trainer.weight_version, cost.weight_sync_time
        )
        retained = {
            s: SimulatedWorker(f"o{s}", cost, SimEngineConfig(num_kv_blocks=4096)) for s in (o0, o1)
        }
        toggle = IntraScaleToggleManager(rebuilder, trainer, [training], retained, 1.0, 1.0)
        elastic = ElasticScheduler(
            rebuilder, [dedicated], [], gpus_per_worker=2, clock=AsyncioClock(), toggle=toggle
        )
        await elastic.start()
        status = lambda s: table.snapshot().slot(s).status  # noqa: E731
        seen = {}
        assert await toggle.borrow()
        dead = toggle.overlap[o0]
        dead.close()  # dies while serving
        await elastic.on_worker_failed(o0)
        seen["serving"] = (status(o0), o0 in rebuilder.workers)
        await elastic.settle()
        seen["replaced"] = (status(o0), toggle.overlap[o0] is not dead)
        await toggle.give_back()
        table.check()
        idle = toggle.overlap[o1]
        idle.close()  # dies between rounds
        await elastic.on_worker_failed(o1)
        seen["idle"] = status(o1)
        await elastic.settle()
        assert await toggle.borrow()
        seen["again"] = (status(o0), status(o1), set(rebuilder.workers))
        await toggle.give_back()
        table.check()
        for w in list(rebuilder.workers.values()) + list(toggle.overlap.values()):
            w.close()
        return seen, toggle, elastic, (dedicated, o0, o1)

    seen, toggle, elastic, (dedicated, o0, o1) = run_virtual(main)[0]
    assert seen["serving"] == (WorkerStatus.FAILED, False)
    assert seen["replaced"] == (WorkerStatus.INACTIVE, True)
    assert seen["idle"] is WorkerStatus.FAILED
    assert seen["again"] == (WorkerStatus.ACTIVE, WorkerStatus.ACTIVE, {dedicated, o0, o1})
    assert toggle.replaced == 2 and elastic.failures == 2
