"""Shared links with contention, for KV-cache and weight transfers, in (virtual) asyncio time.

Fluid model: a transfer (a *flow*) first waits its path's latency, then streams its bytes
over one or more links. Concurrent flows share every link by max-min fairness: on a
single link each of n flows gets bandwidth / n (processor sharing); a flow crossing
several links gets the rate of its most contended one, and what it cannot use goes to
the others. Rates are recomputed whenever a flow starts, finishes or is cancelled, and a
single timer (``loop.call_at``) waits for the next finish. Because it only uses the
running loop's clock, timers and futures, it runs unchanged in wall-clock asyncio and in
``pearl.sim.clock.run_virtual``.

Approximations (documented, deliberate):
- links are full duplex and modeled per direction (a GPU's NVLink egress and ingress,
  a NIC's send and receive side); switch cores are non-blocking;
- path latency is paid once, before streaming (no store-and-forward per hop);
- a cross-node flow uses the sender's NIC and the receiver's NIC, so it is limited by
  the more contended of the two (the bottleneck) under max-min fairness.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass

from pearl.sim.hardware import GPUSpec

COMPLETION_TOLERANCE_S = 1e-9
"""A flow whose remaining bytes would take at most this long is finished. It absorbs
float rounding in the clock (the loop fires timers up to its clock resolution early)."""

NVLINK_LATENCY_S = 5e-6
"""Start-up latency of an intra-node GPU-to-GPU copy (NVLink P2P/copy engine)."""
NETWORK_LATENCY_S = 20e-6
"""Start-up latency of an inter-node RDMA transfer (verbs post, completion, one hop of
switching), excluding any software handshake of a KV-transfer library."""


@dataclass(slots=True, eq=False)
class _Flow:
    links: tuple[Link, ...]
    nbytes: float
    future: asyncio.Future[None]
    remaining: float
    rate: float = 0.0


class Fabric:
    """Shares a set of links among concurrent flows by max-min fairness (fluid model)."""

    def __init__(self) -> None:
        self._flows: list[_Flow] = []
        self._last_update = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._targets: list[_Flow] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def active_flows(self) -> int:
        """Flows currently streaming (past their latency, not finished)."""
        return len(self._flows)

    async def transfer(self, links: Sequence[Link], nbytes: float, latency_s: float = 0.0) -> float:
        """Move ``nbytes`` over ``links`` after ``latency_s``; return the seconds it took."""
        if not nbytes >= 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
        if not latency_s >= 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s!r}")
        for link in links:
            if link.fabric is not self:
                raise ValueError(f"link {link.name!r} belongs to another fabric")
        loop = asyncio.get_running_loop()
        start = loop.time()
        if latency_s > 0:
            await asyncio.sleep(latency_s)
        if nbytes == 0 or not links:
            return loop.time() - start
        self._bind(loop)
        flow = _Flow(
            links=tuple(links),
            nbytes=float(nbytes),
            future=loop.create_future(),
            remaining=float(nbytes),
        )
        self._advance(loop.time())
        self._flows.append(flow)
        self._reschedule(loop)
        try:
            await flow.future
        except asyncio.CancelledError:
            if flow in self._flows:
                self._advance(loop.time())
                self._flows.remove(flow)
                self._reschedule(loop)
            raise
        return loop.time() - start

    # --- internals ---------------------------------------------------------------------

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is loop:
            return
        if self._flows:
            raise RuntimeError("a Fabric with active transfers cannot be used from another loop")
        self._loop = loop
        self._last_update = loop.time()

    def _advance(self, now: float) -> None:
        """Drain every flow at its current rate up to ``now``."""
        elapsed = now - self._last_update
        if elapsed > 0:
            for flow in self._flows:
                flow.remaining -= flow.rate * elapsed
        self._last_update = now

    def _assign_rates(self) -> None:
        """Max-min fair rates by progressive filling over the links in use."""
        capacity: dict[Link, float] = {}
        users: dict[Link, list[_Flow]] = {}
        for flow in self._flows:
            for link in flow.links:
                capacity[link] = link.bandwidth_Bps
                users.setdefault(link, []).append(flow)
        unfixed = set(self._flows)
        while unfixed:
            # Fair share each link could still give each of its unfixed flows.
            shares = {}
            for link, flows in users.items():
                waiting = sum(f in unfixed for f in flows)
                if waiting:
                    shares[link] = capacity[link] / waiting
            share = min(shares.values())
            saturated = [link for link, s in shares.items() if s <= share * (1 + 1e-12)]
            for link in saturated:
                for flow in users[link]:
                    if flow in unfixed:
                        flow.rate = share
                        unfixed.discard(flow)
                        for other in flow.links:
                            capacity[other] = max(capacity[other] - share, 0.0)

    def _reschedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._targets = []
        if not self._flows:
            return
        self._assign_rates()
        finish = [
            (flow.remaining / flow.rate if flow.rate > 0 else math.inf, flow)
            for flow in self._flows
        ]
        soonest = min(t for t, _ in finish)
        self._targets = [f for t, f in finish if t <= soonest + COMPLETION_TOLERANCE_S]
        self._timer = loop.call_at(self._last_update + max(soonest, 0.0), self._on_timer, loop)

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._advance(loop.time())
        # Rates did not change since the timer was set, so its targets finish now exactly;
        # others finish too if only rounding separates them from done.
        done = [
            flow
            for flow in self._flows
            if flow in self._targets or flow.remaining <= flow.rate * COMPLETION_TOLERANCE_S
        ]
        for flow in done:
            self._flows.remove(flow)
            flow.remaining = 0.0
            if not flow.future.done():
                flow.future.set_result(None)
        self._reschedule(loop)


class Link:
    """A shared link of ``bandwidth_Bps`` bytes/s and ``latency_s`` start-up latency."""

    __slots__ = ("bandwidth_Bps", "latency_s", "name", "fabric")

    def __init__(
        self,
        bandwidth_Bps: float,
        latency_s: float = 0.0,
        name: str = "link",
        fabric: Fabric | None = None,
    ) -> None:
        if not bandwidth_Bps > 0:
            raise ValueError(f"link {name!r}: bandwidth_Bps must be > 0, got {bandwidth_Bps!r}")
        if not latency_s >= 0:
            raise ValueError(f"link {name!r}: latency_s must be >= 0, got {latency_s!r}")
        self.bandwidth_Bps = float(bandwidth_Bps)
        self.latency_s = float(latency_s)
        self.name = name
        self.fabric = fabric if fabric is not None else Fabric()

    def __repr__(self) -> str:
        return f"Link({self.name!r}, {self.bandwidth_Bps:.4g} B/s, {self.latency_s:.3g} s)"

    async def transfer(self, nbytes: float) -> float:
        """Send ``nbytes`` over this link alone; return seconds from call to completion."""
        return await self.fabric.transfer((self,), nbytes, self.latency_s)


class Network:
    """GPUs on nodes: NVLink inside a node, NICs (per GPU or per node) between nodes.

    GPUs are numbered globally; GPU g sits on node g // gpus_per_node. Every GPU has an
    NVLink egress and ingress link; every NIC a send and a receive link.
    """

    def __init__(
        self,
        num_nodes: int,
        gpus_per_node: int,
        nvlink_Bps: float,
        network_Bps: float,
        *,
        nic_per_gpu: bool = True,
        nvlink_latency_s: float = NVLINK_LATENCY_S,
        network_latency_s: float = NETWORK_LATENCY_S,
    ) -> None:
        if num_nodes < 1 or gpus_per_node < 1:
            raise ValueError(
                f"num_nodes and gpus_per_node must be >= 1, got {num_nodes}, {gpus_per_node}"
            )
        self.num_nodes = num_nodes
        self.gpus_per_node = gpus_per_node
        self.nic_per_gpu = nic_per_gpu
        self.fabric = Fabric()
        num_gpus = num_nodes * gpus_per_node
        self._nvlink_out = [
            Link(nvlink_Bps, nvlink_latency_s, f"gpu{g}.nvlink.out", self.fabric)
            for g in range(num_gpus)
        ]
        self._nvlink_in = [
            Link(nvlink_Bps, nvlink_latency_s, f"gpu{g}.nvlink.in", self.fabric)
            for g in range(num_gpus)
        ]
        nics = num_gpus if nic_per_gpu else num_nodes
        nic_Bps = network_Bps if nic_per_gpu else network_Bps * gpus_per_node
        label = "gpu" if nic_per_gpu else "node"
        self._nic_out = [
            Link(nic_Bps, network_latency_s, f"{label}{i}.nic.out", self.fabric)
            for i in range(nics)
        ]
        self._nic_in = [
            Link(nic_Bps, network_latency_s, f"{label}{i}.nic.in", self.fabric) for i in range(nics)
        ]

    @classmethod
    def for_gpu(cls, gpu: GPUSpec, num_nodes: int, *, nic_per_gpu: bool = True) -> Network:
        """A network of ``num_nodes`` nodes of ``gpu``; ``network_bandwidth_Bps`` is per GPU
        (pooled into one NIC per node when ``nic_per_gpu`` is False)."""
        return cls(
            num_nodes,
            gpu.gpus_per_node,
            gpu.nvlink_bandwidth_Bps,
            gpu.network_bandwidth_Bps,
            nic_per_gpu=nic_per_gpu,
        )

    @property
    def num_gpus(self) -> int:
        """GPUs in the network."""
        return self.num_nodes * self.gpus_per_node

    def node_of(self, gpu: int) -> int:
        """The node holding global GPU index ``gpu``."""
        if not 0 <= gpu < self.num_gpus:
            raise ValueError(f"GPU index {gpu} out of range 0..{self.num_gpus - 1}")
        return gpu // self.gpus_per_node

    def path(self, src_gpu: int, dst_gpu: int) -> tuple[Link, ...]:
        """Links a copy from ``src_gpu`` to ``dst_gpu`` streams over (empty if the same GPU)."""
        src_node, dst_node = self.node_of(src_gpu), self.node_of(dst_gpu)
        if src_gpu == dst_gpu:
            return ()
        if src_node == dst_node:
            return (self._nvlink_out[src_gpu], self._nvlink_in[dst_gpu])
        if self.nic_per_gpu:
            return (self._nic_out[src_gpu], self._nic_in[dst_gpu])
        return (self._nic_out[src_node], self._nic_in[dst_node])

    async def transfer(
        self, src_gpus: Sequence[int], dst_gpus: Sequence[int], nbytes: float
    ) -> float:
        """Move ``nbytes`` from one worker's GPUs to another's; return the seconds it took.

        The bytes are split evenly over rank pairs (src[i % S] -> dst[i % D] for
        i < max(S, D)), as TP shards travel rank to rank, and the pairs run concurrently.
        """
        if not src_gpus or not dst_gpus:
            raise ValueError("src_gpus and dst_gpus must each name at least one GPU")
        loop = asyncio.get_running_loop()
        start = loop.time()
        pairs = max(len(src_gpus), len(dst_gpus))
        share = nbytes / pairs
        jobs = []
        for i in range(pairs):
            links = self.path(src_gpus[i % len(src_gpus)], dst_gpus[i % len(dst_gpus)])
            latency = max((link.latency_s for link in links), default=0.0)
            jobs.append(self.fabric.transfer(links, share, latency))
        await asyncio.gather(*jobs)
        return loop.time() - start
