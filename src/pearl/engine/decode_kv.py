"""Contiguous per-sequence K/V rows for the decoding sequences, appended in place.

Gathering every decoding sequence's blocks out of the paged cache in every layer of every
iteration copies the whole batch's context per layer per step (on CPU the copy cost more
than the attention it fed). ``DecodeKV`` keeps, for each sequence that is decoding, a
contiguous copy of its K/V in one row of a buffer ``[layers, 2, rows, kv_heads, capacity,
head_dim]``: a sequence's row is filled from the paged cache once, when it starts decoding
(or for the tokens it gained since it last decoded), and afterwards each step only writes
the new token's K/V to both the paged cache and the row. Attention reads ``rows[a:b, :, :n]``
as a view, so steady decode copies nothing per layer but the new tokens.

The paged cache stays the source of truth (prefix cache, sessions, KV export/import and
preemption work on blocks as before); rows are a cache of it keyed by the ``Sequence``
object and its length. A row is dropped when its sequence is not among an iteration's
decodes, and forgotten (refilled from the paged cache) when the sequence prefills again
(after preemption) or has KV imported.

Memory: rows are padded to the longest decoding context, so the buffer holds about the
decoding sequences' KV once more (plus padding). It is capped at ``max_bytes`` (default:
twice the paged cache's size); an iteration whose rows would not fit gathers blocks per
layer as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pearl.engine.sequence import Sequence
from pearl.models.attention import DecodeRows

ALIGN = 64  # capacity grows in steps of this many tokens


@dataclass(slots=True)
class DecodePlan:
    """Row order of one iteration's decodes: ``order[r]`` indexes the scheduler's
    ``decodes`` list for buffer row (and flat decode row) ``r``."""

    order: list[int]
    rows: DecodeRows


class DecodeKV:
    """Contiguous K/V rows of the decoding sequences over one paged KV cache."""

    def __init__(self, kv_cache: torch.Tensor, block_size: int, max_bytes: int | None = None):
        self.kv_cache = kv_cache  # [layers, 2, kv_heads, num_blocks, block_size, head_dim]
        layers, _, heads, num_blocks, bs, dim = kv_cache.shape
        self.block_size = block_size
        self.num_slots = num_blocks * bs
        self._flat_cache = kv_cache.view(layers * 2, heads * self.num_slots, dim)
        self.max_bytes = (
            2 * kv_cache.numel() * kv_cache.element_size() if max_bytes is None else max_bytes
        )
        self.buf: torch.Tensor | None = None  # [layers, 2, rows, kv_heads, capacity, head_dim]
        self.layer_views: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.seqs: list[Sequence] = []  # row -> sequence
        self.lens: list[int] = []  # row -> tokens of K/V held (positions [0, len))
        self._row_of: dict[int, int] = {}  # id(seq) -> row (the row holds a reference)
        # Counters (tests and benchmarks): tokens copied from the paged cache, rows moved
        # to close gaps, re-sorts by length, iterations that fell back to gathering.
        self.filled_tokens = 0
        self.moved_rows = 0
        self.resorts = 0
        self.fallbacks = 0

    # -- state ---------------------------------------------------------------------------
    def reset(self) -> None:
        """Drop every row and the buffer."""
        self.buf = None
        self.layer_views = []
        self.seqs, self.lens, self._row_of = [], [], {}

    def forget(self, seq: Sequence) -> None:
        """``seq``'s K/V in the paged cache was (or will be) rewritten: refill its row."""
        row = self._row_of.get(id(seq))
        if row is not None:
            self.lens[row] = 0

    @property
    def capacity(self) -> int:
        return 0 if self.buf is None else self.buf.shape[4]

    @property
    def num_rows(self) -> int:
        return 0 if self.buf is None else self.buf.shape[2]

    # -- one iteration ---------------------------------------------------------------------
    def plan(self, decodes: list[Sequence]) -> DecodePlan | None:
        """Give every decoding sequence a row holding its K/V up to (not including) its
        newest token and lay the rows out for attention; None (gather blocks instead)
        if the buffer would outgrow ``max_bytes``."""
        n = len(decodes)
        index_of = {id(s): i for i, s in enumerate(decodes)}
        # Rows of sequences that are not decoding now are dropped; the kept rows that lie
        # beyond the first len(kept) rows move into the gaps (one row copy each).
        kept = [r for r, s in enumerate(self.seqs) if id(s) in index_of]
        n_kept = len(kept)
        kept_set = set(kept)
        gaps = [r for r in range(n_kept) if r not in kept_set]
        movers = [r for r in kept if r >= n_kept]
        for dst, src in zip(gaps, movers, strict=True):
            self._copy_row(src, dst)
        seqs = self.seqs
        lens = self.lens
        for dst, src in zip(gaps, movers, strict=True):
            seqs[dst], lens[dst] = seqs[src], lens[src]
        del seqs[n_kept:], lens[n_kept:]
        placed = {id(s) for s in seqs}
        for s in decodes:
            if id(s) not in placed:
                seqs.append(s)
                lens.append(0)
        for r, s in enumerate(seqs):
            if lens[r] > s.num_tokens - 1:  # shorter than what the row holds: not the same KV
                lens[r] = 0
        if not self._ensure(n, max(s.num_tokens for s in decodes)):
            self.fallbacks += 1
            self.reset()
            return None
        lengths = [s.num_tokens for s in seqs]
        groups = _contiguous_groups(lengths)
        if len(groups) > 1 + n // 8:
            # Rows of very different lengths interleave: sort them once (lengths then grow
            # in step, so the order holds until sequences join or leave).
            perm = sorted(range(n), key=lengths.__getitem__)
            self._permute(perm)
            lengths = [s.num_tokens for s in self.seqs]
            groups = _contiguous_groups(lengths)
        self._row_of = {id(s): r for r, s in enumerate(self.seqs)}
        self._fill()
        return DecodePlan(
            order=[index_of[id(s)] for s in self.seqs],
            rows=self._metadata(lengths, groups),
        )

    # -- internals -------------------------------------------------------------------------
    def _bytes(self, rows: int, capacity: int) -> int:
        layers, _, heads, _, _, dim = self.kv_cache.shape
        return layers * 2 * rows * heads * capacity * dim * self.kv_cache.element_size()

    def _ensure(self, rows: int, need_cap: int) -> bool:
        """Grow the buffer to at least ``rows`` rows of ``need_cap`` tokens."""
        cur_rows, cur_cap = self.num_rows, self.capacity
        if rows <= cur_rows and need_cap <= cur_cap:
            return True
        cap = max(cur_cap, -(-need_cap // ALIGN) * ALIGN)
        if self._bytes(rows, cap) > self.max_bytes:
            return False
        new_rows = max(rows, cur_rows)
        if rows > cur_rows:  # room to grow without reallocating at every admission
            new_rows = max(new_rows, min(2 * cur_rows, rows + 16))
        while new_rows > rows and self._bytes(new_rows, cap) > self.max_bytes:
            new_rows -= 1
        layers, _, heads, _, _, dim = self.kv_cache.shape
        # Zeros, not empty: padding positions are masked out of attention, but a masked
        # NaN would still poison the weighted sum (0 * NaN).
        buf = torch.zeros(
            (layers, 2, new_rows, heads, cap, dim),
            dtype=self.kv_cache.dtype,
            device=self.kv_cache.device,
        )
        # Rows [0, len(seqs)) are laid out; the ones that exist in the old buffer move over.
        used = min(len(self.seqs), cur_rows)
        hold = max(self.lens[:used], default=0)
        if self.buf is not None and hold:
            buf[:, :, :used, :, :hold].copy_(self.buf[:, :, :used, :, :hold])
        self.buf = buf
        self.layer_views = [(buf[i, 0], buf[i, 1]) for i in range(layers)]
        return True

    def _copy_row(self, src: int, dst: int) -> None:
        n = self.lens[src]
        if n:
            assert self.buf is not None
            self.buf[:, :, dst, :, :n].copy_(self.buf[:, :, src, :, :n])
            self.moved_rows += 1

    def _permute(self, perm: list[int]) -> None:
        assert self.buf is not None
        hold = max(self.lens, default=0)
        n = len(perm)
        if hold:
            used = self.buf[:, :, :n, :, :hold]
            used.copy_(used[:, :, torch.tensor(perm, device=self.buf.device)])
        self.seqs = [self.seqs[i] for i in perm]
        self.lens = [self.lens[i] for i in perm]
        self.resorts += 1

    def _fill(self) -> None:
        """Copy each row's missing positions ``[len, num_tokens - 1)`` from the paged cache
        (one gather and one scatter for all rows and layers)."""
        assert self.buf is not None
        bs, dev = self.block_size, self.kv_cache.device
        rows, positions, slots = [], [], []
        for r, s in enumerate(self.seqs):
            start, end = self.lens[r], s.num_tokens - 1
            if start < end:
                pos = torch.arange(start, end)
                table = torch.tensor(s.block_table[: -(-end // bs)], dtype=torch.long)
                slots.append(table[pos // bs] * bs + pos % bs)
                positions.append(pos)
                rows.append(torch.full((end - start,), r, dtype=torch.long))
            self.lens[r] = s.num_tokens  # the newest token is written by this iteration
        if not slots:
            return
        slot = torch.cat(slots).to(dev)
        pos = torch.cat(positions).to(dev)
        row = torch.cat(rows).to(dev)
        layers, _, nrows, heads, cap, dim = self.buf.shape
        h = torch.arange(heads, device=dev).unsqueeze(1)
        src = (h * self.num_slots + slot).reshape(-1)  # [heads * m], head-major
        dst = ((row * heads + h) * cap + pos).reshape(-1)
        gathered = self._flat_cache.index_select(1, src)  # [layers * 2, heads * m, dim]
        self.buf.view(layers * 2, nrows * heads * cap, dim).index_copy_(1, dst, gathered)
        self.filled_tokens += slot.numel()

    def _metadata(self, lengths: list[int], groups: list[tuple[int, int]]) -> DecodeRows:
        assert self.buf is not None
        dev = self.buf.device
        _, _, _, heads, cap, _ = self.buf.shape
        n = len(lengths)
        ctx = torch.tensor(lengths, dtype=torch.long, device=dev)
        write = (
            (torch.arange(n, device=dev).unsqueeze(1) * heads + torch.arange(heads, device=dev))
            * cap
            + (ctx - 1).unsqueeze(1)
        ).reshape(-1)
        out = []
        for start, end in groups:
            longest = max(lengths[start:end])
            mask = None
            if min(lengths[start:end]) != longest:
                mask = (
                    torch.arange(longest, device=dev).unsqueeze(0) < ctx[start:end].unsqueeze(1)
                )[:, None, None, :]
            out.append((start, end, longest, mask))
        return DecodeRows(write_index=write, groups=out)


def _contiguous_groups(lengths: list[int], max_padding: float = 0.25) -> list[tuple[int, int]]:
    """Split ``lengths`` (in row order) into runs whose padded size (rows x longest) stays
    within ``1 + max_padding`` of their real size."""
    groups = []
    start, total, longest = 0, 0, 0
    for i, n in enumerate(lengths):
        m = max(longest, n)
        if i > start and (i - start + 1) * m > (1 + max_padding) * (total + n):
            groups.append((start, i))
            start, total, m = i, 0, n
        total += n
        longest = m
    groups.append((start, len(lengths)))
    return groups
