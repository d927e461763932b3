"""The engine interface: capabilities a policy needs, refused up front when missing."""

from __future__ import annotations

import pytest

from pearl.control.composition import ClusterLayout, ControlPlane
from pearl.control.policies import POLICIES, get_policy
from pearl.control.rollout_engine import (
    Capability,
    EngineCapabilities,
    EngineCapabilityError,
    needed_by,
    require_capabilities,
)

COLOCATED_ONLY = EngineCapabilities(
    "vllm-like", frozenset({Capability.WEIGHT_UPDATE, Capability.ITERATION_LOG})
)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_on_an_engine_that_can_do_everything(name):
    require_capabilities(get_policy(name), EngineCapabilities.full("pearl"))


@pytest.mark.parametrize("name", ["roll", "roll-large", "rlboost"])
def test_colocated_policies_without_borrowing_need_no_optional_capability(name):
    assert needed_by(get_policy(name)) == {}
    require_capabilities(get_policy(name), COLOCATED_ONLY)


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        ("static-pd", "kv_export, kv_import"),
        ("pearl-pd", "kv_export, kv_import"),
        ("pearl-ungated", "kv_export, kv_import, sleep"),
        ("pearl", "kv_export, kv_import, sleep"),
    ],
)
def test_a_policy_the_engine_cannot_serve_is_refused_with_what_is_missing(name, missing):
    with pytest.raises(EngineCapabilityError) as exc:
        require_capabilities(get_policy(name), COLOCATED_ONLY)
    message = str(exc.value)
    assert f"the vllm-like engine cannot {missing}" in message
    assert f"policy {name}" in message and "roll, rlboost" in message


def test_the_control_plane_refuses_before_it_builds_anything():
    class World:  # only what the check reads: any other access would fail the test
        capabilities = COLOCATED_ONLY

    layout = ClusterLayout(1, 2, 0, 1, 2)
    with pytest.raises(EngineCapabilityError, match="disaggregated prefill/decode"):
        ControlPlane(World(), get_policy("static-pd"), layout)  # type: ignore[arg-type]


def test_borrowing_alone_needs_sleep():
    sleepy = EngineCapabilities("no-kv", frozenset({Capability.SLEEP}))
    with pytest.raises(EngineCapabilityError, match="cannot kv_export, kv_import"):
        require_capabilities(get_policy("pearl"), sleepy)
    no_sleep = EngineCapabilities(
        "kv-only", frozenset({Capability.KV_EXPORT, Capability.KV_IMPORT})
    )
    with pytest.raises(EngineCapabilityError, match="cannot sleep.*borrows training GPUs"):
        require_capabilities(get_policy("pearl"), no_sleep)
    require_capabilities(get_policy("static-pd"), no_sleep)
