"""The live world under the composition root: engine actors and a GRPO trainer actor (Ray).

``LiveWorld`` is what ``pearl.control.composition.ControlPlane`` needs from live runs:
rollout workers are ``LiveWorker`` actors on a slot's devices (on this machine: one
process, one torch thread each), the trainer is the ``LiveTrainer`` actor, KV moves go
through Ray's object store, and new workers load the trainer's newest weights from it
before admission. ``IterationFeed`` forwards the pipeline's hooks to the Elastic Scheduler
after feeding the runtime tracker the iterations the engines ran, so the decision model
is refitted from live measurements as in the simulator.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pearl.control.composition import WorldLatencies
from pearl.control.driver import ForwardingListener
from pearl.control.interfaces import WorkerRole
from pearl.control.makespan import WorkloadParams
from pearl.control.state import WorkerSlot
from pearl.control.tracker import IterationObservation
from pearl.engine.config import EngineConfig
from pearl.errors import EngineStateError
from pearl.live.cluster import Placement
from pearl.live.server import ModelSpec
from pearl.live.trainer_handle import LiveTrainer
from pearl.live.worker import LiveKVMover, LiveWorker, server_class
from pearl.models.config import ModelConfig


def cpu_prior(model: ModelConfig, batch_trajectories: int, max_context: int) -> WorkloadParams:
    """What a live CPU deployment assumes before measuring (refitted after the first batch):
    decode iterations of ~10 ms plus ~1 ms per sequence and prefill ~1 ms per token for a
    SmolLM2-135M-sized model (scaled by layers x width), KV bytes from the model's shape
    (fp32), the object store's ~150 MB/s between actors."""
    kv_per_token = model.kv_bytes_per_token
    width = model.hidden_size * model.num_hidden_layers / (576 * 30)  # SmolLM2-135M = 1
    return WorkloadParams(
        turns=1,
        decode_tokens_per_turn=1,
        appended_tokens_per_turn=1,
        bubble_ratio=0,
        decode_step_fixed_s=0.01 * width,
        decode_step_per_sequence_s=0.001 * width,
        prefill_s_per_token=0.001 * width,
        switch_overhead_s=0,
        env_time_s=0,
        kv_bytes_per_token=kv_per_token,
        pd_bandwidth_bytes_per_s=150e6,
        kv_bytes_per_trajectory=kv_per_token * max_context,
        kv_capacity_bytes_per_worker=float("inf"),
        batch_trajectories=batch_trajectories,
    )


class LiveWorld:
    """Engine actors (``EngineServer``) and a trainer actor, for the composition root."""

    def __init__(
        self,
        model: ModelSpec,
        engine: EngineConfig,
        trainer: LiveTrainer,
        prior: WorkloadParams,
        latencies: WorldLatencies | None = None,
        placement: Placement | None = None,
        on_placed: Callable[[dict], None] | None = None,
        start_timeout_s: float = 600.0,
        backend: str = "pearl",
    ) -> None:
        self.model = model
        self.engine = engine
        self.trainer = trainer
        self.prior = prior
        self.latencies = latencies or WorldLatencies()
        self.placement = placement
        self.on_placed = on_placed  # gets a "placed" event once each worker runs somewhere
        self.start_timeout_s = start_timeout_s  # a new worker Ray cannot place by then fails
        self.backend = backend
        self.capabilities = server_class(backend).capabilities  # what its policy may use
        self.workers: dict[str, LiveWorker] = {}
        self._placing: set[asyncio.Future] = set()

    def make_worker(self, worker_id: str, slot: WorkerSlot, role: WorkerRole, plane) -> LiveWorker:
        worker = LiveWorker(worker_id, self.model, self.engine, role, self.placement, self.backend)
        worker.weights_source = lambda: self.trainer.weights_ref
        worker.on_failure = lambda: plane.worker_failed(slot.slot_id)
        self.workers[worker_id] = worker
        if self.on_placed is not None:
            task = asyncio.ensure_future(self._report_placement(worker, slot.slot_id))
            self._placing.add(task)
            task.add_done_callback(self._placing.discard)
        return worker

    async def _report_placement(self, worker: LiveWorker, slot_id) -> None:
        try:
            await worker.ready()
        except EngineStateError:
            return  # it died before it ran: the failure is reported as such
        assert self.on_placed is not None and worker.location is not None
        self.on_placed(
            {"kind": "placed", "actor": "rollout", "worker": worker.worker_id, "slot": slot_id}
            | worker.location
        )

    async def started(self, worker: LiveWorker) -> None:
        await worker.ready(self.start_timeout_s)

    async def stop_worker(self, worker: LiveWorker) -> None:
        worker.kill()
        if self.workers.get(worker.worker_id) is worker:
            del self.workers[worker.worker_id]

    def make_trainer(self, plane) -> LiveTrainer:
        return self.trainer

    def make_kv_mover(self, plane) -> LiveKVMover:
        return LiveKVMover()

    def weight_sync_s(self, receivers: int) -> float:
        return 0.0  # live: a sync takes what it takes

    async def start_logging(self) -> None:
        await asyncio.gather(*(w.actor.log_iterations.remote(True) for w in self.workers.values()))

    async def drain_logs(self) -> list[tuple[list, list[int], float]]:
        """Every iteration the live workers ran since the last call: (prefill chunks as
        (tokens, cached), decode contexts, seconds)."""
        logs = await asyncio.gather(
            *(w.actor.log_iterations.remote(True) for w in self.workers.values()),
            return_exceptions=True,
        )
        # A stopped worker reports nothing.
        return [it for log in logs if not isinstance(log, BaseException) for it in log]

    def kill_all(self) -> None:
        for w in self.workers.values():
            try:
                w.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass


def as_observation(iteration: tuple[list, list[int], float]) -> IterationObservation:
    prefills, decodes, seconds = iteration
    return IterationObservation(len(decodes), sum(t for t, _ in prefills), seconds, sum(decodes))


class IterationFeed(ForwardingListener):
    """Pipeline listener: the tracker sees the live iterations of a batch before the Elastic
    Scheduler refits on it; ``on_step(step, version)`` runs after each trained step.
    ``iterations[step]`` keeps each batch's iterations as the engines logged them."""

    def __init__(self, world: LiveWorld, plane, on_step=None) -> None:
        super().__init__(plane)
        self.world, self.on_step = world, on_step
        self.iterations: dict[int, list] = {}

    async def on_rollout_finished(self, step: int, result) -> None:
        logs = await self.world.drain_logs()
        self.iterations[step] = logs
        for it in logs:
            self.plane.tracker.observe_iteration(as_observation(it))
        await super().on_rollout_finished(step, result)

    async def on_training_finished(self, step: int, weight_version: int) -> None:
        await super().on_training_finished(step, weight_version)
        if self.on_step is not None and step >= 0:
            await self.on_step(step, weight_version)
