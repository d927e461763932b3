"""The simulator's block manager by runs against the plain per-block reference.

``RunBlockManager`` keeps the prefix cache as pieces (ranges of consecutive identities)
and tables without block ids; every observable of ``BlockManager`` must be the same after
every operation of random use: each table's length, hashed and computed blocks, the free
count, the cached identities, the order they would be evicted in, hits.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plain_blocks import OPS, PlainBlockManager, as_runs, drive

from pearl.engine.block_manager import OutOfBlocks
from pearl.engine.sequence import Request, Sequence
from pearl.sim import prefix_runs
from pearl.sim.prefix_runs import RunBlockManager


def _same(fast: RunBlockManager, plain: PlainBlockManager, live) -> None:
    for f, p in live:
        assert len(f.block_table) == len(p.block_table)
        assert (f.num_hashed_blocks, f.num_computed_tokens) == (
            p.num_hashed_blocks,
            p.num_computed_tokens,
        )
    assert fast.num_free_blocks == plain.num_free_blocks
    assert fast.num_cached_blocks == len(plain.by_hash)
    assert fast.cached_identities() == set(plain.by_hash)
    assert fast.evictable_in_lru_order() == [plain.hash[b] for b in plain.lru]
    assert (fast.cache_hits, fast.cache_queries) == (plain.cache_hits, plain.cache_queries)
    fast.check_invariants([f.block_table for f, _ in live])


@settings(max_examples=400, deadline=None)
@given(
    ops=OPS,
    num_blocks=st.integers(3, 14),
    block_size=st.sampled_from([1, 2, 3]),
    runs=st.booleans(),
)
def test_the_run_block_manager_keeps_the_plain_references_state_under_random_use(
    ops, num_blocks, block_size, runs
):
    fast = RunBlockManager(num_blocks, block_size)
    drive(fast, PlainBlockManager(num_blocks, block_size), ops, block_size, runs, _same)


def _seq(letters: list[int], i: int = 0) -> Sequence:
    return Sequence(Request(f"r{i}", as_runs(letters)), 0, 0.0)


def test_a_freed_context_is_evicted_from_its_tail_and_served_from_its_head():
    m = RunBlockManager(num_blocks=6, block_size=2)
    a = _seq([0, 1, 0, 1, 0, 1, 2])  # one walk for 6 blocks, then another
    m.allocate(a, 12)
    a.num_computed_tokens = 12
    m.commit(a)
    assert m.num_cached_blocks == 6 and m.num_free_blocks == 0
    m.release(a)
    assert m.num_free_blocks == 6
    order = m.evictable_in_lru_order()
    other = _seq([2], 1)
    m.allocate(other, 4)  # two blocks: the context's last two go
    assert m.cached_identities() == set(order[2:])
    b = _seq([0, 1, 0, 1, 0, 1, 2], 2)
    assert m.attach_prefix(b) == 8  # its first four blocks are still cached
    m.check_invariants([b.block_table, other.block_table])


def test_a_chain_starting_inside_another_chains_run_is_a_miss(monkeypatch):
    """Only a 64-bit collision gives a chain's first block an identity inside another
    chain's run; the per-block cache would attach that chain's KV, this one misses."""
    m = RunBlockManager(num_blocks=8, block_size=1)
    identities = {"a": [(100, 5)], "b": [(102, 3)]}
    which = {"now": "a"}

    def fake_runs(token_ids, first, last, block_size, prev):
        return identities[which["now"]] if last > first else []

    monkeypatch.setattr(prefix_runs, "_hash_runs", fake_runs)
    a = _seq([0, 1, 0], 0)  # 6 tokens: 5 full blocks before the last token
    m.allocate(a, 5)
    a.num_computed_tokens = 5
    m.commit(a)
    m.release(a)
    assert m.evictable_in_lru_order() == [104, 103, 102, 101, 100]
    which["now"] = "b"
    b = _seq([0, 1], 1)
    assert m.attach_prefix(b) == 0
    m.check_invariants([b.block_table])
    m.allocate(b, 4)  # 3 free blocks, then the run's last one
    assert m.cached_identities() == {100, 101, 102, 103}
    with pytest.raises(OutOfBlocks):
        m.allocate(_seq([3], 3), 5)


def test_a_duplicates_next_block_inside_the_piece_it_copies_is_a_duplicate_too():
    """Two siblings computing one prompt: the later one's blocks copy the earlier one's
    (private duplicates); its next commit starts inside the other's piece, which the cache
    finds by looking back from the block."""
    ops = [
        ("admit", [0, 1, 2], 1),  # A computes block 0
        ("admit", [0, 1, 2], 1),  # B hits it and computes block 1
        ("compute", 1, 3),  # B: blocks 2-4 (its piece from block 1 goes on to block 3)
        ("compute", 0, 1),  # A: block 1, a duplicate of B's
        ("compute", 0, 1),  # A: block 2, inside B's piece
        ("release", 1, 0),
        ("compute", 0, 3),
    ]
    fast = RunBlockManager(10, 1)
    drive(fast, PlainBlockManager(10, 1), ops, 1, True, _same)
    assert fast.num_cached_blocks == 6  # the prompt's blocks 0-5, each once


def test_a_commit_running_into_a_cached_continuation_keeps_it_and_stays_private_there():
    """A sibling's duplicate prefix is freed (private) while the prefix it copied is evicted
    first, so the continuation it computed stays cached without its prefix; a later request
    computing the whole prompt owns the prefix again and duplicates the continuation."""
    ops = [
        ("admit", [0, 1, 2], 1),  # A: 1 token (block 0 not full yet)
        ("admit", [0, 1, 2], 1),  # B: the same
        ("compute", 0, 1),  # A commits block 0
        ("compute", 1, 3),  # B: block 0 a duplicate, block 1 its own
        ("release", 0, 0),  # A: block 0 evictable
        ("release", 0, 0),  # B: block 1 evictable after it; its duplicate free
        ("admit", [2, 3], 4),  # C takes the free block and evicts block 0
        ("release", 0, 0),
        ("admit", [0, 1, 2], 4),  # D: block 0 anew, block 1 still cached (B's)
    ]
    fast = RunBlockManager(3, 2)
    drive(fast, PlainBlockManager(3, 2), ops, 2, True, _same)


def test_the_run_block_manager_keeps_the_plain_references_state_under_seeded_random_use():
    """Many more plain random interleavings than the hypothesis test's (which shrinks well
    but rarely reaches siblings committing one prompt in turns): ~2,000 of them, seeded."""
    rng = random.Random(0)
    for _ in range(2000):
        ops = []
        for _ in range(rng.randint(1, 60)):
            op = rng.choice(["admit", "admit", "compute", "compute", "compute", "grow", "cut"])
            op = rng.choice([op, op, op, op, op, op, "release", "flush"])
            if op == "admit":
                letters = [rng.randint(0, 2) for _ in range(rng.randint(1, 14))]
                ops.append((op, letters, rng.randint(1, 14)))
            elif op == "grow":
                ops.append((op, rng.randint(0, 7), [rng.randint(0, 3) for _ in range(6)]))
            elif op == "cut":
                ops.append((op, rng.randint(0, 7), rng.randint(0, 12)))
            else:
                ops.append((op, rng.randint(0, 7), rng.randint(1, 6)))
        num_blocks, block_size = rng.randint(3, 14), rng.choice([1, 2, 3])
        fast = RunBlockManager(num_blocks, block_size)
        plain = PlainBlockManager(num_blocks, block_size)
        drive(fast, plain, ops, block_size, rng.random() < 0.7, _same)
