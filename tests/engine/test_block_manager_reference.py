"""The block manager against a plain reference written for reading, not speed.

``BlockManager`` takes bulk shortcuts on its hot paths (eviction without per-entry checks
when the LRU queue holds no stale entries, an owner flag per block, a queue with lazy
deletion instead of an ordered dict). ``PlainBlockManager`` (tests/plain_blocks.py) states the same cache
with none of them: per block, one dict or set operation at a time. Random interleavings of
what the scheduler does (admit with a prefix hit, grow, compute in chunks and commit, cut a
session's tail, release, flush) must leave both in the same state after every operation:
the same block ids in every table, the same free count, the same cached hashes and the same
eviction order. A different implementation of the cache (say, by runs instead of blocks)
can be checked against the same reference.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from plain_blocks import OPS, PlainBlockManager, drive

from pearl.engine.block_manager import BlockManager


@settings(max_examples=300, deadline=None)
@given(
    ops=OPS,
    num_blocks=st.integers(3, 14),
    block_size=st.sampled_from([1, 2, 3]),
    verify_tokens=st.booleans(),
    runs=st.booleans(),
)
def test_the_block_manager_keeps_the_plain_references_state_under_random_use(
    ops, num_blocks, block_size, verify_tokens, runs
):
    fast = BlockManager(num_blocks, block_size, verify_tokens=verify_tokens)
    fast.LRU_SLACK = 2  # compact often: both queue forms get used
    drive(fast, PlainBlockManager(num_blocks, block_size), ops, block_size, runs, _same)


def _same(fast: BlockManager, plain: PlainBlockManager, live) -> None:
    for f, p in live:
        assert f.block_table == p.block_table
        assert (f.num_hashed_blocks, f.num_computed_tokens) == (
            p.num_hashed_blocks,
            p.num_computed_tokens,
        )
    assert fast.num_free_blocks == plain.num_free_blocks
    assert fast._by_hash == plain.by_hash
    assert fast._hash == plain.hash
    assert fast._evictable_in_lru_order() == list(plain.lru)
    assert fast._free == plain.free_stack
    assert (fast.cache_hits, fast.cache_queries) == (plain.cache_hits, plain.cache_queries)
    fast.check_invariants([f.block_table for f, _ in live])
