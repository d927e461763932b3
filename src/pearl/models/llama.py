"""Llama-family models (Llama 2/3/3.1): GQA, RoPE with optional llama3 scaling, SwiGLU."""

from pearl.models.config import ModelConfig
from pearl.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    """Llama (``model_type: llama``): no q/k norm, optional attention bias."""

    def __init__(self, cfg: ModelConfig) -> None:
        assert cfg.model_type == "llama", cfg.model_type
        super().__init__(cfg)
