"""Model configuration read from a Hugging Face ``config.json`` (pure Python, no torch)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl.errors import ConfigError

SUPPORTED_MODEL_TYPES = ("qwen3", "llama")


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """The architecture fields PEARL's models need, named as in Hugging Face configs."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    eos_token_id: tuple[int, ...] = field(default_factory=tuple)

    @property
    def qk_norm(self) -> bool:
        """Qwen3 normalizes queries and keys per head before RoPE; Llama does not."""
        return self.model_type == "qwen3"

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token in float32 (keys and values, all layers)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 4

    def num_parameters(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        if self.attention_bias:
            attn += q + 2 * kv + h  # q, k, v and o biases
        if self.qk_norm:
            attn += 2 * self.head_dim
        layer = attn + 3 * h * i + 2 * h
        embed = v * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embed + h

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "<dict>") -> ModelConfig:
        """Validate a config.json dictionary; errors name the field and the source."""
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"{source}: model_type {model_type!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        required = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
        )
        for key in required:
            value = raw.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(
                    f"{source}: field {key!r} must be a positive integer, got {value!r}"
                )
        heads = raw["num_attention_heads"]
        kv_heads = raw.get("num_key_value_heads") or heads
        if not isinstance(kv_heads, int) or kv_heads <= 0 or heads % kv_heads != 0:
            raise ConfigError(
                f"{source}: num_key_value_heads {kv_heads!r} must be a positive divisor of "
                f"num_attention_heads {heads}"
            )
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
            raise ConfigError(f"{source}: head_dim {head_dim!r} must be a positive even integer")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{source}: hidden_act {act!r} is not supported; supported: silu")
        rope_theta = raw.get("rope_theta")
        rope_scaling = raw.get("rope_scaling")
        # transformers >= 5 writes both under ``rope_parameters`` instead.
        rope_params = raw.get("rope_parameters")
        if rope_params is not None:
            if not isinstance(rope_params, dict):
                raise ConfigError(
                    f"{source}: rope_parameters must be an object, got {rope_params!r}"
                )
            if rope_theta is None:
                rope_theta = rope_params.get("rope_theta")
            if rope_scaling is None and rope_params.get(
                "rope_type", rope_params.get("type")
            ) not in (None, "default"):
                rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if rope_theta is None:
            rope_theta = 10000.0
        if rope_scaling is not None:
            if not isinstance(rope_scaling, dict):
                raise ConfigError(
                    f"{source}: rope_scaling must be an object or null, got {rope_scaling!r}"
                )
            kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
            if kind not in ("default", "llama3"):
                raise ConfigError(
                    f"{source}: rope_scaling type {kind!r} is not supported; "
                    "supported: default, llama3"
                )
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
        return cls(
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            hidden_act=act,
            eos_token_id=eos_ids,
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        """Read ``<folder>/config.json``."""
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path}: no config.json in model folder {folder}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a JSON object")
        return cls.from_dict(raw, source=str(path))

    def to_hf_dict(self) -> dict[str, Any]:
        """The config as a Hugging Face ``config.json`` dictionary."""
        arch = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[self.model_type]
        out: dict[str, Any] = {
            "architectures": [arch],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": self.hidden_act,
            "torch_dtype": "float32",
        }
        if self.eos_token_id:
            out["eos_token_id"] = list(self.eos_token_id)
        return out
