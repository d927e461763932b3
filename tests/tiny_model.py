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


CHAT_LLAMA = tiny_model(
    "llama",
    vocab_size=300,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
    eos_token_id=257,
)


def tiny_chat_model(folder):
    """A random Llama with a byte-level tokenizer that knows ChatML's two special tokens,
    saved in ``folder`` (needs torch and tokenizers)."""
    from pearl.models.config import ModelConfig
    from pearl.models.loader import build_model, save_model

    save_model(build_model(ModelConfig.from_dict(CHAT_LLAMA), seed=0), folder)
    return tiny_chat_tokenizer(folder)


def tiny_chat_tokenizer(folder):
    """Only the byte-level ChatML ``tokenizer.json`` of ``tiny_chat_model``, in ``folder``."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])  # ids 256, 257
    tok.save(str(folder / "tokenizer.json"))
    return folder
