"""Model configuration read from a Hugging Face ``config.json`` (pure Python, no torch)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl.errors import ConfigError

DEFAULT_CONTEXT = 4096
"""The live engine's context limit for a config that does not declare one."""
_QK_NORM_TYPES = ("qwen3", "qwen3_moe")
"""Model types that normalize queries and keys per head (2 x head_dim extra weights/layer)."""
_QKV_BIAS_TYPES = ("qwen2", "qwen2_moe")
"""Model types whose q/k/v projections carry a bias even without ``attention_bias``."""

SUPPORTED_MODEL_TYPES = ("qwen3", "llama")
"""Model types the live engine's decoder implements (the simulator reads any decoder)."""


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """A decoder's architecture, named as in Hugging Face configs: the one parse of a
    ``config.json`` behind the live engine's model and the simulator's ``ModelShape``."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int | None = None
    """The model's own context limit; a config that does not say gets ``DEFAULT_CONTEXT``
    for the live engine and None for the simulator (which then checks no limit)."""
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    eos_token_id: tuple[int, ...] = field(default_factory=tuple)
    # Mixture of experts (Qwen3-MoE's field names); the simulator's cost model reads them.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0
    name: str = ""
    """``_name_or_path`` when the config has one."""

    @property
    def context_limit(self) -> int:
        """The longest sequence the model takes: ``max_position_embeddings``, else 4096."""
        return self.max_position_embeddings or DEFAULT_CONTEXT

    @property
    def qk_norm(self) -> bool:
        """Qwen3 normalizes queries and keys per head before RoPE; Llama does not."""
        return self.model_type in _QK_NORM_TYPES

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token in float32 (keys and values, all layers)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 4

    def num_parameters(self) -> int:
        """Parameter count of a dense model (embeddings counted once when tied)."""
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
    def from_dict(
        cls, raw: Mapping[str, Any], source: str = "<dict>", *, for_engine: bool = True
    ) -> ModelConfig:
        """Validate a config.json dictionary; errors name the field and the source. With
        ``for_engine`` (the live engine) the architecture must be one our decoder
        implements; without it (the simulator's cost model) any decoder-only config is
        read, MoE included, and a multimodal wrapper's ``text_config``."""
        raw, model_type = _text_model(raw, source, for_engine)

        def integer(key: str, default: int | None = None, minimum: int = 1) -> int:
            return _integer(raw, source, key, default, minimum)

        heads, kv_heads, head_dim = _attention_heads(raw, source, for_engine)
        moe = _moe_fields(raw, source, for_engine)
        act = raw.get("hidden_act", "silu")
        if for_engine and act != "silu":
            raise ConfigError(f"{source}: hidden_act {act!r} is not supported; supported: silu")
        rope_theta, rope_scaling = _rope(raw, source, for_engine)
        attention_bias = raw.get("attention_bias")
        if attention_bias is None:
            attention_bias = model_type in _QKV_BIAS_TYPES
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
        context = raw.get("max_position_embeddings")
        if context is None and for_engine:
            context = DEFAULT_CONTEXT  # the engine needs a number; the simulator keeps None
        return cls(
            model_type=str(model_type or ""),
            vocab_size=integer("vocab_size"),
            hidden_size=integer("hidden_size"),
            intermediate_size=integer(
                "intermediate_size", None if for_engine else 0, minimum=1 if for_engine else 0
            ),
            num_hidden_layers=integer("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=None
            if context is None
            else integer("max_position_embeddings", context),
            rms_norm_eps=_number(raw, source, "rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(attention_bias),
            hidden_act=str(act),
            eos_token_id=eos_ids,
            **moe,
            name=str(raw.get("_name_or_path") or ""),
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

    @classmethod
    def read(cls, path: str | Path, *, for_engine: bool = True) -> ModelConfig:
        """Read a ``config.json`` file, or the one in a model folder."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path}: no config.json there")
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
        return cls.from_dict(raw, source=str(path), for_engine=for_engine)

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
            "max_position_embeddings": self.context_limit,
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


def _rope(raw: Mapping[str, Any], source: str, for_engine: bool) -> tuple[float, dict | None]:
    """``rope_theta`` and ``rope_scaling`` (transformers >= 5 writes both under
    ``rope_parameters``); the engine implements default and llama3 scaling."""
    if not for_engine:  # the cost model does not read the rotary embedding
        return 10000.0, None
    rope_theta = raw.get("rope_theta")
    rope_scaling = raw.get("rope_scaling")
    rope_params = raw.get("rope_parameters")
    if rope_params is not None:
        if not isinstance(rope_params, dict):
            raise ConfigError(f"{source}: rope_parameters must be an object, got {rope_params!r}")
        if rope_theta is None:
            rope_theta = rope_params.get("rope_theta")
        if rope_scaling is None and rope_params.get("rope_type", rope_params.get("type")) not in (
            None,
            "default",
        ):
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
                f"{source}: rope_scaling type {kind!r} is not supported; supported: default, llama3"
            )
    return float(rope_theta), rope_scaling


def _integer(
    raw: Mapping[str, Any], source: str, key: str, default: int | None = None, minimum: int = 1
) -> int:
    """Field ``key`` as an integer >= ``minimum`` (``default`` when absent; None: required)."""
    value = raw.get(key)
    if value is None:  # absent or null
        value = default
    if value is None:
        raise ConfigError(f"{source}: required field {key!r} is missing")
    if isinstance(value, float) and value.is_integer():  # 4096.0 in a hand-written config
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{source}: field {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _number(raw: Mapping[str, Any], source: str, key: str, default: float) -> float:
    """Field ``key`` as a float (``default`` when absent or null)."""
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{source}: field {key!r} must be a number, got {value!r}")
    return float(value)


def _text_model(
    raw: Mapping[str, Any], source: str, for_engine: bool
) -> tuple[Mapping[str, Any], Any]:
    """The decoder's own fields (a multimodal wrapper's ``text_config`` for the simulator)
    and its ``model_type``, refused where the engine has no decoder for it or where MoE
    fields carry Mixtral's names."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    outer = raw
    if not for_engine and "hidden_size" not in raw and isinstance(raw.get("text_config"), Mapping):
        raw = raw["text_config"]
    model_type = raw.get("model_type", outer.get("model_type"))
    if for_engine and model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{source}: model_type {model_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if "num_local_experts" in raw and "num_experts" not in raw:
        raise ConfigError(
            f"{source}: MoE fields named as Mixtral's (num_local_experts) are not "
            "supported; use Qwen3-MoE's names: num_experts, num_experts_per_tok, "
            "moe_intermediate_size"
        )
    return raw, model_type


def _attention_heads(raw: Mapping[str, Any], source: str, for_engine: bool) -> tuple[int, int, int]:
    """(query heads, KV heads dividing them, head_dim: hidden / heads by default; even for
    the engine's rotary embedding)."""
    heads = _integer(raw, source, "num_attention_heads")
    hidden = _integer(raw, source, "hidden_size")
    kv_heads = raw.get("num_key_value_heads") or heads
    if not isinstance(kv_heads, int) or kv_heads <= 0 or heads % kv_heads != 0:
        raise ConfigError(
            f"{source}: num_key_value_heads {kv_heads!r} must be a positive divisor of "
            f"num_attention_heads {heads}"
        )
    head_dim = raw.get("head_dim") or hidden // heads
    if not isinstance(head_dim, int) or head_dim <= 0 or (for_engine and head_dim % 2):
        raise ConfigError(f"{source}: head_dim {head_dim!r} must be a positive even integer")
    return heads, kv_heads, head_dim


def _moe_fields(raw: Mapping[str, Any], source: str, for_engine: bool) -> dict[str, Any]:
    """The mixture-of-experts fields (Qwen3-MoE's names); the live engine takes none."""
    num_experts = _integer(raw, source, "num_experts", 0, minimum=0)
    if for_engine and num_experts:
        raise ConfigError(
            f"{source}: mixture-of-experts models ({num_experts} experts) run in the "
            "simulator only; the live engine's decoder is dense"
        )
    mlp_only = raw.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list | tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in mlp_only
    ):
        raise ConfigError(
            f"{source}: field 'mlp_only_layers' must be a list of layer indexes, got {mlp_only!r}"
        )

    def expert(key: str) -> int:
        return _integer(raw, source, key, 0, minimum=0) if num_experts else 0

    return {
        "num_experts": num_experts,
        "num_experts_per_tok": expert("num_experts_per_tok"),
        "moe_intermediate_size": expert("moe_intermediate_size"),
        "decoder_sparse_step": _integer(raw, source, "decoder_sparse_step", 1),
        "mlp_only_layers": tuple(mlp_only),
        "shared_expert_intermediate_size": expert("shared_expert_intermediate_size"),
    }
