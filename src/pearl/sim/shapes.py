"""Model shapes for the cost model, read from Hugging Face ``config.json`` dictionaries.

Only what costs need: parameter counts split into dense and routed-expert weights,
active parameters per token, weight and KV-cache bytes, attention FLOPs. Works for
dense Qwen3/Qwen2/Llama configs and for MoE configs that use Qwen3-MoE's field names
(``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
``decoder_sparse_step``, ``mlp_only_layers``, ``shared_expert_intermediate_size``).
No torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pearl.errors import ConfigError
from pearl.models.config import ModelConfig

_ARCHITECTURE_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelConfig))

BF16_BYTES = 2
"""Bytes per bf16 value: the default weight and KV dtype on GPUs."""


@dataclass(slots=True, frozen=True)
class ModelShape:
    """What the cost model needs of a decoder: its parsed architecture (``ModelConfig``,
    whose fields read through: ``shape.hidden_size``), a name, the bytes per weight and per
    KV value, and the parameter and byte counts derived from them."""

    name: str
    architecture: ModelConfig
    """The parsed config.json (``pearl.models.config``): every architecture field of the
    shape (``hidden_size``, ``num_experts``, ...) is read from it."""
    dtype_bytes: int = BF16_BYTES
    """Bytes per weight value (2 for bf16; 4 for the float32 CPU engine)."""
    kv_dtype_bytes: int = BF16_BYTES
    """Bytes per cached key/value element."""

    def __getattr__(self, field: str) -> Any:
        # Only ModelConfig's fields read through (not its properties, whose CPU-engine
        # assumptions, e.g. float32 KV, are not the shape's); unpickling asks for
        # "architecture" before it is set.
        if field in _ARCHITECTURE_FIELDS:
            return getattr(self.architecture, field)
        raise AttributeError(f"{type(self).__name__} has no attribute {field!r}")

    @property
    def qk_norm(self) -> bool:
        """Per-head query/key norms (Qwen3, Qwen3-MoE): 2 x head_dim weights per layer."""
        return self.architecture.qk_norm

    def __hash__(self) -> int:  # the architecture holds a dict (rope_scaling): hash a digest
        return hash((self.name, self.dtype_bytes, self.kv_dtype_bytes, self.num_hidden_layers))

    def __post_init__(self) -> None:
        for key in ("dtype_bytes", "kv_dtype_bytes"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(
                    f"model {self.name!r}: field {key!r} must be a positive integer, got {value!r}"
                )
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ConfigError(
                    f"model {self.name!r}: num_experts_per_tok must be in 1..num_experts "
                    f"({self.num_experts}), got {self.num_experts_per_tok}"
                )
            if self.moe_intermediate_size <= 0:
                raise ConfigError(
                    f"model {self.name!r}: moe_intermediate_size must be positive for an MoE "
                    f"model, got {self.moe_intermediate_size}"
                )
        if self.dense_mlp_layers and self.intermediate_size <= 0:
            raise ConfigError(
                f"model {self.name!r}: intermediate_size must be positive "
                f"({self.dense_mlp_layers} layers have a dense MLP)"
            )

    # --- layer structure -------------------------------------------------------------

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) routes to experts (Qwen3-MoE's rule)."""
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @property
    def is_moe(self) -> bool:
        """Whether any layer is a mixture of experts."""
        return self.moe_layers > 0

    @property
    def moe_layers(self) -> int:
        """Number of MoE layers."""
        return sum(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

    @property
    def dense_mlp_layers(self) -> int:
        """Number of layers with a dense MLP."""
        return self.num_hidden_layers - self.moe_layers

    # --- parameter counts --------------------------------------------------------------

    @property
    def attention_params_per_layer(self) -> int:
        """q, k, v, o projections (+ biases, + q/k norms) of one layer."""
        h, q = self.hidden_size, self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        params = h * q + 2 * h * kv + q * h
        if self.attention_bias:
            params += q + 2 * kv
        if self.qk_norm:
            params += 2 * self.head_dim
        return params

    @property
    def expert_params_per_expert(self) -> int:
        """One routed expert's SwiGLU MLP (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def moe_dense_params_per_layer(self) -> int:
        """Always-read weights of an MoE layer's MLP block: router and shared expert."""
        h = self.hidden_size
        params = h * self.num_experts
        if self.shared_expert_intermediate_size:
            # Shared expert's SwiGLU plus its scalar gate (h -> 1), as in Qwen2-MoE.
            params += 3 * h * self.shared_expert_intermediate_size + h
        return params

    @property
    def layer_dense_params(self) -> int:
        """Decoder-layer weights every token uses (all but routed experts; no embeddings)."""
        h = self.hidden_size
        norms = 2 * h * self.num_hidden_layers
        return (
            self.attention_params_per_layer * self.num_hidden_layers
            + 3 * h * self.intermediate_size * self.dense_mlp_layers
            + self.moe_dense_params_per_layer * self.moe_layers
            + norms
        )

    @property
    def embedding_params(self) -> int:
        """Input embedding table (vocab x hidden)."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Output projection (vocab x hidden); the same matrix as the embedding when tied."""
        return self.vocab_size * self.hidden_size

    @property
    def expert_params(self) -> int:
        """All routed-expert weights (0 for a dense model)."""
        return self.moe_layers * self.num_experts * self.expert_params_per_expert

    @property
    def dense_params(self) -> int:
        """Every weight that is not a routed expert: layers, embeddings, head, final norm."""
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.layer_dense_params + self.embedding_params + head + self.hidden_size

    @property
    def total_params(self) -> int:
        """All parameters (tied embeddings counted once)."""
        return self.dense_params + self.expert_params

    @property
    def active_layer_params(self) -> int:
        """Decoder-layer weights one token multiplies by (dense + its k routed experts)."""
        routed = self.moe_layers * self.num_experts_per_tok * self.expert_params_per_expert
        return self.layer_dense_params + routed

    @property
    def active_params(self) -> int:
        """Parameters touched per token, by the usual convention (embeddings and head count)."""
        return (
            self.total_params
            - self.expert_params
            + self.moe_layers * self.num_experts_per_tok * self.expert_params_per_expert
        )

    # --- bytes and FLOPs ---------------------------------------------------------------

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights at ``dtype_bytes`` per value."""
        return self.total_params * self.dtype_bytes

    @property
    def expert_bytes_per_expert(self) -> int:
        """Bytes of one routed expert in one layer."""
        return self.expert_params_per_expert * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies (keys and values, every layer)."""
        return (
            2
            * self.num_hidden_layers
            * self.num_key_value_heads
            * self.head_dim
            * self.kv_dtype_bytes
        )

    @property
    def attention_flops_per_token_pair(self) -> int:
        """FLOPs for one query attending to one key: QK^T and PV, 2 x head_dim each, per head."""
        return 4 * self.num_hidden_layers * self.num_attention_heads * self.head_dim

    @classmethod
    def from_hf_config(
        cls,
        config: Mapping[str, Any],
        name: str | None = None,
        *,
        source: str = "<config>",
        dtype_bytes: int = BF16_BYTES,
        kv_dtype_bytes: int | None = None,
    ) -> ModelShape:
        """Build a shape from a ``config.json`` dict (parsed by ``ModelConfig``, as the live
        engine's model is); errors name ``source`` and the field."""
        parsed = ModelConfig.from_dict(config, source, for_engine=False)
        return cls.from_model_config(
            parsed, name, source=source, dtype_bytes=dtype_bytes, kv_dtype_bytes=kv_dtype_bytes
        )

    @classmethod
    def from_model_config(
        cls,
        config: ModelConfig,
        name: str | None = None,
        *,
        source: str = "<config>",
        dtype_bytes: int = BF16_BYTES,
        kv_dtype_bytes: int | None = None,
    ) -> ModelShape:
        """The shape of a parsed model config (weights and KV in ``dtype_bytes`` per value)."""
        try:
            return cls(
                name or config.name or config.model_type or "model",
                config,
                dtype_bytes,
                dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes,
            )
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from exc


# --- Catalog -------------------------------------------------------------------------------
# Each entry restates the architecture fields of the model's config.json on the Hugging
# Face Hub (Qwen/Qwen3-8B, Qwen/Qwen3-14B, Qwen/Qwen3-32B, Qwen/Qwen3-30B-A3B,
# meta-llama/Llama-3.1-8B, meta-llama/Llama-3.1-70B). Values checked against copies of
# those files. Llama configs carry no head_dim: it is hidden_size / num_attention_heads.

# max_position_embeddings: Qwen3's config.json files say 40960 (32K native plus room for
# the output; longer needs YaRN), Llama 3.1's 131072.
_QWEN3_COMMON = {
    "vocab_size": 151936,
    "head_dim": 128,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
}
_LLAMA31_COMMON = {
    "model_type": "llama",
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}

CATALOG_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen3-8B": {
        "model_type": "qwen3",
        "hidden_size": 4096,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 12288,
        **_QWEN3_COMMON,
    },
    "Qwen3-14B": {
        "model_type": "qwen3",
        "hidden_size": 5120,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "intermediate_size": 17408,
        **_QWEN3_COMMON,
    },
    "Qwen3-32B": {
        "model_type": "qwen3",
        "hidden_size": 5120,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "intermediate_size": 25600,
        **_QWEN3_COMMON,
    },
    "Qwen3-30B-A3B": {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "intermediate_size": 6144,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        **_QWEN3_COMMON,
    },
    "Llama-3.1-8B": {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        **_LLAMA31_COMMON,
    },
    "Llama-3.1-70B": {
        "hidden_size": 8192,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "intermediate_size": 28672,
        **_LLAMA31_COMMON,
    },
}
"""Architecture fields of each catalog model's config.json, by canonical name."""


def load_model_shape(
    name_or_path: str | Path, *, dtype_bytes: int = BF16_BYTES, kv_dtype_bytes: int | None = None
) -> ModelShape:
    """A catalog model by name (case-insensitive, "Qwen/" prefix allowed) or a config.json.

    A path may be the config.json file or the model folder holding it.
    """
    text = str(name_or_path)
    bare = text.rsplit("/", 1)[-1].lower()
    for key, config in CATALOG_CONFIGS.items():
        if key.lower() in (text.lower(), bare) and not Path(text).exists():
            return ModelShape.from_hf_config(
                config,
                key,
                source=f"catalog {key}",
                dtype_bytes=dtype_bytes,
                kv_dtype_bytes=kv_dtype_bytes,
            )
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(
            f"{text!r} is neither a catalog model nor an existing config.json or model folder; "
            f"catalog models: {', '.join(CATALOG_CONFIGS)}"
        )
    name = path.parent.name if path.name == "config.json" else path.stem
    parsed = ModelConfig.read(path, for_engine=False)
    return ModelShape.from_model_config(
        parsed, name, source=str(path), dtype_bytes=dtype_bytes, kv_dtype_bytes=kv_dtype_bytes
    )
