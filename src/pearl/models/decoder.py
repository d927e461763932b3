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
from pearl.models.layers import RMSNorm, RotaryEmbedding, SwiGLU


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
        self.q_proj = nn.Linear(h, q, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, kv, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, kv, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q, h, bias=cfg.attention_bias)  # HF Llama/Qwen3: o_proj too
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
        b, length, _ = x.shape
        n = b * length
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, length, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(positions.repeat(b), q, k)
        q = q.view(b, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q, k, v.transpose(1, 2), is_causal=True, enable_gqa=True
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, length, -1))

    def shared(
        self, xp: torch.Tensor, xs: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal attention for G sequences that share a prefix, the prefix computed once:
        ``xp [1, P, hidden]`` the prefix, ``xs [G, S, hidden]`` the right-padded suffixes,
        ``positions [P + S]``. Suffix tokens attend to the whole prefix and causally among
        themselves, exactly as in ``dense`` on the concatenated sequences; gradients from
        every suffix reach the one prefix."""
        p_len, (g, s_len, _) = xp.shape[1], xs.shape
        x = torch.cat([xp.reshape(p_len, -1), xs.reshape(g * s_len, -1)])
        q = self.q_proj(x).view(-1, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        pos = torch.cat([positions[:p_len], positions[p_len:].repeat(g)])
        q, k = rotary(pos, q, k)

        def heads(t: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
            prefix = t[:p_len].view(1, p_len, n, self.head_dim).transpose(1, 2)
            suffix = t[p_len:].view(g, s_len, n, self.head_dim).transpose(1, 2)
            return prefix, suffix

        (qp, qs), (kp, ks), (vp, vs) = (
            heads(q, self.num_heads),
            heads(k, self.num_kv_heads),
            heads(v, self.num_kv_heads),
        )
        out_p = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
        keys = torch.cat([kp.expand(g, -1, -1, -1), ks], dim=2)
        values = torch.cat([vp.expand(g, -1, -1, -1), vs], dim=2)
        allowed = torch.ones(s_len, p_len + s_len, dtype=torch.bool, device=xs.device)
        allowed[:, p_len:] = torch.tril(allowed[:, p_len:])
        out_s = F.scaled_dot_product_attention(qs, keys, values, attn_mask=allowed, enable_gqa=True)
        return (
            self.o_proj(out_p.transpose(1, 2).reshape(1, p_len, -1)),
            self.o_proj(out_s.transpose(1, 2).reshape(g, s_len, -1)),
        )


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

    def shared(self, xp, xs, positions, rotary):
        ap, as_ = self.self_attn.shared(
            self.input_layernorm(xp), self.input_layernorm(xs), positions, rotary
        )
        xp, xs = xp + ap, xs + as_
        return xp + self.mlp(self.post_attention_layernorm(xp)), xs + self.mlp(
            self.post_attention_layernorm(xs)
        )


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
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
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

    def forward_shared(self, prefix_ids: torch.Tensor, suffix_ids: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[G, P + S, hidden]`` of G sequences ``prefix_ids [P]`` +
        ``suffix_ids [G, S]`` (right-padded), the shared prefix computed once: equal to
        ``forward_dense`` on the concatenated batch, at the cost of P + G * S tokens instead
        of G * (P + S). GRPO's G trajectories of one task share their prompt."""
        p_len, (g, s_len) = prefix_ids.shape[0], suffix_ids.shape
        positions = torch.arange(p_len + s_len, device=suffix_ids.device)
        xp = self.model.embed_tokens(prefix_ids).unsqueeze(0)
        xs = self.model.embed_tokens(suffix_ids)
        for layer in self.model.layers:
            xp, xs = layer.shared(xp, xs, positions, self.rotary)
        return torch.cat([self.model.norm(xp).expand(g, -1, -1), self.model.norm(xs)], dim=1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits for the given hidden states ``[n, hidden]``."""
        return self.lm_head(hidden).float()
