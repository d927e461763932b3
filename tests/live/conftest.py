"""Fixtures of the live tests."""

import pytest


@pytest.fixture(scope="module")
def three_slots():
    """A private Ray runtime of three CPU slots (two trainer processes and the driver's)."""
    ray = pytest.importorskip("ray")
    from pearl.live.cluster import ensure_ray

    if ray.is_initialized():
        ray.shutdown()
    ensure_ray(num_cpus=3)
    yield ray
    ray.shutdown()
