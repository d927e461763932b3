"""Paged attention over a flat slot-indexed KV cache (torch).

The KV cache of one layer is a pair of tensors ``[kv_heads, num_blocks, block_size,
head_dim]`` (head-first, so a gathered context is contiguous per head, which the CPU
attention kernel reads ~1.7x faster); a token's *slot* is ``block_id * block_size + offset``. One engine iteration runs a
flattened batch: the tokens of every prefill chunk first, then one token per
decoding sequence. ``AttentionMetadata`` says where each new token's K/V is
written and which slots each query attends to.

Decodes normally read contiguous per-sequence K/V rows kept by the engine
(``DecodeRows``, ``pearl.engine.decode_kv``): the new token's K/V is written to its row as
well as to the paged cache, and attention reads the rows as views, so no layer copies a
context. Without rows (``DecodeGroup``) every layer gathers the sequences' blocks first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class PrefillSegment:
    """One prefill chunk: queries ``[query_start, query_end)`` of the flat batch.

    The sequence's context up to and including the chunk is ``context_len`` tokens
    held in ``context_blocks``; ``context_len - chunk_len`` tokens precede the chunk.
    """

    query_start: int
    query_end: int
    context_len: int
    context_blocks: torch.Tensor | None  # [num_blocks] int64; None if no prior context
    causal_mask: torch.Tensor | None  # [chunk_len, context_len] bool; None if no prior context


@dataclass(slots=True)
class DecodeGroup:
    """Decode rows ``[row_start, row_end)`` (after the prefill tokens) attending to
    ``block_tables`` (padded with block 0) under ``mask`` (True = attend)."""

    row_start: int
    row_end: int
    block_tables: torch.Tensor  # [rows, max_blocks] int64
    mask: torch.Tensor  # [rows, 1, 1, max_blocks * block_size] bool


@dataclass(slots=True)
class DecodeRows:
    """Decodes whose K/V live in contiguous per-sequence rows (``pearl.engine.decode_kv``):
    decode row ``r`` of the flat batch (after the prefill tokens) is row ``r`` of each
    layer's row buffers ``[rows, kv_heads, capacity, head_dim]``."""

    # Where each (row, kv head) new K/V goes in a row buffer viewed as
    # [rows * kv_heads * capacity, head_dim]: [num_decodes * kv_heads] int64.
    write_index: torch.Tensor
    # (row_start, row_end, context length, mask [rows, 1, 1, length] bool or None if every
    # row of the group has that length): rows of similar length attend together.
    groups: list[tuple[int, int, int, torch.Tensor | None]]


@dataclass(slots=True)
class AttentionMetadata:
    """Where to write new K/V and what each query reads, for one iteration."""

    slot_mapping: torch.Tensor  # [num_tokens] int64
    prefills: list[PrefillSegment]
    num_prefill_tokens: int
    # Decodes in groups of similar context length (rows of the flat batch after the
    # prefill tokens), so padding to a group's longest context wastes little.
    decode_groups: list[DecodeGroup]
    workspace: GatherWorkspace | None = (
        None  # reused gather buffers (fresh large tensors page-fault)
    )
    # Set instead of ``decode_groups`` when the decodes read per-sequence K/V rows (the
    # layer's cache tuple then carries the row buffers as its third and fourth items).
    decode_rows: DecodeRows | None = None


class GatherWorkspace:
    """Two growable buffers that gathered K and V blocks are copied into, reused across
    layers and iterations: allocating them afresh each time costs more than the copy."""

    def __init__(self) -> None:
        self._k = torch.empty(0)
        self._v = torch.empty(0)

    def buffers(self, cache: torch.Tensor, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv_heads, _, block_size, head_dim = cache.shape
        shape = (kv_heads, num_blocks, block_size, head_dim)
        need = kv_heads * num_blocks * block_size * head_dim
        if self._k.numel() < need or self._k.dtype != cache.dtype or self._k.device != cache.device:
            self._k = torch.empty(int(need * 1.25), dtype=cache.dtype, device=cache.device)
            self._v = torch.empty_like(self._k)
        return self._k[:need].view(shape), self._v[:need].view(shape)


def chunk_causal_mask(
    chunk_len: int, context_len: int, device: torch.device
) -> torch.Tensor | None:
    """Mask letting query i of a chunk see every prior token and the chunk up to i."""
    if chunk_len == context_len:
        return None
    prior = context_len - chunk_len
    q_pos = torch.arange(chunk_len, device=device).unsqueeze(1) + prior
    k_pos = torch.arange(context_len, device=device).unsqueeze(0)
    return k_pos <= q_pos


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,  # [T, KVH, D]
    k_cache: torch.Tensor,  # [KVH, num_blocks, block_size, D]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    k_rows: torch.Tensor | None = None,  # [rows, KVH, capacity, D] (with meta.decode_rows)
    v_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Store this iteration's K/V in the cache, then attend; returns ``[T, H, D]``."""
    kv_heads, _, _, head_dim = k_cache.shape
    k_cache.view(kv_heads, -1, head_dim).index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    v_cache.view(kv_heads, -1, head_dim).index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
    drows = meta.decode_rows
    if drows is not None:
        assert k_rows is not None and v_rows is not None
        ds = meta.num_prefill_tokens
        # The decodes' new K/V also go to their rows, which then hold each whole context.
        k_rows.view(-1, head_dim).index_copy_(0, drows.write_index, k[ds:].reshape(-1, head_dim))
        v_rows.view(-1, head_dim).index_copy_(0, drows.write_index, v[ds:].reshape(-1, head_dim))
    out = torch.empty_like(q)
    _attend_prefills(q, k, v, k_cache, v_cache, meta, out)
    _attend_decodes(q, k_cache, v_cache, meta, out)
    if drows is not None:
        assert k_rows is not None and v_rows is not None
        _attend_decode_rows(q, k_rows, v_rows, drows, meta.num_prefill_tokens, out)
    return out


def _attend_prefills(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    out: torch.Tensor,
) -> None:
    """Each prefill chunk attends causally to its prior context and itself, into ``out``."""
    for seg in meta.prefills:
        qs, qe = seg.query_start, seg.query_end
        query = q[qs:qe].transpose(0, 1).unsqueeze(0)  # [1, H, L, D]
        if seg.causal_mask is None:
            # No prior context: the chunk's own K/V are the whole context.
            keys = k[qs:qe].transpose(0, 1).unsqueeze(0)
            values = v[qs:qe].transpose(0, 1).unsqueeze(0)
            attn = F.scaled_dot_product_attention(
                query, keys, values, is_causal=True, enable_gqa=True
            )
        else:
            n = seg.context_len
            keys, values = _gather(k_cache, v_cache, seg.context_blocks, meta.workspace)
            keys = keys[:, :n].unsqueeze(0)  # [1, KVH, n, D]
            values = values[:, :n].unsqueeze(0)
            attn = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=seg.causal_mask, enable_gqa=True
            )
        out[qs:qe] = attn.squeeze(0).transpose(0, 1)


def _attend_decodes(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    out: torch.Tensor,
) -> None:
    """The decode groups attend to their contexts gathered from the paged cache."""
    kv_heads, _, _, head_dim = k_cache.shape
    ds = meta.num_prefill_tokens
    num_heads = q.shape[1]
    for group in meta.decode_groups:
        rows = group.row_end - group.row_start
        # One query token per sequence: the heads sharing a KV head act as that group's
        # query rows, so no K/V expansion is needed for GQA.
        query = q[ds + group.row_start : ds + group.row_end].view(
            rows, kv_heads, num_heads // kv_heads, head_dim
        )
        keys, values = _gather(k_cache, v_cache, group.block_tables.reshape(-1), meta.workspace)
        keys = keys.view(kv_heads, rows, -1, head_dim).transpose(0, 1)  # [rows, KVH, L, D]
        values = values.view(kv_heads, rows, -1, head_dim).transpose(0, 1)
        attn = F.scaled_dot_product_attention(query, keys, values, attn_mask=group.mask)
        out[ds + group.row_start : ds + group.row_end] = attn.reshape(rows, num_heads, head_dim)


def _attend_decode_rows(
    q: torch.Tensor,
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    drows: DecodeRows,
    ds: int,  # the first decode's token index (after the prefills')
    out: torch.Tensor,
) -> None:
    """The decodes kept in per-sequence rows attend to them in place (no gather)."""
    _, kv_heads, _, head_dim = k_rows.shape
    num_heads = q.shape[1]
    group_size = num_heads // kv_heads
    for start, end, length, mask in drows.groups:
        n = end - start
        query = q[ds + start : ds + end].view(n, kv_heads, group_size, head_dim)
        attn = F.scaled_dot_product_attention(
            query,
            k_rows[start:end, :, :length],  # views: no copy of the context
            v_rows[start:end, :, :length],
            attn_mask=mask,
        )
        out[ds + start : ds + end] = attn.reshape(n, num_heads, head_dim)


def _gather(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    blocks: torch.Tensor,
    workspace: GatherWorkspace | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of ``blocks`` as ``[kv_heads, len(blocks) * block_size, head_dim]``.

    ``index_select`` into a reused buffer: several times faster on CPU than advanced
    indexing, which allocates (and page-faults) a new tensor each call.
    """
    kv_heads, _, _, head_dim = k_cache.shape
    if workspace is None:
        keys, values = k_cache.index_select(1, blocks), v_cache.index_select(1, blocks)
    else:
        keys, values = workspace.buffers(k_cache, blocks.shape[0])
        torch.index_select(k_cache, 1, blocks, out=keys)
        torch.index_select(v_cache, 1, blocks, out=values)
    return keys.view(kv_heads, -1, head_dim), values.view(kv_heads, -1, head_dim)
