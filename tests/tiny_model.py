"""The one tiny test model (2 layers, hidden 64, GQA 4:2, head_dim 16): a Hugging Face
config.json dictionary that tests vary field by field."""

from __future__ import annotations

from typing import Any

TINY_LAYERS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def tiny_model(model_type: str = "qwen3", **fields: Any) -> dict[str, Any]:
    """A tiny ``model_type`` config (vocabulary of 97 unless ``fields`` say otherwise)."""
    return {"model_type": model_type, "vocab_size": 97, **TINY_LAYERS, **fields}
