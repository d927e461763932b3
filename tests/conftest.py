import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # the pure-Python parts are tested without torch too
    torch = None


@pytest.fixture
def tiny_config():
    from pearl.models.config import ModelConfig

    return ModelConfig.from_dict(
        {
            "model_type": "qwen3",
            "vocab_size": 97,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 1024,
            "tie_word_embeddings": True,
        }
    )
