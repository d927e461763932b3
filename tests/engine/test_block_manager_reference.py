"""The block manager against a plain reference written for reading, not speed.

``BlockManager`` takes bulk shortcuts on its hot paths (eviction without per-entry checks
when the LRU queue holds no stale entries, an owner flag per block, a queue with lazy
deletion instead of an ordered dict). ``PlainBlockManager`` below states the same cache
with none of them: per block, one dict or set operation at a time. Random interleavings of
what the scheduler does (admit with a prefix hit, grow, compute in chunks and commit, cut a
session's tail, release, flush) must leave both in the same state after every operation:
the same block ids in every table, the same free count, the same cached hashes and the same
eviction order. A different implementation of the cache (say, by runs instead of blocks)
can be checked against the same reference.
"""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.engine.block_manager import NO_HASH, BlockManager, OutOfBlocks
from pearl.engine.sequence import Request, Sequence
from pearl.token_runs import _POOLS, TokenRuns, block_keys

VOCAB = 1000
# The simulator's contexts (TokenRuns) from the same small alphabet: each letter a walk of
# two ids, 0 then 1 one contiguous walk (one run), 2 elsewhere.
LETTERS = {0: 0, 1: 2, 2: 50, 3: 52}


def as_runs(letters: list[int]) -> TokenRuns:
    out = TokenRuns.empty(VOCAB)
    for letter in letters:
        out += TokenRuns.walk(VOCAB, 1, LETTERS[letter], 2)
    return out


def continues(before: tuple[int, ...] | None, key: tuple[int, ...], block_size: int) -> bool:
    """Whether block key ``key`` is the walk right after ``before`` (both inside one run)."""
    return (
        before is not None
        and len(before) == len(key) == 2
        and before[0] == key[0]
        and (before[1] + block_size) % len(_POOLS[key[0]]) == key[1]
    )


class PlainBlockManager:
    """The prefix cache's rules, one block at a time."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.hash = [NO_HASH] * num_blocks
        self.by_hash: dict[int, int] = {}  # hash -> the block that is the cache's copy
        self.free_stack = list(range(num_blocks - 1, -1, -1))  # top: the end
        self.lru: OrderedDict[int, None] = OrderedDict()  # evictable, least recently freed first
        self.cache_hits = self.cache_queries = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_stack) + len(self.lru)

    def _chain(self, token_ids, first: int, last: int, prev: int) -> list[int]:
        """Each block's identity: ``hash((previous, key))``; for runs, the previous plus one
        where the block's key continues the previous block's walk."""
        bs = self.block_size
        runs = isinstance(token_ids, TokenRuns)
        before = None
        if runs and first and prev != NO_HASH:
            before = block_keys(token_ids, first - 1, first, bs)[0]
        out = []
        for key in block_keys(token_ids, first, last, bs):
            prev = prev + 1 if runs and continues(before, key, bs) else hash((prev, key))
            before = key
            out.append(prev)
        return out

    def attach_prefix(self, seq: Sequence) -> int:
        hits = []
        for h in self._chain(seq.token_ids, 0, (seq.num_tokens - 1) // self.block_size, NO_HASH):
            if h not in self.by_hash:
                break
            hits.append(self.by_hash[h])
        for b in hits:
            if self.ref[b] == 0:
                del self.lru[b]
            self.ref[b] += 1
        seq.block_table = hits
        seq.num_hashed_blocks = len(hits)
        seq.num_computed_tokens = len(hits) * self.block_size
        self.cache_queries += seq.num_tokens
        self.cache_hits += seq.num_computed_tokens
        return seq.num_computed_tokens

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        need = -(-num_tokens // self.block_size) - len(seq.block_table)
        if need <= 0:
            return
        if need > self.num_free_blocks:
            raise OutOfBlocks
        for _ in range(need):
            if self.free_stack:
                b = self.free_stack.pop()
            else:
                b, _ = self.lru.popitem(last=False)
                del self.by_hash[self.hash[b]]
                self.hash[b] = NO_HASH
            self.ref[b] = 1
            seq.block_table.append(b)

    def commit(self, seq: Sequence) -> None:
        if not seq.cacheable:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        first = seq.num_hashed_blocks
        if full <= first:
            return
        prev = self.hash[seq.block_table[first - 1]] if first else NO_HASH
        chain = self._chain(seq.token_ids, first, full, prev)
        for b, h in zip(seq.block_table[first:full], chain, strict=True):
            if self.hash[b] == NO_HASH:
                self.hash[b] = h
                self.by_hash.setdefault(h, b)  # a duplicate stays private: the first wins
        seq.num_hashed_blocks = full

    def free(self, block_ids) -> None:
        for b in reversed(block_ids):  # the tail first
            self.ref[b] -= 1
            assert self.ref[b] >= 0
            if self.ref[b] == 0:
                if self.by_hash.get(self.hash[b]) == b:
                    self.lru[b] = None
                else:
                    self.hash[b] = NO_HASH
                    self.free_stack.append(b)

    def release(self, seq: Sequence) -> None:
        self.free(seq.block_table)
        seq.block_table = []
        seq.num_hashed_blocks = 0
        seq.num_computed_tokens = 0
        seq.cacheable = True
        seq.kv_version = None

    def reset_prefix_cache(self) -> None:
        self.free_stack.extend(self.lru)
        self.lru.clear()
        self.hash = [NO_HASH] * len(self.hash)
        self.by_hash.clear()


OPS = st.lists(
    st.one_of(
        # a request: its tokens (few distinct, so prefixes are shared), how many to compute
        # before the first commit (a sibling admitted meanwhile computes the same blocks)
        st.tuples(
            st.just("admit"),
            st.lists(st.integers(0, 2), min_size=1, max_size=14),
            st.integers(1, 14),
        ),
        st.tuples(st.just("compute"), st.integers(0, 7), st.integers(1, 6)),
        st.tuples(st.just("grow"), st.integers(0, 7), st.lists(st.integers(0, 3), max_size=6)),
        st.tuples(st.just("cut"), st.integers(0, 7), st.integers(0, 12)),
        st.tuples(st.just("release"), st.integers(0, 7), st.just(0)),
        st.tuples(st.just("flush"), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=60,
)


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
    plain = PlainBlockManager(num_blocks, block_size)
    live: list[tuple[Sequence, Sequence]] = []  # (the fast one's, the plain one's)

    for i, (op, a, b) in enumerate(ops):
        if op == "admit":
            prompt = as_runs(a) if runs else list(a)
            pair = (
                Sequence(Request(f"r{i}", prompt), 0, 0.0),
                Sequence(Request(f"r{i}", prompt), 0, 0.0),
            )
            fast.attach_prefix(pair[0])
            plain.attach_prefix(pair[1])
            live.append(pair)
            op, a = "compute", len(live) - 1  # and compute the first b tokens
        if not live or op == "flush":
            if op == "flush":  # new weights (Scheduler.invalidate_cached_kv)
                fast.reset_prefix_cache()
                plain.reset_prefix_cache()
                for f, p in live:  # they keep their KV but never register it again
                    f.cacheable = p.cacheable = False
            _same(fast, plain, live)
            continue
        k = a % len(live)
        f, p = live[k]
        if op == "compute":  # up to b more tokens: allocate, compute, commit
            end = min(f.num_tokens, f.num_computed_tokens + b)
            try:
                fast.allocate(f, end)
            except OutOfBlocks:
                try:
                    plain.allocate(p, end)
                except OutOfBlocks:
                    pass
                else:
                    raise AssertionError("the plain manager found blocks the fast one did not")
            else:
                plain.allocate(p, end)
                for s, m in ((f, fast), (p, plain)):
                    s.num_computed_tokens = end
                    m.commit(s)
        elif op == "grow":  # the next turn appends tokens (computed later)
            for s in (f, p):
                s.token_ids.extend(as_runs(b) if runs else b)
        elif op == "cut":  # a session's context edited: keep its first b blocks' worth
            keep = min(b, f.num_computed_tokens // block_size)
            for s, m in ((f, fast), (p, plain)):
                m.free(s.block_table[keep:])
                del s.block_table[keep:]
                s.num_hashed_blocks = min(s.num_hashed_blocks, keep)
                del s.token_ids[keep * block_size :]
                s.num_computed_tokens = keep * block_size
        elif op == "release":
            fast.release(f)
            plain.release(p)
            live.pop(k)
        _same(fast, plain, live)


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
