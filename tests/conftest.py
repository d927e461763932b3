import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Tests import ray before PEARL starts its private runtime; Ray reads this at import, and it
# keeps that runtime (and the test clusters of tests/live/test_cluster.py) on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

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
