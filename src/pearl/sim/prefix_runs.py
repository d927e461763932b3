"""The simulated engine's KV blocks and prefix cache, kept by runs of blocks (radix-style).

``pearl.engine.block_manager.BlockManager`` keeps state per block: a reference count, a
hash, a dict entry and an LRU entry each. A simulated SWE turn runs ~130 blocks through it
(the scaffold collapses an observation every turn, so the context after it is prefilled
again), ~1.5 us a block with a fleet's state spread over GBs. Here the same cache is kept
as *pieces*: ranges of consecutive prefix-cache identities (a run's blocks get consecutive
ones: ``TokenRuns.block_hash_runs``), each with one reference count and at most one LRU
entry, indexed by first identity. A sequence's table is a ``RunTable``: a
list with one placeholder per block (the scheduler takes its length) and the identity
ranges it holds. A turn costs a few operations per run, not per block.

Blocks have no ids here: nothing in the simulator reads them. Everything else is the block
manager's, exactly: free and evictable counts, which identities are cached, the order in
which they are evicted (least recently freed first; the blocks one ``free`` releases, the
table's tail first), hits, duplicates staying private. ``tests/sim/test_prefix_runs.py``
checks it against the plain per-block reference after every operation, and the simulator's
result digests are those of the per-block manager.

Why pieces suffice: a table holds whole pieces (a piece is split where a table's range
starts or ends inside it), so a piece's blocks share one reference count; they become
evictable in one ``free``, queued tail first, so they leave the cache tail first, and a
piece is evicted from its end (its first identity, the index key, stays until it empties).
Why a dict of first identities suffices: identities are a function of the blocks' contents
and prefixes, so an identity ``h`` inside a piece has ``h - 1`` in the same piece. A hit
walks a chain from its first block, so it meets every piece at its start; a commit meets
the pieces inside its new range at their starts, and its first block can fall inside a
piece only if the block before it is a duplicate (a sibling computed the same prefix
first): then, and only then, the cache looks back for the piece. (A chain's first identity
inside another chain's run would take a 64-bit collision: it is a miss here, where the
per-block cache would attach the other chain's KV.)
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import deque

from mypy_extensions import mypyc_attr

from pearl.engine.block_manager import NO_HASH, BlockAccounting, block_hashes
from pearl.engine.sequence import Sequence
from pearl.token_runs import TokenRuns


class _Piece:
    """Cached identities ``[start, start + n)`` (consecutive blocks of one chain)."""

    __slots__ = ("start", "n", "ref", "queued")

    def __init__(self, start: int, n: int, ref: int) -> None:
        self.start = start
        self.n = n
        self.ref = ref  # tables holding it; 0: evictable
        self.queued = 0  # the token of its live LRU entry (0: none)


class _Index:
    """Disjoint pieces by first identity."""

    __slots__ = ("pieces", "longest", "inner")

    def __init__(self) -> None:
        self.pieces: dict[int, _Piece] = {}
        self.longest = 1  # no piece was ever longer (how far ``holding`` looks back)
        # The first identities, sorted, of the pieces that start inside a run of consecutive
        # identities (at a block continuing the one before: the tail of a split, a commit
        # after a duplicate): the only pieces a commit's new range can run into.
        self.inner: list[int] = []

    def remove(self, piece: _Piece) -> None:
        del self.pieces[piece.start]
        inner = self.inner
        i = bisect_left(inner, piece.start)
        if i < len(inner) and inner[i] == piece.start:
            del inner[i]

    def grow(self, piece: _Piece, n: int) -> None:
        piece.n += n
        self.longest = max(self.longest, piece.n)

    def holding(self, h: int) -> _Piece | None:
        """The piece holding ``h``, wherever inside it (a look back over at most the
        longest piece's length: only where a piece may be entered inside)."""
        pieces = self.pieces
        start = next(filter(pieces.__contains__, range(h, h - self.longest, -1)), None)
        if start is None:
            return None
        piece = pieces[start]
        return piece if h < start + piece.n else None

    def split(self, piece: _Piece, k: int) -> _Piece:
        """Cut ``piece`` after its first ``k`` identities: a new piece is the head, ``piece``
        keeps the tail (and its LRU entry, the tail's place in the queue)."""
        head = _Piece(piece.start, k, piece.ref)
        piece.start += k
        piece.n -= k
        self.pieces[head.start] = head
        self.pieces[piece.start] = piece
        insort(self.inner, piece.start)
        return head

    def last_of(self, h: int, n: int) -> _Piece:
        """The last piece of a table's range ``[h, h + n)`` (whole pieces from ``h``)."""
        pieces, end = self.pieces, h + n
        while True:
            piece = pieces[h]
            h = piece.start + piece.n
            if h >= end:
                return piece

    def run_from(self, h: int, n: int, cut: int = 0) -> list[_Piece]:
        """The pieces of a table's range ``[h, h + n)`` (whole pieces, ``h`` the first's
        start) from its ``cut``-th identity on, split there and at the range's end."""
        pieces, end, at = self.pieces, h + n, h + cut
        out = []
        while h < end:
            piece = pieces[h]
            if piece.start + piece.n > end:
                piece = self.split(piece, end - piece.start)
            h = piece.start + piece.n
            if h > at:
                if piece.start < at:
                    self.split(piece, at - piece.start)
                out.append(piece)
        return out


@mypyc_attr(native_class=False)
class RunTable(list):
    """A sequence's block table: one placeholder per block (its length is the scheduler's),
    and ``runs``, the identity ranges of its first ``hashed`` blocks as ``[first identity,
    count, owned, epoch]``: ``owned`` ranges are whole cache pieces the table holds a
    reference to (pieces of the cache flushed at ``epoch`` if that is not the manager's
    current one), the others are private duplicates, kept for the chain. The blocks after
    ``hashed`` are private, not hashed yet."""

    __slots__ = ("runs", "hashed")

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[list[int]] = []
        self.hashed = 0


def _hash_runs(token_ids, first: int, last: int, block_size: int, prev: int) -> list:
    """The identities of full blocks ``first .. last - 1`` as ranges ``(first, count)``."""
    if isinstance(token_ids, TokenRuns):
        return token_ids.block_hash_runs(first, last, block_size, prev, chained=prev != NO_HASH)
    return [(h, 1) for h in block_hashes(token_ids, first, last, block_size, prev)]


class RunBlockManager(BlockAccounting):
    """``BlockManager``'s accounting and prefix cache (``verify_tokens=False``), by pieces."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks ({num_blocks}) and block_size ({block_size}) must be >= 1"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = num_blocks  # blocks neither held nor cached
        self._evictable = 0  # cached blocks no table holds
        self._cached = 0
        self._index = _Index()  # the cache
        # Pieces tables still held when a flush emptied the cache, by the epoch it ended:
        # no longer cached, free when their last holder lets go.
        self._old: dict[int, _Index] = {}
        self._lru: deque[tuple[_Piece, int]] = deque()  # (piece, token); stale if token moved
        self._tokens = 0
        self._epoch = 0  # flushes so far
        self.cache_hits = 0  # tokens served from the prefix cache
        self.cache_queries = 0  # prompt tokens looked up

    # -- capacity -----------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that an allocation can take now (free plus evictable)."""
        return self._free + self._evictable

    @property
    def num_cached_blocks(self) -> int:
        return self._cached

    # -- prefix cache ---------------------------------------------------------------
    def attach_prefix(self, seq: Sequence) -> int:
        """Give a fresh sequence the cached blocks of its longest cached prefix (at least
        its last token left to compute); returns the tokens served from cache."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        bs = self.block_size
        table = RunTable()
        pieces = self._index.pieces
        hits = 0
        for h, n in _hash_runs(seq.token_ids, 0, (seq.num_tokens - 1) // bs, bs, NO_HASH):
            covered = 0
            while covered < n:
                piece = pieces.get(h + covered)
                if piece is None:
                    break
                covered = min(n, covered + piece.n)
            if covered:
                for piece in self._index.run_from(h, covered):
                    if not piece.ref:
                        self._evictable -= piece.n
                        piece.queued = 0  # its queue entry goes stale
                    piece.ref += 1
                table.runs.append([h, covered, True, self._epoch])
                hits += covered
            if covered < n:
                break
        table.extend([0] * hits)
        table.hashed = hits
        return self._attached(seq, table, hits)

    def commit(self, seq: Sequence) -> None:
        """Register the blocks ``seq`` has completely computed in the prefix cache (none if
        its KV predates the current weights); a block already cached stays private."""
        if not seq.cacheable:
            return
        bs = self.block_size
        table = seq.block_table
        full = min(seq.num_computed_tokens // bs, len(table))
        first = seq.num_hashed_blocks
        if full <= first:
            return
        assert isinstance(table, RunTable) and table.hashed == first
        # A table that commits holds no run from before a flush (a flush marks every
        # table holding KV uncacheable until it is released).
        runs, epoch, index = table.runs, self._epoch, self._index
        pieces = index.pieces
        last = runs[-1] if runs else None
        prev = last[0] + last[1] - 1 if last is not None else NO_HASH
        # After a duplicate, the next block may be inside the piece it duplicates.
        inside = last is not None and not last[2]
        cached = 0
        inner = index.inner
        for h, n in _hash_runs(seq.token_ids, first, full, bs, prev):
            continues = h == prev + 1  # the block continues the one before (else a new range)
            while n:  # hot: a few dict operations a run
                piece = index.holding(h) if inside else pieces.get(h)
                inside = False
                if piece is not None:  # cached already: these blocks are duplicates
                    d = min(n, piece.start + piece.n - h)
                    owned = False
                else:  # new up to the next cached piece's start, if one is in the range
                    i = bisect_right(inner, h)
                    d = n if i == len(inner) or inner[i] >= h + n else inner[i] - h
                    cached += d
                    owned = True
                    mine = None
                    if last is not None and last[2] and last[0] + last[1] == h:
                        mine = index.last_of(last[0], last[1])
                    if mine is not None and mine.ref == 1:
                        index.grow(mine, d)  # this table's own last piece goes on
                    else:
                        pieces[h] = _Piece(h, d, 1)
                        if d > index.longest:
                            index.longest = d
                        if continues:
                            insort(inner, h)
                if last is not None and last[2] == owned and last[0] + last[1] == h:
                    last[1] += d
                else:
                    last = [h, d, owned, epoch]
                    runs.append(last)
                h += d
                n -= d
                continues = True
            prev = h - 1
        self._cached += cached
        table.hashed = full
        seq.num_hashed_blocks = full

    # -- allocation -----------------------------------------------------------------
    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow ``seq``'s table to cover ``num_tokens`` tokens, or raise ``OutOfBlocks``
        without changing anything."""
        need = self._blocks_to_take(seq, num_tokens)
        if need == 0:
            return
        table = seq.block_table
        if not isinstance(table, RunTable):
            assert not table
            table = seq.block_table = RunTable()
        take = min(need, self._free)
        self._free -= take
        if need > take:
            self._evict(need - take)
        table.extend([0] * need)

    def _evict(self, n: int) -> None:
        """Drop the ``n`` least recently freed evictable blocks from the cache."""
        self._evictable -= n
        self._cached -= n
        lru = self._lru
        while n:
            piece, token = lru[0]
            if piece.queued != token:  # stale: taken back since (or gone)
                lru.popleft()
                continue
            m = min(n, piece.n)
            piece.n -= m  # from its tail
            n -= m
            if not piece.n:
                lru.popleft()
                piece.queued = 0
                self._index.remove(piece)

    def truncate(self, seq: Sequence, keep: int) -> None:
        """Free ``seq``'s blocks after its first ``keep`` (the tail first)."""
        table = seq.block_table
        if keep >= len(table):
            seq.num_hashed_blocks = min(seq.num_hashed_blocks, keep)
            return
        assert isinstance(table, RunTable)
        hashed = table.hashed
        self._free += len(table) - max(keep, hashed)  # never hashed: private
        runs = table.runs
        while hashed > keep:
            h, n, owned, epoch = runs[-1]
            k = min(n, hashed - keep)  # this run's blocks to free, its last ones
            if not owned:
                self._free += k
            elif epoch == self._epoch:
                self._release(h, n, n - k)
            else:
                self._release_old(epoch, h, n, n - k)
            if k == n:
                runs.pop()
            else:
                runs[-1][1] = n - k
            hashed -= k
        table.hashed = hashed
        del table[keep:]
        seq.num_hashed_blocks = min(seq.num_hashed_blocks, keep)

    def _release(self, h: int, n: int, cut: int) -> None:
        """Drop a table's reference to the pieces of its range ``[h, h + n)`` from its
        ``cut``-th identity on; the unreferenced ones queue for eviction, the last first."""
        for piece in reversed(self._index.run_from(h, n, cut)):
            piece.ref -= 1
            if not piece.ref:
                self._evictable += piece.n
                self._tokens += 1
                piece.queued = self._tokens
                self._lru.append((piece, self._tokens))
        if len(self._lru) > 2 * self._evictable + 1024:  # mostly stale: drop those (amortized)
            self._lru = deque(e for e in self._lru if e[0].queued == e[1])

    def _release_old(self, epoch: int, h: int, n: int, cut: int) -> None:
        """``_release`` for pieces held since the cache was flushed at ``epoch``: unheld,
        they are free."""
        index = self._old[epoch]
        for piece in index.run_from(h, n, cut):
            piece.ref -= 1
            if not piece.ref:
                self._free += piece.n
                index.remove(piece)
        if not index.pieces:
            del self._old[epoch]

    def release(self, seq: Sequence) -> None:
        """Free all of ``seq``'s blocks and forget its KV (``num_computed_tokens`` -> 0)."""
        self.truncate(seq, 0)
        self._forgotten(seq)

    def reset_prefix_cache(self) -> None:
        """Forget every cached identity (new weights make cached KV stale)."""
        self._free += self._evictable
        self._evictable = 0
        self._cached = 0
        for piece, _ in self._lru:
            piece.queued = 0
        self._lru.clear()
        held = _Index()
        held.pieces = {h: p for h, p in self._index.pieces.items() if p.ref}
        held.inner = [h for h in self._index.inner if h in held.pieces]
        if held.pieces:
            self._old[self._epoch] = held
        self._index = _Index()
        self._epoch += 1

    # -- checks (tests) ----------------------------------------------------------------
    def evictable_in_lru_order(self) -> list[int]:
        """The evictable identities, the next to be evicted first."""
        out: list[int] = []
        for piece, token in self._lru:
            if piece.queued == token:
                out.extend(range(piece.start + piece.n - 1, piece.start - 1, -1))
        return out

    def cached_identities(self) -> set[int]:
        return {h for p in self._index.pieces.values() for h in range(p.start, p.start + p.n)}

    def check_invariants(self, live_tables: list[list[int]]) -> None:
        """Assert the pieces' counts match the tables holding them (tests)."""
        indexes = {self._epoch: self._index, **self._old}
        refs: dict[tuple[int, int], int] = {}
        for epoch, index in indexes.items():
            starts = sorted(index.pieces)
            pieces = [index.pieces[s] for s in starts]
            for a, b in zip(pieces, pieces[1:], strict=False):
                assert a.start + a.n <= b.start, (a.start, a.n, b.start)
            assert all(p.n > 0 and p.start == s for s, p in zip(starts, pieces, strict=True))
            refs.update({(epoch, s): 0 for s in starts})
            assert index.inner == sorted(set(index.inner)) and set(index.inner) <= set(starts)
        held = 0
        for table in live_tables:
            if not isinstance(table, RunTable):
                assert not table
                continue
            assert table.hashed == sum(r[1] for r in table.runs) <= len(table)
            held += len(table)
            for h, n, owned, epoch in table.runs:
                if owned:
                    held -= n
                    for start in _starts_over(indexes[epoch], h, n):
                        refs[epoch, start] += 1
        live = {(id(p), t) for p, t in self._lru if p.queued == t}
        for epoch, index in indexes.items():
            for p in index.pieces.values():
                assert p.ref == refs[epoch, p.start], (epoch, p.start, p.ref)
                held += p.n if p.ref else 0
                if epoch == self._epoch:
                    assert (p.ref == 0) == ((id(p), p.queued) in live)
                else:
                    assert p.ref and not p.queued
        pieces = list(self._index.pieces.values())
        assert self._evictable == sum(p.n for p in pieces if not p.ref)
        assert self._cached == sum(p.n for p in pieces)
        assert self._free + self._evictable + held == self.num_blocks


def _starts_over(index: _Index, h: int, n: int) -> list[int]:
    """The first identities of the whole pieces covering ``[h, h + n)`` (asserted)."""
    out, end = [], h + n
    while h < end:
        piece = index.pieces.get(h)
        assert piece is not None and piece.start + piece.n <= end, (h, n)
        out.append(h)
        h += piece.n
    return out
