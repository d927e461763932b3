"""Token sequences stored as runs over fixed id walks: the simulator's contexts without
per-token lists.

Every token id the simulator makes is read from a fixed random permutation of the
vocabulary (``id_pool``): a workload's observation is ``pool[s : s + n]`` for a keyed start
``s``, a simulated response walks another pool from a start keyed by its session. A context
is therefore a handful of runs ``(pool, start, length)``, ~3 a turn, while it holds
10^4-10^5 tokens. ``TokenRuns`` stores a sequence that way and gives the engine's scheduler
and block manager what they use of a token list (length, indexing, slices, appends,
comparison, deletion) at a cost in runs, not tokens, plus ``common_prefix`` and
``block_keys`` (a full block's prefix-cache key from the runs covering it).

Exactness. ``==`` and ``common_prefix`` equal the token-by-token answers always: where two
sequences' runs differ they compare tokens until the first difference. A block's key
determines its tokens, so equal keys mean equal blocks. The converse needs equal tokens to
be stored as equal runs, which is not so in general (``extend`` joins a run to the last one
only in the same pool, ``append`` and ``extend_walk`` continue the last run of any pool) but
holds on the simulator's paths: a token's run is fixed by where it came from (the same
observation walk, the same sampled response, sliced and joined the same way on every path;
a test runs a SWE batch on runs and on lists and compares every turn). Tokens appended one
at a time (``append``, a sampled token) continue the last run when they can, else start a
run in the sampler's pool (``id_pool(vocab_size, 1)``, which ``pearl.sim.worker`` samples
from), else are kept as a one-token literal run.
"""

from __future__ import annotations

import functools
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from itertools import repeat
from typing import Any

import numpy as np

# Token ids as the engine and the turns pass them: a list, or ``TokenRuns`` standing in for
# one (the simulator's contexts). ``Any`` to the type checker: compiled (``pearl.native``), a
# declared ``list[int]`` is checked at run time and would reject runs.
TokenIds = Any

LITERAL = -1  # a run of one token not read from a pool: (LITERAL, token id, 1)
SAMPLER_FIRST_ID = 1  # the simulator samples ids from id_pool(vocab_size, 1)


@functools.lru_cache(maxsize=4)
def id_pool(vocab_size: int, first_id: int) -> list[int]:
    """The fixed random permutation of ``[first_id, vocab_size)`` the ids walk (shared:
    never modify it)."""
    return np.random.default_rng(0).permutation(np.arange(first_id, vocab_size)).tolist()


def id_walk(vocab_size: int, first_id: int, start: int, n: int) -> list[int]:
    """``n`` ids of the fixed random permutation of ``[first_id, vocab_size)`` from position
    ``start`` (mod its length) on, wrapping around. Two walks from different starts differ
    at every position (until a wrap), and the ids are shared objects: a slice, no new ints."""
    return _walk(_POOLS[pool_index(vocab_size, first_id)], start, n)


def _walk(pool: list[int], start: int, n: int) -> list[int]:
    start %= len(pool)
    out = pool[start : start + n]
    while len(out) < n:
        out += pool[: n - len(out)]
    return out


# Pools by id (a run names its pool by an int, so runs compare and hash as ints; the id is
# a function of the pool, so runs mean the same in every process).
class _Pools(dict[int, list[int]]):
    def __missing__(self, index: int) -> list[int]:
        pool = self[index] = id_pool(index & 0xFFFFFFFF, index >> 32)
        return pool


_POOLS = _Pools()  # pool id -> the pool, made on first use (e.g. runs from another process)
_POSITIONS: dict[int, dict[int, int]] = {}  # pool id -> {token id: its position}


def pool_index(vocab_size: int, first_id: int) -> int:
    """The id runs use for ``id_pool(vocab_size, first_id)``: ``first_id << 32 | vocab_size``."""
    if not 0 <= first_id < vocab_size < 1 << 32:
        raise ValueError(
            f"a pool needs 0 <= first_id < vocab_size < 2^32, got {first_id}, {vocab_size}"
        )
    return (first_id << 32) | vocab_size


def _positions(pool: int) -> dict[int, int]:
    found = _POSITIONS.get(pool)
    if found is None:
        found = _POSITIONS[pool] = {token: i for i, token in enumerate(_POOLS[pool])}
    return found


def _token(pool: int, start: int, offset: int) -> int:
    if pool == LITERAL:
        return start
    ids = _POOLS[pool]
    return ids[(start + offset) % len(ids)]


class TokenRuns:
    """A sequence of token ids as runs ``(pool, start, length)`` (see the module's doc)."""

    __slots__ = ("_runs", "_ends", "_sampler", "_len")

    def __init__(self, sampler: int) -> None:
        self._runs: list[tuple[int, int, int]] = []
        self._ends: list[int] = []  # cumulative: run i covers [ends[i-1], ends[i])
        self._sampler = sampler  # the pool a token appended alone is looked up in
        # The length (``_ends[-1]``), kept beside it: compiled, a field of the object, where
        # ``_ends[-1]`` is a list's item, a boxed int elsewhere in memory (the scheduler
        # asks every sequence's length every iteration: at 512 workers, a cold read each).
        self._len = 0

    # -- construction -----------------------------------------------------------------
    @classmethod
    def empty(cls, vocab_size: int) -> TokenRuns:
        return cls(pool_index(vocab_size, SAMPLER_FIRST_ID))

    @classmethod
    def walk(cls, vocab_size: int, first_id: int, start: int, n: int) -> TokenRuns:
        """The ids ``id_walk(vocab_size, first_id, start, n)``, as one run."""
        out = cls.empty(vocab_size)
        pool = pool_index(vocab_size, first_id)
        out._push(pool, start % len(_POOLS[pool]), n)
        return out

    def __reduce__(self) -> tuple[object, tuple[int, list[tuple[int, int, int]], list[int]]]:
        # Explicit, so a compiled build (pearl.native) pickles the same as Python does.
        return _restore, (self._sampler, self._runs, self._ends)

    def copy(self) -> TokenRuns:
        out = TokenRuns(self._sampler)
        out._runs = self._runs.copy()
        out._ends = self._ends.copy()
        out._len = self._len
        return out

    def _push(self, pool: int, start: int, n: int) -> None:
        """Append a run, joining the last one if it continues it in the same pool."""
        if n <= 0:
            return
        runs = self._runs
        if runs:
            p, s, m = runs[-1]
            if p == pool and pool != LITERAL and (s + m) % len(_POOLS[p]) == start:
                self._grow_last(p, s, m, n)
                return
        self._new_run(pool, start, n)

    def _grow_last(self, p: int, s: int, m: int, n: int) -> None:
        """The last run, ``(p, s, m)``, goes on for ``n`` more tokens."""
        self._runs[-1] = (p, s, m + n)
        self._ends[-1] += n
        self._len += n

    def _new_run(self, pool: int, start: int, n: int) -> None:
        self._runs.append((pool, start, n))
        self._len += n
        self._ends.append(self._len)

    def _continues_with(self, token: int) -> bool:
        if not self._runs:
            return False
        p, s, m = self._runs[-1]
        return p != LITERAL and _token(p, s, m) == token

    # -- a list's mutators ------------------------------------------------------------
    def append(self, token: int) -> None:
        if self._continues_with(token):
            p, s, m = self._runs[-1]
            self._grow_last(p, s, m, 1)
            return
        position = _positions(self._sampler).get(token)
        if position is None:
            self._new_run(LITERAL, token, 1)
        else:
            self._push(self._sampler, position, 1)

    def extend(self, tokens: Iterable[int]) -> None:
        if isinstance(tokens, TokenRuns):
            for run in list(tokens._runs):
                self._push(*run)
        else:
            for token in list(tokens):
                self.append(token)

    def extend_walk(self, start: int, n: int) -> None:
        """Append ``n`` ids of the sampler's pool from ``start`` on: what appending them one
        at a time gives, in one step."""
        pool = self._sampler
        ids = _POOLS[pool]
        size = len(ids)
        start %= size
        runs = self._runs
        if runs and n > 0:  # the common case, the loop's first pass: the sampler's run goes on
            p, s, m = runs[-1]
            if p == pool and (s + m) % size == start:
                self._grow_last(p, s, m, n)
                return
        while n > 0:
            if not self._continues_with(ids[start]):
                self._new_run(pool, start, n)
                return
            p, s, m = self._runs[-1]
            take = n if p == pool else 1  # the sampler's own run takes the whole walk
            self._grow_last(p, s, m, take)
            start, n = (start + take) % len(ids), n - take

    def __iadd__(self, tokens: Iterable[int]) -> TokenRuns:
        self.extend(tokens)
        return self

    def __add__(self, tokens: Iterable[int]) -> TokenRuns:
        out = self.copy()
        out.extend(tokens)
        return out

    def __radd__(self, tokens: Iterable[int]) -> TokenRuns:
        out = TokenRuns(self._sampler)
        out.extend(tokens)
        out.extend(self)
        return out

    def __delitem__(self, index: slice) -> None:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("TokenRuns deletes contiguous slices only")
        a, b, _ = index.indices(len(self))
        if b <= a:
            return
        tail = self._runs_from(b)
        self._truncate(a)
        for run in tail:  # joined where the head's last run continues into it
            self._push(*run)

    def _truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens (``del self[n:]``), in place."""
        runs, ends = self._runs, self._ends
        if n <= 0:
            runs.clear()
            ends.clear()
            self._len = 0
            return
        if n >= self._len:
            return
        i = bisect_right(ends, n - 1)  # the run holding token n - 1
        del runs[i + 1 :], ends[i + 1 :]
        p, s, m = runs[i]
        runs[i] = (p, s, m - (ends[i] - n))
        ends[i] = n
        self._len = n

    def _runs_from(self, n: int) -> list[tuple[int, int, int]]:
        """The runs of tokens ``n ..`` (the first one cut to start at token ``n``)."""
        runs, ends = self._runs, self._ends
        if n >= len(self):
            return []
        i = bisect_right(ends, n)  # the run holding token n
        out = runs[i:]
        p, s, m = out[0]
        cut = n - (ends[i] - m)
        if cut:
            out[0] = (p, s if p == LITERAL else (s + cut) % len(_POOLS[p]), m - cut)
        return out

    # -- a list's queries -------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):
        if isinstance(index, slice):
            if index.step not in (None, 1):
                raise TypeError("TokenRuns slices take no step")
            a, b, _ = index.indices(len(self))
            return self._slice(a, b)
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("TokenRuns index out of range")
        i = bisect_right(self._ends, index)
        p, s, m = self._runs[i]
        return _token(p, s, index - (self._ends[i] - m))

    def _slice(self, a: int, b: int) -> TokenRuns:
        out = TokenRuns(self._sampler)
        if b <= a:
            return out
        ends, runs = self._ends, self._runs
        i = bisect_right(ends, a)
        j = bisect_right(ends, b - 1)
        picked = runs[i : j + 1]
        first_start = ends[i] - runs[i][2]
        p, s, m = picked[0]
        cut = a - first_start
        if cut:
            picked[0] = (p, s if p == LITERAL else (s + cut) % len(_POOLS[p]), m - cut)
        over = ends[j] - b  # tokens of the last run past b
        if over:
            p, s, m = picked[-1]
            picked[-1] = (p, s, m - over)
        out._runs = picked
        total = 0
        out._ends = [total := total + run[2] for run in picked]
        out._len = total
        return out

    def __iter__(self) -> Iterator[int]:
        for p, s, m in self._runs:
            if p == LITERAL:
                yield s
            else:
                yield from _walk(_POOLS[p], s, m)

    def tolist(self) -> list[int]:
        return list(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenRuns):
            return len(self) == len(other) and self.common_prefix(other) == len(self)
        if isinstance(other, list):
            return self.tolist() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def __repr__(self) -> str:
        return f"TokenRuns({len(self)} tokens in {len(self._runs)} runs)"

    @property
    def num_runs(self) -> int:
        return len(self._runs)

    # -- what the engine asks ---------------------------------------------------------
    def common_prefix(self, other: TokenRuns, limit: int | None = None) -> int:
        """Length of the longest common prefix with ``other`` (at most ``limit``): whole
        runs compared as tuples, then tokens from the first run that differs on."""
        n = min(len(self), len(other)) if limit is None else min(limit, len(self), len(other))
        ra, rb = self._runs, other._runs
        k = list_common_prefix(ra, rb, min(len(ra), len(rb)))  # whole runs alike
        done = self._ends[k - 1] if k else 0
        if done >= n:
            return n
        # From run k on, piece by piece: aligned walks of one pool skip ahead, anything
        # else compares a token (the runs differ, so a difference is near).
        i, oa, j, ob = k, 0, k, 0
        while done < n:
            pa, sa, la = ra[i]
            pb, sb, lb = rb[j]
            step = 1
            if pa == pb and pa != LITERAL:
                size = len(_POOLS[pa])
                if (sa + oa) % size == (sb + ob) % size:
                    step = min(la - oa, lb - ob, n - done)
            if step == 1 and _token(pa, sa, oa) != _token(pb, sb, ob):
                return done
            done += step
            oa += step
            ob += step
            if oa == la:
                i, oa = i + 1, 0
            if ob == lb:
                j, ob = j + 1, 0
        return n

    def block_keys(self, first: int, last: int, block_size: int) -> list[tuple[int, ...]]:
        """Keys of blocks ``first .. last - 1`` (tokens ``[b * block_size, (b + 1) *
        block_size)`` each, all within the sequence): ``(pool, position)`` for a block
        inside one run, else its pieces ``(pool, position, length, ...)``. Equal keys mean
        equal tokens."""
        keys: list[tuple[int, ...]] = []
        bs = block_size
        for key, p, base, n in self._spans(first, last, bs):
            if key is not None:
                keys.append(key)
                continue
            size = len(_POOLS[p])
            stop = base + n * bs
            if stop <= size:  # no wrap (the rule): the keys' tuples made in C
                keys.extend(zip(repeat(p), range(base, stop, bs)))
            else:
                keys.extend([(p, x % size) for x in range(base, stop, bs)])
        return keys

    def _spans(
        self, first: int, last: int, block_size: int
    ) -> Iterator[tuple[tuple[int, ...] | None, int, int, int]]:
        """Blocks ``first .. last - 1`` in order, as ``(None, pool, position, n)`` for ``n``
        consecutive blocks inside one pool run, the first at ``position`` of the pool, and
        ``(key, 0, 0, 1)`` for a block over several runs (its pieces, ``_pieces``)."""
        runs, ends = self._runs, self._ends
        bs = block_size
        b = first
        i = bisect_right(ends, b * bs)
        while b < last:
            p, s, m = runs[i]
            a = b * bs
            inside = min(last, (ends[i] // bs))  # blocks ending within run i
            if inside > b and p != LITERAL:
                yield None, p, (s + a - (ends[i] - m)) % len(_POOLS[p]), inside - b
                b = inside
                if b * bs >= ends[i]:
                    i += 1
                continue
            key, i = self._pieces(i, a, bs)
            yield key, 0, 0, 1
            b += 1

    def _pieces(self, i: int, a: int, block_size: int) -> tuple[tuple[int, ...], int]:
        """The key of the block starting at token ``a`` inside run ``i`` and spanning several
        runs: its pieces ``(pool, position, length, ...)``, the first from where the block
        starts in run i, the others from their runs' starts (a run's start is kept reduced
        modulo its pool's size: the same piece as ``(s + 0) % size``); and the run holding
        the next block's first token."""
        runs, ends = self._runs, self._ends
        p, s, m = runs[i]
        e, end = ends[i], a + block_size
        pieces = [p, s if p == LITERAL else (s + a - e + m) % len(_POOLS[p]), min(e, end) - a]
        while e < end:
            i += 1
            p, s, m = runs[i]
            pieces += (p, s, min(m, end - e))
            e = ends[i]
        if e == end:
            i += 1
        return tuple(pieces), i

    def block_hashes(
        self, first: int, last: int, block_size: int, prev: int, chained: bool = True
    ) -> list[int]:
        """Prefix-cache identities of blocks ``first .. last - 1``, chained from ``prev`` (block
        ``first - 1``'s identity if ``chained``, else a root): ``hash((previous, key))`` with
        the key ``block_keys`` gives, except for a block inside one pool run that continues the
        previous block's walk (starts where the previous block's last piece ends, in the same
        pool), which is the previous identity plus one. Equal keys give equal identities (a function of the
        keys), different keys different ones (a 64-bit hash's odds, which also bound a run's
        identities reaching the block manager's ``NO_HASH``, -1); and a run's blocks get
        consecutive ints, which a dict keeps in neighbouring slots (the prefix cache's index
        is then read and written in order, not at random). ``block_hash_runs`` gives them
        as ranges."""
        out: list[int] = []
        for start, n in self.block_hash_runs(first, last, block_size, prev, chained):
            out.extend(range(start, start + n))
        return out

    def block_hash_runs(
        self, first: int, last: int, block_size: int, prev: int, chained: bool = True
    ) -> list[tuple[int, int]]:
        """``block_hashes`` as ranges ``(first identity, count)`` of consecutive identities,
        in block order (what ``pearl.sim.prefix_runs`` keeps its cache by)."""
        if last <= first:
            return []
        runs, ends = self._runs, self._ends
        bs = block_size
        after = None  # (pool, position) where block first - 1's last piece ends, in one run
        if first and chained:
            i = bisect_right(ends, first * bs - 1)  # the run holding block first - 1's last token
            p, s, m = runs[i]
            if p != LITERAL:
                if last * bs <= ends[i]:  # the common case: all in that run
                    return [(prev + 1, last - first)]
                after = (p, (s + first * bs - (ends[i] - m)) % len(_POOLS[p]))
        out: list[tuple[int, int]] = []
        for key, p, base, n in self._spans(first, last, bs):
            if key is not None:  # a block over several runs: its last piece ends in one
                prev = hash((prev, key))
                out.append((prev, 1))
                q, s, m = key[-3:]
                after = None if q == LITERAL else (q, (s + m) % len(_POOLS[q]))
                continue
            if after == (p, base):  # continues the previous block's walk: the same range
                if out:
                    out[-1] = (out[-1][0], out[-1][1] + n)
                else:
                    out.append((prev + 1, n))
            else:
                out.append((hash((prev, (p, base))), n))
            prev = out[-1][0] + out[-1][1] - 1
            after = (p, (base + n * bs) % len(_POOLS[p]))
        return out


def _restore(sampler: int, runs: list[tuple[int, int, int]], ends: list[int]) -> TokenRuns:
    out = TokenRuns(sampler)
    out._runs = runs
    out._ends = ends
    out._len = ends[-1] if ends else 0
    return out


def list_common_prefix(a: Any, b: Any, n: int) -> int:
    """Length of the longest common prefix of lists ``a`` and ``b`` within their first ``n``
    items: whole slices compared at C speed (one pass for equal prefixes, unless their last
    items already differ), bisecting on the first difference, not a Python loop per item."""
    if n == 0:
        return 0
    if a[n - 1] == b[n - 1] and (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def block_keys(token_ids, first: int, last: int, block_size: int) -> list[tuple[int, ...]]:
    """Prefix-cache keys of full blocks ``first .. last - 1`` of a token list or ``TokenRuns``:
    the blocks' token ids as tuples, or ``TokenRuns.block_keys``."""
    if isinstance(token_ids, TokenRuns):
        return token_ids.block_keys(first, last, block_size)
    span = tuple(token_ids[first * block_size : last * block_size])
    return [span[o : o + block_size] for o in range(0, len(span), block_size)]
