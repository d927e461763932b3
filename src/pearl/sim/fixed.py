"""The simulated world: GPUs on a network, rollout workers as TP groups, and a fixed
deployment (N colocated workers or an N_P:N_D split) running rollout batches."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.deployment import Deployment
from pearl.control.interfaces import AsyncioClock, RolloutWorker, WorkerRole
from pearl.control.rollout import BatchResult, run_rollout_batch
from pearl.control.router import Router
from pearl.control.scripted import ScriptedChange, run_scripted_batch
from pearl.sim.clock import VirtualTimeLoop, sparse_gc
from pearl.sim.costmodel import CostModel
from pearl.sim.kv_mover import SimKVMover
from pearl.sim.network import Network
from pearl.sim.worker import SimEngineConfig, SimulatedWorker
from pearl.workloads.batch import RolloutBatch


@dataclass(slots=True)
class SimulatedCluster:
    """Rollout workers (TP groups) on GPUs of one kind, with a network between them."""

    cost: CostModel
    num_workers: int
    engine: SimEngineConfig = field(default_factory=SimEngineConfig)
    vocab_size: int = 151_936
    size_kv_from_memory: bool = True  # False: keep engine.num_kv_blocks (to mirror a live engine)
    link_latency_s: float | None = None  # per-transfer latency; None: the network's defaults
    workers: list[SimulatedWorker] = field(default_factory=list)
    network: Network | None = None
    gpus_of: dict[str, list[int]] = field(default_factory=dict)
    on_iteration: Callable | None = None  # passed to every worker (see SimulatedWorker)

    def build(self) -> None:
        tp = self.cost.tp
        gpn = self.cost.gpu.gpus_per_node
        nodes = max(1, math.ceil(self.num_workers * tp / gpn))
        if self.link_latency_s is None:
            self.network = Network.for_gpu(self.cost.gpu, nodes)
        else:
            g = self.cost.gpu
            self.network = Network(
                nodes,
                gpn,
                g.nvlink_bandwidth_Bps,
                g.network_bandwidth_Bps,
                nvlink_latency_s=self.link_latency_s,
                network_latency_s=self.link_latency_s,
            )
        engine = self.engine
        if self.size_kv_from_memory:
            capacity = self.cost.kv_capacity_tokens()
            if capacity < engine.block_size * 2:
                raise ValueError(
                    f"{self.cost.model.name} does not fit on TP{tp} {self.cost.gpu.name}: KV capacity {capacity} tokens"
                )
            engine = dataclasses.replace(engine, num_kv_blocks=capacity // engine.block_size)
        self.workers = []
        for i in range(self.num_workers):
            wid = f"w{i}"
            self.gpus_of[wid] = list(range(i * tp, (i + 1) * tp))
            self.workers.append(
                SimulatedWorker(
                    wid,
                    self.cost,
                    engine,
                    vocab_size=self.vocab_size,
                    on_iteration=self.on_iteration,
                )
            )

    async def deploy(
        self, deployment: Deployment, handles: Sequence[RolloutWorker] | None = None
    ) -> Router:
        """Assign roles for ``deployment`` and return a router over them; ``handles``
        (one per worker, e.g. timing proxies) are what the router sees instead."""
        if deployment.num_workers != self.num_workers:
            raise ValueError(
                f"deployment {deployment.label} needs {deployment.num_workers} workers, cluster has {self.num_workers}"
            )
        seen = list(handles) if handles is not None else list[RolloutWorker](self.workers)
        router = Router(SimKVMover(self.network, self.cost, self.gpus_of))
        if deployment.colocated:
            router.set_topology(colocated=seen)
            return router
        for w in self.workers[: deployment.prefill]:
            await w.set_role(WorkerRole.PREFILL)
        for w in self.workers[deployment.prefill :]:
            await w.set_role(WorkerRole.DECODE)
        router.set_topology(prefill=seen[: deployment.prefill], decode=seen[deployment.prefill :])
        return router

    def close(self) -> None:
        for w in self.workers:
            w.close()


@dataclass(slots=True)
class FixedRolloutReport:
    """One simulated rollout batch on a fixed deployment."""

    deployment: str
    makespan_s: float
    generated_tokens: int
    turns: int
    iterations: int
    fast_forwarded_iterations: int
    timer_events: int
    wall_s: float
    kv_bytes_moved: int
    prefill_tokens_computed: int
    prefill_tokens_cached: int
    mean_turn_latency_s: float
    worker_busy_fraction: list[float]
    time_breakdown: list[dict[str, float]] = field(default_factory=list)
    """Per worker: seconds per ``TimeUse`` over the makespan."""
    result: BatchResult | None = None

    @classmethod
    def of(
        cls,
        deployment: Deployment,
        cluster: SimulatedCluster,
        result: BatchResult,
        timer_events: int,
        wall_started: float,
    ) -> FixedRolloutReport:
        """The report of ``result``, run on ``cluster`` since ``wall_started``."""
        wall = time.perf_counter() - wall_started
        turns = [o for t in result.trajectories for o in t.turns]
        workers = cluster.workers
        computed, cached = result.prefill_tokens()
        return cls(
            deployment=deployment.label,
            makespan_s=result.makespan_s,
            generated_tokens=result.generated_tokens,
            turns=len(turns),
            iterations=sum(w.counters.iterations for w in workers),
            fast_forwarded_iterations=sum(w.counters.fast_forwarded_iterations for w in workers),
            timer_events=timer_events,
            wall_s=wall,
            kv_bytes_moved=sum(o.telemetry.kv_bytes_moved for o in turns),
            prefill_tokens_computed=computed,
            prefill_tokens_cached=cached,
            mean_turn_latency_s=sum(result.turn_latencies()) / max(1, len(turns)),
            worker_busy_fraction=[
                w.counters.busy_s / max(result.makespan_s, 1e-9) for w in workers
            ],
            time_breakdown=[w.counters.time_breakdown(result.makespan_s) for w in workers],
            result=result,
        )

    @property
    def iterations_per_wall_s(self) -> float:
        return self.iterations / max(self.wall_s, 1e-9)


@dataclass(slots=True, frozen=True)
class _FixedRollout:
    """One batch on a built cluster's deployment, through the changes scripted for it."""

    batch: RolloutBatch
    cluster: SimulatedCluster
    deployment: Deployment
    config: AgentLoopConfig
    changes: Sequence[ScriptedChange]
    phases: Sequence[CostModel]  # the cost model of the workers from each change on
    wrap: Callable[[RolloutWorker], RolloutWorker] | None

    async def run(self) -> BatchResult:
        """Deploy the cluster's workers and run the batch, through the changes if any."""
        workers = self.cluster.workers
        seen = [self.wrap(w) for w in workers] if self.wrap is not None else list(workers)
        router = await self.cluster.deploy(self.deployment, seen)
        if not self.changes:
            return await run_rollout_batch(self.batch, router, AsyncioClock(), self.config)

        async def stop(handle: RolloutWorker) -> None:
            workers[next(i for i, h in enumerate(seen) if h is handle)].close()

        repricing = asyncio.ensure_future(self._reprice(asyncio.get_running_loop().time()))
        try:
            return await run_scripted_batch(
                self.batch,
                seen,
                self.deployment.topology,
                self.changes,
                router.kv_mover,
                AsyncioClock(),
                self.config,
                stop=stop,
            )
        finally:
            repricing.cancel()

    async def _reprice(self, start: float) -> None:
        """From each change's time on, price the workers' iterations by its phase's cost model."""
        loop = asyncio.get_running_loop()
        in_order = sorted(zip(self.changes, self.phases, strict=True), key=lambda c: c[0].at_s)
        for change, phase in in_order:
            await asyncio.sleep(max(0.0, start + change.at_s - loop.time()))
            for worker in self.cluster.workers:
                worker.cost = phase


def simulate_fixed_rollout(
    batch: RolloutBatch,
    cost: CostModel,
    deployment: Deployment,
    engine: SimEngineConfig | None = None,
    vocab_size: int = 151_936,
    token_seed: int = 0,
    size_kv_from_memory: bool = True,
    link_latency_s: float | None = None,
    on_iteration: Callable | None = None,
    changes: Sequence[ScriptedChange] = (),
    wrap: Callable[[RolloutWorker], RolloutWorker] | None = None,
    phase_costs: Sequence[CostModel] = (),
    token_runs: bool = True,
) -> FixedRolloutReport:
    """Run ``batch`` once on ``deployment`` in virtual time and report its makespan;
    ``changes`` reconfigure it mid-batch (a mode switch, a shrink) through the rebuilder,
    and with ``phase_costs`` (one per change) the workers' iterations are priced by that
    change's cost model from then on (a fit of the deployment it changes to);
    ``wrap`` replaces each worker handle the router sees (e.g. a timing proxy), as in
    :func:`pearl.apps.fidelity.run_live_case`. ``token_runs=False`` keeps contexts as
    token lists instead of ``TokenRuns`` (the same results, slower: a check of the runs)."""
    if phase_costs and len(phase_costs) != len(changes):
        raise ValueError(
            f"{len(phase_costs)} phase costs for {len(changes)} changes: give one per change"
        )
    cluster = SimulatedCluster(
        cost,
        deployment.num_workers,
        engine or SimEngineConfig(),
        vocab_size,
        size_kv_from_memory,
        link_latency_s,
        on_iteration=on_iteration,
    )
    cluster.build()
    rollout = _FixedRollout(
        batch=batch,
        cluster=cluster,
        deployment=deployment,
        config=AgentLoopConfig(vocab_size, token_seed, token_runs=token_runs),
        changes=changes,
        phases=list(phase_costs) or [cost] * len(changes),
        wrap=wrap,
    )
    loop = VirtualTimeLoop()
    wall0 = time.perf_counter()
    try:
        with sparse_gc():
            result = loop.run_until_complete(rollout.run())
    finally:
        cluster.close()
        # Let cancelled engine loops unwind before the loop closes.
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
    return FixedRolloutReport.of(deployment, cluster, result, loop.timer_jumps, wall0)


def deployments_for(num_workers: int) -> Sequence[Deployment]:
    """Colocation and every P:D split of ``num_workers`` workers."""
    return [Deployment(colocated=num_workers)] + [
        Deployment(prefill=p, decode=num_workers - p) for p in range(1, num_workers)
    ]
