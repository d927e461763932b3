import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from tiny_model import tiny_model  # noqa: E402

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # the pure-Python parts are tested without torch too
    torch = None


@pytest.fixture
def tiny_config():
    from pearl.models.config import ModelConfig

    return ModelConfig.from_dict(tiny_model(max_position_embeddings=1024, tie_word_embeddings=True))
