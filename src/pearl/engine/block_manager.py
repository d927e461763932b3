"""Paged KV block accounting with reference counts and a hash-chain prefix cache (pure Python).

A block holds ``block_size`` consecutive tokens of one sequence. A *full* block is
registered in the prefix cache under ``hash(previous block's hash, its token ids)``,
so a later request whose prompt starts with the same tokens (turn k+1 of a session,
a sibling in a GRPO group) reuses it. (The simulator's contexts, ``TokenRuns``, chain the
same way over their block keys, except that a block inside one run continuing its
predecessor's walk gets the predecessor's hash plus one: ``TokenRuns.block_hashes``; the
simulator keeps that cache by runs of such blocks: ``pearl.sim.prefix_runs``.) Blocks nobody references but
that are still cached stay in an LRU queue and are evicted only when free blocks run out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence as Seq
from typing import Protocol

from pearl.engine.sequence import Sequence
from pearl.token_runs import TokenRuns, block_keys

NO_HASH = -1


def chain_hash(previous: int, tokens: Seq[int]) -> int:
    """Hash of a full block given its predecessor's hash (deterministic across processes):
    ``tokens`` is the block's key (``pearl.token_runs.block_keys``: its ids, or its runs)."""
    return hash((previous, tuple(tokens)))


def block_hashes(
    token_ids: Seq[int],
    first: int,
    last: int,
    block_size: int,
    prev: int,
    keys: list[tuple[int, ...]] | None = None,
) -> list[int]:
    """Chained prefix-cache identities of full blocks ``first .. last - 1`` from ``prev``
    (block ``first - 1``'s, or ``NO_HASH``): ``chain_hash`` over the block keys (``keys``
    if the caller made them already), or, for ``TokenRuns``, ``TokenRuns.block_hashes``
    (a run's blocks as consecutive ints)."""
    if isinstance(token_ids, TokenRuns):
        return token_ids.block_hashes(first, last, block_size, prev, chained=prev != NO_HASH)
    out = []
    if keys is None:
        keys = block_keys(token_ids, first, last, block_size)
    for key in keys:
        prev = chain_hash(prev, key)
        out.append(prev)
    return out


class OutOfBlocks(Exception):
    """Not enough free or evictable blocks; the caller preempts or waits."""


class KVBlocks(Protocol):
    """What the scheduler uses of a block manager: ``BlockManager``, or the simulator's
    ``pearl.sim.prefix_runs.RunBlockManager`` (the same cache kept by runs of blocks)."""

    num_blocks: int
    block_size: int
    cache_hits: int
    cache_queries: int

    @property
    def num_free_blocks(self) -> int: ...

    @property
    def num_cached_blocks(self) -> int: ...

    def attach_prefix(self, seq: Sequence) -> int: ...

    def commit(self, seq: Sequence) -> None: ...

    def allocate(self, seq: Sequence, num_tokens: int) -> None: ...

    def truncate(self, seq: Sequence, keep: int) -> None: ...

    def release(self, seq: Sequence) -> None: ...

    def reset_prefix_cache(self) -> None: ...


class BlockAccounting(ABC):
    """What every block manager does to a sequence's own fields (``BlockManager`` and the
    simulator's ``RunBlockManager``); each keeps its own free count."""

    block_size: int
    cache_hits: int  # tokens served from the prefix cache
    cache_queries: int  # prompt tokens looked up

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks ``seq`` needs so that its table covers ``num_tokens`` tokens."""
        need = -(-num_tokens // self.block_size)
        return max(0, need - len(seq.block_table))

    @property
    @abstractmethod
    def num_free_blocks(self) -> int:
        """Blocks that an allocation can take now (free plus evictable)."""

    def _blocks_to_take(self, seq: Sequence, num_tokens: int) -> int:
        """The blocks ``allocate`` must add for ``num_tokens`` tokens (0: none); raises
        ``OutOfBlocks``, having changed nothing, if fewer are free or evictable."""
        need = self.blocks_needed(seq, num_tokens)
        if need > self.num_free_blocks:
            raise OutOfBlocks(f"need {need} blocks, {self.num_free_blocks} available")
        return need

    def _attached(self, seq: Sequence, table: list[int], blocks: int) -> int:
        """``seq`` starts from ``table``, its first ``blocks`` served from the prefix cache;
        returns their tokens."""
        seq.block_table = table
        seq.num_hashed_blocks = blocks
        seq.num_computed_tokens = blocks * self.block_size
        self.cache_queries += seq.num_tokens
        self.cache_hits += seq.num_computed_tokens
        return seq.num_computed_tokens

    @staticmethod
    def _forgotten(seq: Sequence) -> None:
        """``seq`` holds no KV any more (its blocks were freed)."""
        seq.block_table = []
        seq.num_hashed_blocks = 0
        seq.num_computed_tokens = 0
        seq.cacheable = True  # what it computes next, the current weights compute
        seq.kv_version = None


class BlockManager(BlockAccounting):
    """Allocates KV blocks to sequences; owns the prefix cache."""

    LRU_SLACK = 1024  # stale LRU entries tolerated beyond the evictable blocks' own

    def __init__(self, num_blocks: int, block_size: int, verify_tokens: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks ({num_blocks}) and block_size ({block_size}) must be >= 1"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Keep each cached block's token ids and compare them on a hit, so a hash collision
        # can never attach the wrong KV (the engine). The simulator, where KV is not real,
        # trusts the 64-bit chain hash and saves the ids' memory (~60% of its prefix cache).
        self.verify_tokens = verify_tokens
        # Per-block state in parallel lists (cheap to create for 10^5 blocks per worker).
        self._ref = [0] * num_blocks
        self._hash = [NO_HASH] * num_blocks
        self._tokens: list[tuple[int, ...]] = [()] * num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # never-cached blocks (stack)
        # Cached, unreferenced blocks ("evictable": reference count 0 and a hash), least
        # recently freed first. A block is queued each time it becomes evictable and not
        # removed when a hit takes it back, so the queue may hold stale entries: only a
        # block's last entry (``_queued`` counts them) while it is still evictable counts.
        # (An OrderedDict did this at ~150 bytes a block; this is ~8, over 10^6-10^7
        # blocks in a large simulated cluster.)
        self._lru: deque[int] = deque()
        self._queued = [0] * num_blocks
        self._num_evictable = 0
        self._by_hash: dict[int, int] = {}
        # 1 where the block is the cache's copy of its hash (``_by_hash[_hash[b]] == b``):
        # read per block when blocks are freed, where looking the hashes up was ~5% of a run.
        self._owned = bytearray(num_blocks)
        self.cache_hits = 0  # tokens served from the prefix cache
        self.cache_queries = 0  # prompt tokens looked up

    # -- capacity -----------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that an allocation can take now (free plus evictable)."""
        return len(self._free) + self._num_evictable

    @property
    def num_cached_blocks(self) -> int:
        return len(self._by_hash)

    # -- prefix cache ---------------------------------------------------------------
    def match_prefix(self, token_ids: Seq[int], max_tokens: int) -> list[int]:
        """Cached full blocks covering a prefix of ``token_ids`` no longer than ``max_tokens``."""
        n = max_tokens // self.block_size
        by_hash = self._by_hash
        found: list[int] = []
        if self.verify_tokens:
            keys = block_keys(token_ids, 0, n, self.block_size)
            hashes = block_hashes(token_ids, 0, n, self.block_size, NO_HASH, keys)
            for h, tokens in zip(hashes, keys, strict=True):
                block_id = by_hash.get(h)
                if block_id is None or self._tokens[block_id] != tokens:
                    break
                found.append(block_id)
            return found
        for h in block_hashes(token_ids, 0, n, self.block_size, NO_HASH):
            block_id = by_hash.get(h)
            if block_id is None:
                break
            found.append(block_id)
        return found

    def attach_prefix(self, seq: Sequence) -> int:
        """Give a fresh sequence the cached blocks of its longest cached prefix.

        At least the last token is left uncomputed so its logits can be sampled.
        Returns the number of tokens served from cache.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        hits = self.match_prefix(seq.token_ids, seq.num_tokens - 1)
        for block_id in hits:
            self._take(block_id)
        return self._attached(seq, hits, len(hits))

    def commit(self, seq: Sequence) -> None:
        """Register the blocks ``seq`` has completely computed in the prefix cache (none if
        its KV predates the current weights: ``Scheduler.invalidate_cached_kv``)."""
        if not seq.cacheable:
            return
        bs = self.block_size
        full = min(seq.num_computed_tokens // bs, len(seq.block_table))
        first = seq.num_hashed_blocks
        if full <= first:
            return  # no block filled since the last commit (most calls)
        table, hashes, by_hash, owned = seq.block_table, self._hash, self._by_hash, self._owned
        prev = hashes[table[first - 1]] if first else NO_HASH
        blocks = table[first:full]
        keys = None
        if self.verify_tokens:
            keys = block_keys(seq.token_ids, first, full, bs)
            for block_id, tokens in zip(blocks, keys, strict=True):
                if hashes[block_id] == NO_HASH:
                    self._tokens[block_id] = tokens
        # One plain loop (hot in the simulator: ~10^7 blocks a large run; measured faster
        # than building the chain and checking it in bulk).
        for block_id, h in zip(
            blocks, block_hashes(seq.token_ids, first, full, bs, prev, keys), strict=True
        ):
            if hashes[block_id] == NO_HASH:
                hashes[block_id] = h
                # A duplicate of an already cached block stays private; the first wins.
                if by_hash.setdefault(h, block_id) == block_id:
                    owned[block_id] = 1
        seq.num_hashed_blocks = full

    # -- allocation -----------------------------------------------------------------
    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow ``seq.block_table`` to cover ``num_tokens`` tokens, or raise ``OutOfBlocks``
        without changing anything."""
        need = self._blocks_to_take(seq, num_tokens)
        if need == 0:
            return
        table = seq.block_table
        free = self._free
        # In bulk (this is hot in the simulator): never-cached blocks first, top of the
        # stack first, then the least recently used evictable ones.
        take = min(need, len(free))
        if take:
            got = free[len(free) - take :]
            del free[len(free) - take :]
            got.reverse()
            ref = self._ref
            for block_id in got:
                ref[block_id] = 1
            table.extend(got)
        if need > take:
            table.extend(self._evict(need - take))

    def _evict(self, n: int) -> list[int]:
        """Take the ``n`` least recently freed evictable blocks out of the cache, each
        referenced once (for an allocation)."""
        lru, queued, ref, hashes = self._lru, self._queued, self._ref, self._hash
        popleft = lru.popleft
        if len(lru) == self._num_evictable:  # one entry per evictable block, none stale
            evicted = [popleft() for _ in range(n)]
        else:
            evicted = []
            while len(evicted) < n:
                for block_id in [popleft() for _ in range(n - len(evicted))]:
                    left = queued[block_id] - 1
                    queued[block_id] = left
                    if not left and not ref[block_id] and hashes[block_id] != NO_HASH:
                        evicted.append(block_id)  # its last entry, and still evictable
        by_hash, owned = self._by_hash, self._owned
        for block_id in evicted:  # each the cache's copy of its hash (it was queued)
            del by_hash[hashes[block_id]]
            hashes[block_id] = NO_HASH
            owned[block_id] = 0
            ref[block_id] = 1
            queued[block_id] = 0
        if self.verify_tokens:
            for block_id in evicted:
                self._tokens[block_id] = ()
        self._num_evictable -= n
        return evicted

    def free(self, block_ids: Seq[int]) -> None:
        """Drop one reference to each block; unreferenced cached blocks become evictable."""
        ref = self._ref
        unreferenced = []
        for block_id in reversed(block_ids):  # tail blocks are evicted before their prefix
            left = ref[block_id] - 1
            ref[block_id] = left
            if not left:
                unreferenced.append(block_id)
            elif left < 0:
                raise AssertionError(f"block {block_id} freed twice")
        # The cache's own copies queue for eviction; the others (never hashed, or a
        # duplicate of a cached block) are free. By list operations: this is hot.
        owned = self._owned
        cached = [b for b in unreferenced if owned[b]]
        if cached:
            self._lru.extend(cached)
            queued = self._queued
            for block_id in cached:
                queued[block_id] += 1
            self._num_evictable += len(cached)
        if len(cached) < len(unreferenced):
            private = [b for b in unreferenced if not owned[b]] if cached else unreferenced
            hashes = self._hash
            for block_id in private:  # hot after a flush, when nothing is cached
                hashes[block_id] = NO_HASH
            if self.verify_tokens:
                for block_id in private:
                    self._tokens[block_id] = ()
            self._free.extend(private)
        if len(self._lru) > 2 * self._num_evictable + self.LRU_SLACK:
            self._compact_lru()

    def truncate(self, seq: Sequence, keep: int) -> None:
        """Free ``seq``'s blocks after its first ``keep`` (the tail first)."""
        self.free(seq.block_table[keep:])
        del seq.block_table[keep:]
        seq.num_hashed_blocks = min(seq.num_hashed_blocks, keep)

    def release(self, seq: Sequence) -> None:
        """Free all of ``seq``'s blocks and forget its KV (``num_computed_tokens`` -> 0)."""
        self.free(seq.block_table)
        self._forgotten(seq)

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (new weights make cached KV stale)."""
        self._free.extend(self._evictable_in_lru_order())
        self._lru.clear()
        self._queued = [0] * self.num_blocks
        self._num_evictable = 0
        self._hash = [NO_HASH] * self.num_blocks
        self._tokens = [()] * self.num_blocks
        self._by_hash.clear()
        self._owned = bytearray(self.num_blocks)

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def _take(self, block_id: int) -> None:
        if self._ref[block_id] == 0:
            self._num_evictable -= 1  # a cached block nobody held: its queue entry goes stale
        self._ref[block_id] += 1

    def _evictable_in_lru_order(self) -> list[int]:
        """The evictable blocks, least recently freed first (each block's last live entry)."""
        if len(self._lru) == self._num_evictable:  # one entry per evictable block, none stale
            return list(self._lru)
        ref, hashes, seen = self._ref, self._hash, set()
        newest_first = []
        for block_id in reversed(self._lru):
            if block_id not in seen:
                seen.add(block_id)
                if not ref[block_id] and hashes[block_id] != NO_HASH:
                    newest_first.append(block_id)
        newest_first.reverse()
        assert len(newest_first) == self._num_evictable
        return newest_first

    def _compact_lru(self) -> None:
        """Drop the queue's stale entries (amortized: it at least halves)."""
        live = self._evictable_in_lru_order()
        queued = [0] * self.num_blocks
        for block_id in live:
            queued[block_id] = 1
        self._lru = deque(live)
        self._queued = queued

    def check_invariants(self, live_tables: list[list[int]]) -> None:
        """Assert reference counts equal the number of tables holding each block (tests)."""
        counts = [0] * self.num_blocks
        for table in live_tables:
            for block_id in table:
                counts[block_id] += 1
        for block_id, count in enumerate(counts):
            assert self._ref[block_id] == count, (block_id, self._ref[block_id], count)
        free, evictable = set(self._free), set(self._evictable_in_lru_order())
        assert not free & evictable
        # What eviction's shortcuts rely on: every evictable block is the cache's copy of
        # its hash, and the queue holds an entry for each (more only when some are stale).
        assert all(self._owned[b] for b in evictable)
        assert len(self._lru) >= self._num_evictable == len(evictable)
        assert all(self._hash[b] == NO_HASH for b in free)
        held = {b for b in range(self.num_blocks) if self._ref[b] > 0}
        assert held.isdisjoint(free | evictable)
        assert len(held) + len(free) + len(evictable) == self.num_blocks
        for b in range(self.num_blocks):
            h = self._hash[b]
            assert self._owned[b] == (h != NO_HASH and self._by_hash.get(h) == b), b
