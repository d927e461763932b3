"""KV moves in the simulated world: exported between the prefill worker's iterations, sent
over the cluster's network (links shared fairly), imported on the decode worker."""

from __future__ import annotations

import asyncio

from pearl.sim.costmodel import CostModel
from pearl.sim.network import Network


class SimKVMover:
    """Moves simulated KV: exported at the prefill worker's next iteration boundary, sent
    over the network, imported on the decode worker."""

    def __init__(self, network: Network, cost: CostModel, gpus_of: dict[str, list[int]]) -> None:
        self.network = network
        self.cost = cost
        self.gpus_of = gpus_of
        self.bytes_moved = 0
        self.transfers = 0

    async def move(self, src, dst, session_id, token_ids, start, end):
        if end <= start:
            return 0, 0.0
        nbytes = self.cost.kv_bytes(end - start)
        clock = asyncio.get_running_loop()
        t0 = clock.time()
        cacheable, kv_version = await src.export_kv(session_id, start, end)
        weights = src.weight_version  # the sender's, when the export was taken
        dst.kv_transfer_started()
        try:
            await self.network.transfer(
                self.gpus_of[src.worker_id], self.gpus_of[dst.worker_id], nbytes
            )
        finally:
            dst.kv_transfer_finished()
        await dst.import_kv(session_id, token_ids, start, end, cacheable, kv_version, weights)
        self.bytes_moved += nbytes
        self.transfers += 1
        # From the export's start to the import's end, as a live mover measures it.
        return nbytes, clock.time() - t0
