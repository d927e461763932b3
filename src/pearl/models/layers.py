"""Building blocks shared by the decoder models: linear layers, RMSNorm, rotary embedding,
SwiGLU MLP."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same names) that an inference engine on the CPU can
    switch to oneDNN's GEMM with its weight reordered once into the kernel's blocked layout
    (``prepack``), as vLLM's CPU build and torch.compile's CPU freezing do: 1.2-2.5x faster
    per multiplication at decode batch sizes than the plain ``F.linear`` (MKL) on
    SmolLM2-135M's shapes (``benchmarks/engine_vs_vllm.py``). The reordered copy costs the
    weight's memory again. It is redone lazily whenever the weight changed since (an
    in-place update bumps the tensor's version; a new ``.data`` moves its pointer), so new
    weights are never served stale; under autograd, on another device or dtype, the
    layer is a plain ``nn.Linear``."""

    prepacked: bool = False  # set by ``prepack``; the trainer's models never are
    # (reordered weight, the weight's version then, the weight then): the last holds the
    # packed weight's storage alive, so a replacement can never reuse its address
    _packed: tuple[torch.Tensor, int, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if not self.prepacked or torch.is_grad_enabled() and (w.requires_grad or x.requires_grad):
            return F.linear(x, w, self.bias)  # oneDNN's prepacked GEMM has no backward
        if not (w.device.type == "cpu" and w.dtype in _PACKABLE_DTYPES and x.dtype == w.dtype):
            return F.linear(x, w, self.bias)
        packed = self._packed
        if packed is None or packed[1] != w._version or packed[2].data_ptr() != w.data_ptr():
            source = w.detach()
            reordered = torch.ops.mkldnn._reorder_linear_weight(source, _PACK_BATCH_HINT)
            packed = self._packed = (reordered, w._version, source)
        return torch.ops.mkldnn._linear_pointwise(x, packed[0], self.bias, "none", [], "")

    def drop_packed(self) -> None:
        """Free the reordered copy (an engine going to sleep); rebuilt at the next call."""
        self._packed = None


# The batch the reordered layout is tuned for (it serves any batch): a decode step's.
_PACK_BATCH_HINT = 32
_PACKABLE_DTYPES = (torch.float32,)


def prepack_available() -> bool:
    """Whether this torch can reorder weights for oneDNN (CPU builds with mkldnn)."""
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


def prepack(model: nn.Module, enabled: bool = True) -> int:
    """Switch every ``Linear`` of ``model`` to (or, ``enabled=False``, back from) oneDNN's
    prepacked GEMM; returns how many layers were switched (0 where torch lacks it)."""
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    enabled = enabled and prepack_available()
    for layer in layers:
        layer.prepacked = enabled
        layer.drop_packed()
    return len(layers) if enabled else 0


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as Qwen3 and Llama define it."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None
) -> torch.Tensor:
    """Per-pair rotation frequencies, with Llama-3's long-context rescaling if configured."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        return inv_freq
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables indexed by absolute token position (rotate-half layout)."""

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None
    ):
        super().__init__()
        inv_freq = rope_inverse_frequencies(head_dim, theta, scaling)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """Rotate ``q [T, H, D]`` and ``k [T, KVH, D]`` by their positions ``[T]``."""
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class SwiGLU(nn.Module):
    """The gated MLP: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, bias=False)
        self.up_proj = Linear(hidden, intermediate, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
