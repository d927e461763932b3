from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.engine.block_manager import BlockManager, OutOfBlocks
from pearl.engine.sequence import Request, Sequence


def make_seq(tokens, rid="r"):
    return Sequence(Request(rid, list(tokens)), 0, 0.0)


def compute_all(bm, seq):
    bm.allocate(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.commit(seq)


def test_full_blocks_are_reused_by_a_later_prompt_with_the_same_prefix():
    bm = BlockManager(num_blocks=16, block_size=4)
    first = make_seq(range(10))
    compute_all(bm, first)
    bm.release(first)
    second = make_seq(list(range(10)) + [50, 51])
    hit = bm.attach_prefix(second)
    assert hit == 8  # two full blocks; the partial third is not cached
    bm.check_invariants([second.block_table])


def test_whole_prompt_hit_still_leaves_the_last_token_to_compute():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq(range(8))
    compute_all(bm, a)
    b = make_seq(range(8), "b")
    assert bm.attach_prefix(b) == 4  # block 2 would cover the last token, so it is recomputed
    assert bm.ref_count(b.block_table[0]) == 2


def test_prefix_must_match_token_ids_not_only_position():
    bm = BlockManager(num_blocks=16, block_size=4)
    compute_all(bm, make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    other = make_seq([1, 2, 3, 4, 9, 9, 9, 9, 9], "o")
    assert bm.attach_prefix(other) == 4


def test_a_hash_collision_never_attaches_wrong_kv_unless_verification_is_off(monkeypatch):
    """The engine compares a hit's token ids; the simulator (``verify_tokens=False``, its KV
    is not real) trusts the chain hash and keeps no ids."""
    import pearl.engine.block_manager as bmod

    for verify in (True, False):
        bm = BlockManager(num_blocks=16, block_size=4, verify_tokens=verify)
        compute_all(bm, make_seq([1, 2, 3, 4, 5]))
        assert bm._tokens[0] == ((1, 2, 3, 4) if verify else ())
        # A different block that hashes the same (forced): refused only when verified.
        collide = {(bmod.NO_HASH, (1, 2, 3, 4)), (bmod.NO_HASH, (7, 7, 7, 7))}
        monkeypatch.setattr(
            bmod,
            "chain_hash",
            lambda prev, t, collide=collide: (
                42 if (prev, tuple(t)) in collide else hash((prev, tuple(t)))
            ),
        )
        monkeypatch.setattr(bm, "_by_hash", {42: 0})
        assert len(bm.match_prefix([7, 7, 7, 7, 9], 4)) == (0 if verify else 1)
        monkeypatch.undo()


def test_lru_eviction_takes_unreferenced_cached_blocks_only_when_free_blocks_run_out():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq([1, 2, 3, 4, 5])
    compute_all(bm, a)  # 3 blocks, 2 full and cached
    bm.release(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    b = make_seq([9, 9], "b")
    bm.allocate(b, 2)  # takes the never-cached free block first
    assert bm.num_cached_blocks == 2
    c = make_seq([7, 7, 7, 7, 7, 7], "c")
    bm.allocate(c, 6)  # one free block, then both cached blocks are evicted
    assert bm.num_cached_blocks == 0
    d = make_seq([1, 2, 3, 4, 5], "d")
    assert bm.attach_prefix(d) == 0
    try:
        bm.allocate(d, 5)
        raise AssertionError("expected OutOfBlocks")
    except OutOfBlocks:
        assert d.block_table == []  # nothing taken on failure
    bm.check_invariants([b.block_table, c.block_table])


def test_reset_prefix_cache_forgets_everything():
    bm = BlockManager(num_blocks=8, block_size=2)
    a = make_seq([1, 2, 3, 4])
    compute_all(bm, a)
    bm.release(a)
    bm.reset_prefix_cache()
    assert bm.attach_prefix(make_seq([1, 2, 3, 4, 5], "x")) == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["alloc", "release"]),
            st.lists(st.integers(0, 3), min_size=1, max_size=12),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_reference_counts_stay_consistent_under_random_use(ops):
    bm = BlockManager(num_blocks=12, block_size=3)
    live: list[Sequence] = []
    for i, (op, tokens) in enumerate(ops):
        if op == "alloc":
            seq = make_seq(tokens, f"s{i}")
            bm.attach_prefix(seq)
            try:
                bm.allocate(seq, seq.num_tokens)
            except OutOfBlocks:
                bm.release(seq)
                continue
            seq.num_computed_tokens = seq.num_tokens
            bm.commit(seq)
            live.append(seq)
        elif live:
            bm.release(live.pop(0))
        bm.check_invariants([s.block_table for s in live])


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["alloc", "alloc", "release"]),
            st.lists(st.integers(0, 2), min_size=1, max_size=10),
        ),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from([0, 1024]),
)
def test_eviction_takes_the_least_recently_freed_cached_block_first(ops, slack):
    """The LRU queue keeps stale entries when a hit takes a cached block back and compacts
    them away (``slack`` 0: after every release); either way the evictable blocks are
    ordered by when each was last freed, and evictions take the oldest."""
    bm = BlockManager(num_blocks=10, block_size=2)
    bm.LRU_SLACK = slack
    live: list[Sequence] = []
    freed_at: dict[int, int] = {}  # evictable block -> when it last became evictable
    clock = 0

    def release(seq: Sequence) -> None:
        nonlocal clock
        table = list(seq.block_table)
        bm.release(seq)
        for b in reversed(table):  # the tail is freed first
            if bm.ref_count(b) == 0 and b in bm._by_hash.values():
                clock += 1
                freed_at[b] = clock

    for i, (op, tokens) in enumerate(ops):
        if op == "alloc":
            seq = make_seq(tokens, f"s{i}")
            bm.attach_prefix(seq)
            for b in seq.block_table:
                freed_at.pop(b, None)  # taken back by a hit
            oldest_first = sorted(freed_at, key=freed_at.__getitem__)
            hits = len(seq.block_table)
            try:
                bm.allocate(seq, seq.num_tokens)
            except OutOfBlocks:
                release(seq)  # its hits are evictable again, freed now
            else:
                seq.num_computed_tokens = seq.num_tokens
                bm.commit(seq)
                live.append(seq)
                evicted = [b for b in seq.block_table[hits:] if b in freed_at]
                assert evicted == oldest_first[: len(evicted)]
                for b in evicted:
                    del freed_at[b]
        elif live:
            release(live.pop(0))
        assert bm._evictable_in_lru_order() == sorted(freed_at, key=freed_at.__getitem__)
        bm.check_invariants([s.block_table for s in live])
