"""A plain per-block prefix cache, written for reading, not speed, and random use of a
block manager the way the scheduler uses one: the reference that ``BlockManager``
(tests/engine/test_block_manager_reference.py) and the simulator's ``RunBlockManager``
(tests/sim/test_prefix_runs.py) are checked against after every operation."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from hypothesis import strategies as st

from pearl.engine.block_manager import NO_HASH, OutOfBlocks
from pearl.engine.sequence import Request, Sequence
from pearl.token_runs import _POOLS, LITERAL, TokenRuns, block_keys

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
    """Whether block key ``key`` (inside one run) is the walk right after ``before``'s last
    piece (``before`` inside one run: the whole block; else its pieces' last)."""
    if before is None or len(key) != 2:
        return False
    pool, position, n = (*before, block_size) if len(before) == 2 else before[-3:]
    return pool == key[0] and pool != LITERAL and (position + n) % len(_POOLS[pool]) == key[1]


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

    def truncate(self, seq: Sequence, keep: int) -> None:
        self.free(seq.block_table[keep:])
        del seq.block_table[keep:]
        seq.num_hashed_blocks = min(seq.num_hashed_blocks, keep)

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


def drive(fast, plain: PlainBlockManager, ops, block_size: int, runs: bool, same: Callable) -> None:
    """Apply ``ops`` (``OPS``) to both managers alike; ``same(fast, plain, live)`` after each."""
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
            same(fast, plain, live)
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
                m.truncate(s, keep)
                del s.token_ids[keep * block_size :]
                s.num_computed_tokens = keep * block_size
        elif op == "release":
            fast.release(f)
            plain.release(p)
            live.pop(k)
        same(fast, plain, live)
