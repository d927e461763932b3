"""Paged attention over a flat slot-indexed KV cache (torch).

The KV cache of one layer is a pair of tensors ``[num_blocks, block_size, kv_heads,
head_dim]``; a token's *slot* is ``block_id * block_size + offset``. One engine iteration runs a
flattened batch: the tokens of every prefill chunk first, then one token per
decoding sequence. ``AttentionMetadata`` says where each new token's K/V is
written and which slots each query attends to.
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
class AttentionMetadata:
    """Where to write new K/V and what each query reads, for one iteration."""

    slot_mapping: torch.Tensor  # [num_tokens] int64
    prefills: list[PrefillSegment]
    num_prefill_tokens: int
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks] int64 (padding: block 0)
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_blocks * block_size] bool, True = attend


def chunk_causal_mask(chunk_len: int, context_len: int, device: torch.device) -> torch.Tensor | None:
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
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """Store this iteration's K/V in the cache, then attend; returns ``[T, H, D]``."""
    _, block_size, kv_heads, head_dim = k_cache.shape
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    for seg in meta.prefills:
        qs, qe = seg.query_start, seg.query_end
        query = q[qs:qe].transpose(0, 1).unsqueeze(0)  # [1, H, L, D]
        if seg.causal_mask is None:
            # No prior context: the chunk's own K/V are the whole context.
            keys = k[qs:qe].transpose(0, 1).unsqueeze(0)
            values = v[qs:qe].transpose(0, 1).unsqueeze(0)
            attn = F.scaled_dot_product_attention(query, keys, values, is_causal=True, enable_gqa=True)
        else:
            n = seg.context_len
            keys = k_cache[seg.context_blocks].view(-1, kv_heads, head_dim)[:n].transpose(0, 1).unsqueeze(0)
            values = v_cache[seg.context_blocks].view(-1, kv_heads, head_dim)[:n].transpose(0, 1).unsqueeze(0)
            attn = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=seg.causal_mask, enable_gqa=True
            )
        out[qs:qe] = attn.squeeze(0).transpose(0, 1)
    if meta.decode_block_tables is not None:
        ds = meta.num_prefill_tokens
        batch = meta.decode_block_tables.shape[0]
        query = q[ds:].unsqueeze(2)  # [B, H, 1, D]
        keys = k_cache[meta.decode_block_tables].view(batch, -1, kv_heads, head_dim).transpose(1, 2)
        values = v_cache[meta.decode_block_tables].view(batch, -1, kv_heads, head_dim).transpose(1, 2)
        attn = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=meta.decode_mask, enable_gqa=True
        )
        out[ds:] = attn.squeeze(2)
    return out
