import pytest

from pearl.control.interfaces import TrainBatch, Trainer
from pearl.errors import EngineStateError
from pearl.sim.clock import run_virtual
from pearl.sim.costmodel import CostModel
from pearl.sim.hardware import get_gpu
from pearl.sim.shapes import load_model_shape
from pearl.sim.trainer import SimulatedTrainer


def trainer(gpus=8):
    return SimulatedTrainer(CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=1), gpus)


def test_train_steps_take_cost_model_time_and_bump_the_version():
    t = trainer()
    assert isinstance(t, Trainer)
    batch = TrainBatch(step=0, trajectories=64, tokens=64 * 20_000, max_sequence_tokens=32_768)

    async def main():
        first = await t.train_step(batch)
        second = await t.train_step(batch)
        return first, second

    (first, second), end = run_virtual(main)
    expected = t.cost.train_step_time(batch.tokens, 8, batch.max_sequence_tokens)
    assert first.finished_at - first.started_at == pytest.approx(expected)
    assert (first.weight_version, second.weight_version) == (1, 2)
    assert end == pytest.approx(2 * expected)


def test_more_training_gpus_make_a_step_faster():
    batch = TrainBatch(0, 64, 64 * 20_000, 32_768)
    few, many = trainer(4), trainer(16)
    assert many.cost.train_step_time(batch.tokens, 16) < few.cost.train_step_time(batch.tokens, 4)


def test_training_refuses_to_start_while_the_gpus_are_lent():
    t = trainer()

    async def main():
        await t.release_device()
        with pytest.raises(EngineStateError, match="restore_device"):
            await t.train_step(TrainBatch(0, 1, 1000, 1000))
        await t.restore_device()
        return await t.train_step(TrainBatch(0, 1, 1000, 1000))

    metrics, end = run_virtual(main)
    lat = t.cost.worker_latencies()
    assert metrics.weight_version == 1
    assert end > lat.deactivate_s + lat.activate_s
