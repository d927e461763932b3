"""Shared links with processor sharing / max-min fairness, in virtual time (pearl.sim.network)."""

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.sim.clock import run_virtual
from pearl.sim.hardware import H800
from pearl.sim.network import Fabric, Link, Network

GB = 1e9


async def _at(delay, coro):
    await asyncio.sleep(delay)
    return await coro


def test_one_transfer_takes_latency_plus_bytes_over_bandwidth():
    link = Link(10 * GB, latency_s=0.002)

    async def main():
        return await link.transfer(5 * GB)

    duration, end = run_virtual(main)
    assert duration == pytest.approx(0.502, rel=1e-12)
    assert end == pytest.approx(0.502, rel=1e-12)
    assert link.fabric.active_flows == 0


@pytest.mark.parametrize("latency", [0.0, 0.01])
def test_two_concurrent_equal_transfers_each_take_twice_as_long(latency):
    link = Link(10 * GB, latency_s=latency)

    async def main():
        return await asyncio.gather(link.transfer(5 * GB), link.transfer(5 * GB))

    durations, _ = run_virtual(main)
    assert durations == pytest.approx([latency + 1.0, latency + 1.0], rel=1e-12)


def test_late_starter_slows_the_first_exactly_as_the_fluid_model_predicts():
    bandwidth, first, second, start = 4 * GB, 8 * GB, 6 * GB, 1.0
    link = Link(bandwidth)

    async def main():
        return await asyncio.gather(link.transfer(first), _at(start, link.transfer(second)))

    (d_first, d_second), _ = run_virtual(main)
    # Alone until t=1 (4 GB done, 4 GB left); then half rate each: the first's 4 GB take
    # 2 s at 2 GB/s -> done at t=3, by when the second has sent 4 of its 6 GB; its last
    # 2 GB run alone at 4 GB/s -> done at t=3.5.
    left = first - bandwidth * start
    t_first = start + left / (bandwidth / 2)
    t_second = t_first + (second - left) / bandwidth
    assert d_first == pytest.approx(t_first, rel=1e-12)
    assert d_second == pytest.approx(t_second - start, rel=1e-12)
    assert (d_first, d_second) == pytest.approx((3.0, 2.5))


def test_zero_bytes_cost_only_latency_and_negative_sizes_are_rejected():
    link = Link(GB, latency_s=0.25)

    async def main():
        zero = await link.transfer(0)
        with pytest.raises(ValueError, match="nbytes"):
            await link.transfer(-1)
        return zero

    assert run_virtual(main)[0] == 0.25
    with pytest.raises(ValueError, match="bandwidth_Bps"):
        Link(0.0)


def test_cancelled_transfer_releases_its_share():
    link = Link(GB)

    async def main():
        loop = asyncio.get_running_loop()
        victim = asyncio.ensure_future(link.transfer(10 * GB))
        survivor = asyncio.ensure_future(link.transfer(2 * GB))
        await asyncio.sleep(1.0)  # both at 0.5 GB/s: survivor has 1.5 GB left
        victim.cancel()
        duration = await survivor
        with pytest.raises(asyncio.CancelledError):
            await victim
        return duration, loop.time()

    (duration, end), _ = run_virtual(main)
    assert duration == pytest.approx(2.5, rel=1e-12) and end == pytest.approx(2.5)


def test_max_min_fairness_gives_the_unused_share_to_the_others():
    fabric = Fabric()
    narrow = Link(1 * GB, name="narrow", fabric=fabric)
    wide = Link(10 * GB, name="wide", fabric=fabric)

    async def main():
        # x is capped at 1 GB/s by the narrow link; y gets the remaining 9 GB/s of the wide.
        return await asyncio.gather(
            fabric.transfer((narrow, wide), 1 * GB), fabric.transfer((wide,), 9 * GB)
        )

    (d_x, d_y), _ = run_virtual(main)
    assert d_x == pytest.approx(1.0, rel=1e-12) and d_y == pytest.approx(1.0, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.01, 4.0)), min_size=1, max_size=12))
def test_processor_sharing_is_work_conserving(jobs):
    """Any work-conserving discipline ends its busy periods when FIFO would."""
    bandwidth = 2 * GB
    link = Link(bandwidth)

    async def main():
        loop = asyncio.get_running_loop()
        ends = []

        async def job(arrival, gigabytes):
            await asyncio.sleep(arrival)
            await link.transfer(gigabytes * GB)
            ends.append(loop.time())

        await asyncio.gather(*(job(a, g) for a, g in jobs))
        return max(ends)

    last, _ = run_virtual(main)
    busy_until = 0.0
    for arrival, gigabytes in sorted(jobs):
        busy_until = max(busy_until, arrival) + gigabytes * GB / bandwidth
    assert last == pytest.approx(busy_until, rel=1e-9)


def test_network_intra_node_is_faster_than_inter_node_and_nics_contend():
    network = Network.for_gpu(H800, num_nodes=2)
    assert network.node_of(7) == 0 and network.node_of(8) == 1
    assert network.path(3, 3) == ()

    def timed(*transfers):
        async def main():
            return await asyncio.gather(*(network.transfer(s, d, n) for s, d, n in transfers))

        return run_virtual(main)[0]

    kv = 2 * GB
    (intra,) = timed(([0, 1], [2, 3], kv))
    (inter,) = timed(([0, 1], [8, 9], kv))
    assert intra < inter / 5
    # TP2 -> TP2 across nodes: two rank pairs, each 1 GB over its own 12.5 GB/s NIC.
    assert inter == pytest.approx(network.path(0, 8)[0].latency_s + 1 * GB / 12.5e9, rel=1e-9)
    # Two senders into the same receiver GPU share its ingress NIC.
    (alone,) = timed(([0], [8], kv))
    together = timed(([0], [8], kv), ([1], [8], kv))
    assert together == pytest.approx([2 * alone, 2 * alone], rel=1e-3)
    # With one pooled NIC per node, distinct GPU pairs still share the node's NIC.
    pooled = Network.for_gpu(H800, num_nodes=2, nic_per_gpu=False)

    async def pooled_main():
        return await asyncio.gather(*(pooled.transfer([g], [8 + g], kv) for g in range(8)))

    durations, _ = run_virtual(pooled_main)
    node_Bps = 8 * H800.network_bandwidth_Bps
    assert max(durations) == pytest.approx(8 * kv / node_Bps, rel=1e-3)


def test_links_work_under_the_real_asyncio_loop_too():
    link = Link(1e6, latency_s=0.0)

    async def main():
        return await asyncio.gather(link.transfer(5_000), link.transfer(5_000))

    durations = asyncio.run(main())
    # Each takes ~10 ms of wall time (shared 1 MB/s link); a busy host adds scheduling slack.
    assert all(0.0099 <= d < 5.0 for d in durations)
