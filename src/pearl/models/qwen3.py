"""Qwen3 dense models: GQA with per-head q/k RMSNorm before RoPE, SwiGLU, optional tied embeddings."""

from pearl.models.config import ModelConfig
from pearl.models.decoder import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    """Qwen3 (``model_type: qwen3``); the q/k norms come from ``ModelConfig.qk_norm``."""

    def __init__(self, cfg: ModelConfig) -> None:
        assert cfg.model_type == "qwen3", cfg.model_type
        super().__init__(cfg)
