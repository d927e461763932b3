"""The simulated world under the control plane: ``SimWorld``.

What ``pearl.control.composition.ControlPlane`` needs from a simulated run: rollout
workers are ``SimulatedWorker``s (the engine's scheduler over the cost model), the trainer
is a ``SimulatedTrainer``, KV moves go over the cluster's ``Network``, and starting,
toggling and syncing workers take the cost model's latencies. With ``check_invariants``
the workers and trainer fail the run when the control plane breaks a rule of the table.
"""

from __future__ import annotations

from collections.abc import Callable

from pearl.control.composition import WorldLatencies
from pearl.control.interfaces import WorkerRole
from pearl.control.makespan import WorkloadParams
from pearl.control.rollout_engine import EngineCapabilities
from pearl.control.state import WorkerSlot, WorkerStatus, WorkerTable, Zone
from pearl.control.tracker import IterationObservation, RuntimeTracker
from pearl.sim.costmodel import CostModel
from pearl.sim.kv_mover import SimKVMover
from pearl.sim.network import Network
from pearl.sim.trainer import SimulatedTrainer
from pearl.sim.worker import SimEngineConfig, SimulatedWorker
from pearl.workloads.profiles import AgenticProfile


class InvariantViolation(AssertionError):
    """The control plane broke a rule the run was asked to check."""


class _CheckedWorker(SimulatedWorker):
    """A simulated worker that checks, at every dispatch, the table row of its slot."""

    def __init__(self, *args, table: WorkerTable, slot_id: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._table, self._slot_id = table, slot_id

    def _check(self, role: WorkerRole | None) -> None:
        row = self._table.snapshot().slot(self._slot_id)
        if row.status is not WorkerStatus.ACTIVE or (role is not None and row.role is not role):
            raise InvariantViolation(
                f"turn sent to {self.worker_id} as {role or 'colocated/any'}, but slot "
                f"{self._slot_id} is {row.status} {row.role} (table version {self._table.version})"
            )

    async def generate(self, turn):
        self._check(WorkerRole.COLOCATED)
        return await super().generate(turn)

    async def prefill(self, turn):
        self._check(WorkerRole.PREFILL)
        return await super().prefill(turn)

    async def decode(self, turn):
        self._check(WorkerRole.DECODE)
        return await super().decode(turn)


class _CheckedTrainer(SimulatedTrainer):
    """Refuses to train while any overlap rollout slot holds GPUs (besides the trainer's
    own check that its device state was restored)."""

    def __init__(self, *args, table: WorkerTable, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._table = table

    async def train_step(self, batch):
        for s in self._table.snapshot().slots:
            if (
                s.zone is Zone.OVERLAP
                and not s.is_training
                and s.status is not WorkerStatus.INACTIVE
            ):
                raise InvariantViolation(
                    f"training step {batch.step} started while overlap slot {s.slot_id} is {s.status}"
                )
        return await super().train_step(batch)


def prior_params(
    cost: CostModel, profile: AgenticProfile, engine: SimEngineConfig, bandwidth_Bps: float
) -> WorkloadParams:
    """What the deployment knows before measuring anything: model and hardware sizes (the
    bandwidth of one prefill -> decode worker link, ``bandwidth_Bps``), and
    the cost model's iteration costs (A, b at half the profile's longest context,
    t_prefill of a full chunk), which the tracker keeps where its data cannot identify
    them. The workload fields are placeholders, replaced by the first refit (nothing is
    decided from them: the decider stays colocated until then)."""
    capacity_tokens = cost.kv_capacity_tokens()
    context = max(1, profile.max_context_tokens // 2)
    fixed = cost.decode_time(1, 1)
    per_sequence = max(1e-9, (cost.decode_time(8, 8 * context) - cost.decode_time(1, context)) / 7)
    chunk = engine.max_num_batched_tokens
    return WorkloadParams(
        turns=1,
        decode_tokens_per_turn=1,
        appended_tokens_per_turn=1,
        bubble_ratio=0,
        decode_step_fixed_s=fixed,
        decode_step_per_sequence_s=per_sequence,
        prefill_s_per_token=cost.prefill_time(chunk) / chunk,
        switch_overhead_s=0,
        env_time_s=0,
        kv_bytes_per_token=cost.kv_bytes(1),
        pd_bandwidth_bytes_per_s=bandwidth_Bps,
        kv_bytes_per_trajectory=cost.kv_bytes(profile.max_context_tokens),
        kv_capacity_bytes_per_worker=max(1, cost.kv_bytes(capacity_tokens)),
        batch_trajectories=profile.batch_size,
    )


def iteration_observer(tracker: RuntimeTracker) -> Callable[..., None]:
    """A simulated worker's ``on_iteration`` callback that reports each iteration (or
    fast-forwarded stretch) to the runtime tracker, as a live worker's log does."""

    def on_iteration(worker_id, start, dt, out, iterations) -> None:
        decodes = len(out.decodes)
        prefill = sum(ch.num_tokens for ch in out.prefills)
        # A fast-forwarded stretch: contexts grow by one token per step; report the mean.
        context = sum(s.num_tokens for s in out.decodes) + decodes * (iterations - 1) // 2
        tracker.observe_iteration(
            IterationObservation(decodes, prefill, dt / iterations, context, iterations)
        )

    return on_iteration


class SimWorld:
    """The simulated world of a run: simulated workers on the cost model, a simulated
    trainer of ``training_gpus``, KV moves over ``network``, the cost model's latencies."""

    capabilities = EngineCapabilities.full("simulated")  # our engine's scheduler: all of it

    def __init__(
        self,
        cost: CostModel,
        engine: SimEngineConfig,
        network: Network,
        training_gpus: int,
        prior: WorkloadParams,
        check_invariants: bool = False,
    ) -> None:
        self.cost = cost
        self.engine = engine
        self.network = network
        self.training_gpus = training_gpus
        self.prior = prior
        self.check_invariants = check_invariants
        lat = cost.worker_latencies()
        self.latencies = WorldLatencies(
            lat.prepare_s, lat.finalize_s, lat.activate_s, lat.deactivate_s
        )
        self.gpus_of: dict[str, list[int]] = {}

    def make_worker(self, wid: str, slot: WorkerSlot, role: WorkerRole, plane) -> SimulatedWorker:
        self.gpus_of[wid] = list(slot.gpus)
        on_iteration = iteration_observer(plane.tracker)
        vocab = self.cost.model.vocab_size
        if self.check_invariants:
            return _CheckedWorker(
                wid,
                self.cost,
                self.engine,
                role=role,
                vocab_size=vocab,
                on_iteration=on_iteration,
                table=plane.table,
                slot_id=slot.slot_id,
            )
        return SimulatedWorker(
            wid, self.cost, self.engine, role=role, vocab_size=vocab, on_iteration=on_iteration
        )

    async def started(self, worker: SimulatedWorker) -> None:
        """A simulated worker runs once made (its start took the factory's prepare time)."""

    async def stop_worker(self, worker: SimulatedWorker) -> None:
        worker.close()

    def make_trainer(self, plane) -> SimulatedTrainer:
        if self.check_invariants:
            return _CheckedTrainer(self.cost, num_gpus=self.training_gpus, table=plane.table)
        return SimulatedTrainer(self.cost, num_gpus=self.training_gpus)

    def make_kv_mover(self, plane) -> SimKVMover:
        return SimKVMover(self.network, self.cost, self.gpus_of)

    def weight_sync_s(self, receivers: int) -> float:
        return self.cost.weight_sync_time(receivers)
