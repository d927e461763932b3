"""A decoder-only transformer for paged attention, shared by Qwen3 and Llama.

Parameter names follow Hugging Face (``model.layers.0.self_attn.q_proj.weight``),
so a checkpoint's state dict loads without renaming. Inputs are a flat batch of
tokens (see ``pearl.models.attention``), not a padded ``[batch, seq]`` tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pearl.models.attention import AttentionMetadata, paged_attention
from pearl.models.config import ModelConfig
from pearl.models.layers import Linear, RMSNorm, RotaryEmbedding, SwiGLU


class Attention(nn.Module):
    """Grouped-query attention with optional per-head q/k RMSNorm (Qwen3)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        h, q, kv = (
            cfg.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        self.q_proj = Linear(h, q, bias=cfg.attention_bias)
        self.k_proj = Linear(h, kv, bias=cfg.attention_bias)
        self.v_proj = Linear(h, kv, bias=cfg.attention_bias)
        self.o_proj = Linear(q, h, bias=cfg.attention_bias)  # HF Llama/Qwen3: o_proj too
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(positions, q, k)
        out = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, *kv_cache[2:])
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))

    def dense(self, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding):
        """Causal self-attention over a padded batch ``x [B, L, hidden]`` without a KV cache
        (training); right padding never reaches a real token."""
        return self._batched(x, positions.repeat(x.shape[0]), rotary, None)

    def tree(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        allowed: torch.Tensor,
    ) -> torch.Tensor:
        """Self-attention over ``x [B, L, hidden]`` under an explicit mask ``allowed
        [B, L, L]`` (query, key) with each token's own ``positions [B, L]``: the trainer's
        prefix-tree rows (``pearl.live.packing``), where several sequences share a prefix."""
        return self._batched(x, positions.reshape(-1), rotary, allowed)

    def _batched(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,  # [B * L]
        rotary: RotaryEmbedding,
        allowed: torch.Tensor | None,  # [B, L, L], or None for causal
    ) -> torch.Tensor:
        b, length, _ = x.shape
        n = b * length
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, length, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(positions, q, k)
        q = q.view(b, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        mask = None if allowed is None else allowed.unsqueeze(1)
        out = F.scaled_dot_product_attention(
            q, k, v.transpose(1, 2), attn_mask=mask, is_causal=allowed is None, enable_gqa=True
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, length, -1))


class DecoderLayer(nn.Module):
    """Pre-norm attention block followed by a pre-norm SwiGLU block."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, positions, rotary, kv_cache, meta):
        x = x + self.self_attn(self.input_layernorm(x), positions, rotary, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))

    def dense(self, x, positions, rotary):
        x = x + self.self_attn.dense(self.input_layernorm(x), positions, rotary)
        return x + self.mlp(self.post_attention_layernorm(x))

    def tree(self, x, positions, rotary, allowed):
        x = x + self.self_attn.tree(self.input_layernorm(x), positions, rotary, allowed)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderBody(nn.Module):
    """Embeddings, layers and final norm (``model.*`` in Hugging Face names)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderForCausalLM(nn.Module):
    """Causal LM over a paged KV cache: ``forward`` returns hidden states of the flat batch."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderBody(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(
            cfg.head_dim, cfg.context_limit, cfg.rope_theta, cfg.rope_scaling
        )

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        for layer, cache in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, positions, self.rotary, cache, meta)
        return self.model.norm(x)

    def forward_dense(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[B, L, hidden]`` of a right-padded batch ``[B, L]`` (training and
        scoring: full causal attention, no KV cache)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer.dense(x, positions, self.rotary)
        return self.model.norm(x)

    def forward_tree(
        self, input_ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``[B, L, hidden]`` of rows ``input_ids [B, L]`` whose tokens carry
        their own ``positions`` and attend where ``allowed [B, L, L]`` says: with a causal
        mask and ``arange`` positions, ``forward_dense``; with a prefix tree
        (``pearl.live.packing``), every sequence's hidden states as if run alone."""
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer.tree(x, positions, self.rotary, allowed)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits for the given hidden states ``[n, hidden]``."""
        return self.lm_head(hidden).float()
