"""The simulated GRPO trainer: steps, device release/restore and weight sync in virtual time."""

from __future__ import annotations

import asyncio

from pearl.control.interfaces import TrainBatch, TrainMetrics
from pearl.errors import EngineStateError
from pearl.sim.costmodel import CostModel


class SimulatedTrainer:
    """Implements ``pearl.control.interfaces.Trainer`` with the cost model's step time."""

    def __init__(self, cost: CostModel, num_gpus: int) -> None:
        if num_gpus < 1:
            raise ValueError(f"a trainer needs >= 1 GPU, got {num_gpus}")
        self.cost = cost
        self.num_gpus = num_gpus
        self._version = 0
        self._released = False
        self.steps = 0
        self.busy_s = 0.0

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def device_released(self) -> bool:
        return self._released

    async def train_step(self, batch: TrainBatch) -> TrainMetrics:
        if self._released:
            raise EngineStateError(
                "training started while its GPUs are lent out; restore_device() first"
            )
        loop = asyncio.get_running_loop()
        start = loop.time()
        seconds = self.cost.train_step_time(batch.tokens, self.num_gpus, batch.max_sequence_tokens)
        await asyncio.sleep(seconds)
        self._version += 1
        self.steps += 1
        self.busy_s += seconds
        return TrainMetrics(batch.step, self._version, start, loop.time(), batch.tokens)

    async def release_device(self) -> None:
        await asyncio.sleep(self.cost.worker_latencies().deactivate_s)
        self._released = True

    async def restore_device(self) -> None:
        await asyncio.sleep(self.cost.worker_latencies().activate_s)
        self._released = False

    def weight_sync_time(self, receivers: int) -> float:
        """Seconds to push the current weights to ``receivers`` rollout workers."""
        return self.cost.weight_sync_time(receivers)
