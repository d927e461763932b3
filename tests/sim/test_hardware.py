"""GPU catalog and profile files (pearl.sim.hardware, pearl.sim.cost_profile)."""

import dataclasses
import json

import pytest

from pearl.errors import ConfigError
from pearl.sim.cost_profile import PROFILE_KEYS, CostProfile, load_cost_profile, save_cost_profile
from pearl.sim.costmodel import CostConstants, WorkerLatencies
from pearl.sim.hardware import GPU_CATALOG, H100, H800, GPUSpec, get_gpu
from pearl.sim.shapes import load_model_shape


def test_catalog_has_the_required_accelerators_with_sane_orders_of_magnitude():
    for name in ("H800", "H100", "H200", "A100-80G", "B200", "cpu"):
        assert name in GPU_CATALOG
    for spec in GPU_CATALOG.values():
        if spec.name == "cpu":
            continue
        assert 1e14 < spec.peak_flops < 1e16
        assert 1e12 < spec.hbm_bandwidth_Bps < 1e13
        assert 40e9 <= spec.hbm_bytes <= 200e9
        # Per-direction NVLink is far faster than the per-GPU NIC.
        assert spec.nvlink_bandwidth_Bps > 2 * spec.network_bandwidth_Bps


def test_h800_is_an_h100_with_a_narrower_nvlink():
    assert H800.peak_flops == H100.peak_flops
    assert H800.hbm_bandwidth_Bps == H100.hbm_bandwidth_Bps
    assert H800.hbm_bytes == H100.hbm_bytes
    assert H800.nvlink_bandwidth_Bps == 200e9 < H100.nvlink_bandwidth_Bps
    assert get_gpu("H200").hbm_bandwidth_Bps > H100.hbm_bandwidth_Bps
    assert get_gpu("B200").peak_flops > 2 * H100.peak_flops


def test_lookup_is_case_insensitive_with_aliases_and_unknown_names_list_the_catalog():
    assert get_gpu("h800") is H800
    assert get_gpu("a100").name == "A100-80G"
    with pytest.raises(ConfigError, match="unknown GPU 'TPUv5'.*H800.*B200"):
        get_gpu("TPUv5")


def test_invalid_spec_names_the_field():
    with pytest.raises(ConfigError, match="hbm_bandwidth_Bps"):
        dataclasses.replace(H800, hbm_bandwidth_Bps=0.0)
    with pytest.raises(ConfigError, match="gpus_per_node"):
        dataclasses.replace(H800, gpus_per_node=2.5)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_profile_round_trip_keeps_every_value(tmp_path, suffix):
    cpu = GPUSpec("cpu", 6.1e10, 8e9, 1.2e10, 5e9, 1.25e9, 1)
    profile = CostProfile(
        gpu=cpu,
        constants=CostConstants(per_sequence_overhead_s=3e-4, linear_compute_efficiency=0.9),
        latencies=WorkerLatencies(1.0, 0.5, 0.2, 0.1),
        dtype_bytes=4,
        meta={"fitted_on": "test", "points": 12},
    )
    path = save_cost_profile(tmp_path / f"cpu{suffix}", profile)
    assert load_cost_profile(path) == profile


def test_profile_sections_are_optional_and_overrides_keep_other_defaults(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("constants:\n  iteration_overhead_s: 0.004\n")
    profile = load_cost_profile(path)
    assert profile.gpu is None and profile.latencies is None and profile.dtype_bytes is None
    assert profile.constants == CostConstants(iteration_overhead_s=0.004)
    model = load_model_shape("Qwen3-8B")
    assert profile.adapt_model(model) is model
    (tmp_path / "empty.yaml").write_text("")
    assert load_cost_profile(tmp_path / "empty.yaml") == CostProfile()


def test_profile_gpu_by_name_or_base_plus_overrides(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"gpu": "H800", "dtype_bytes": 4}))
    profile = load_cost_profile(path)
    assert profile.gpu is H800
    assert profile.adapt_model(load_model_shape("Qwen3-8B")).kv_dtype_bytes == 4
    path.write_text(json.dumps({"gpu": {"base": "H800", "network_bandwidth_Bps": 100e9}}))
    gpu = load_cost_profile(path).gpu
    assert gpu.network_bandwidth_Bps == 100e9 and gpu.nvlink_bandwidth_Bps == 200e9


def test_unknown_keys_are_rejected_with_file_key_and_valid_keys(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("constants:\n  linear_eff: 0.5\n")
    with pytest.raises(ConfigError) as info:
        load_cost_profile(path)
    message = str(info.value)
    assert str(path) in message and "'linear_eff'" in message
    assert "linear_compute_efficiency" in message
    path.write_text("gpus: H800\n")
    with pytest.raises(ConfigError, match="unknown key 'gpus'.*" + ", ".join(PROFILE_KEYS)):
        load_cost_profile(path)
    path.write_text("gpu: {name: x, peak_flops: 1.0}\n")
    with pytest.raises(ConfigError, match="missing hbm_bytes"):
        load_cost_profile(path)
    path.write_text("constants: {train_comm_overlap: 1.5}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*train_comm_overlap must be in \[0, 1\]"):
        load_cost_profile(path)
    path.write_text("latencies: {prepare_s: fast}\n")
    with pytest.raises(ConfigError, match="'prepare_s' must be a number"):
        load_cost_profile(path)
    with pytest.raises(ConfigError, match="must end in"):
        load_cost_profile(tmp_path / "p.toml")


def test_profile_latencies_reach_the_simulated_world_and_the_rest_follow_the_model(tmp_path):
    """A profile that sets only the activation time keeps the model's other latencies, and
    the simulated world pays what the profile says (it used to ignore the section)."""
    from pearl.apps.sim_build import build_cost_model
    from pearl.config.simulate import load_simulate_config

    path = tmp_path / "slow_toggle.yaml"
    path.write_text("latencies:\n  activate_s: 180.0\n")
    profile = load_cost_profile(path)
    assert profile.latency_fields == ("activate_s",)
    moe = load_model_shape("Qwen3-30B-A3B")
    lat = profile.model_latencies(moe)
    assert lat.activate_s == 180.0
    assert lat.prepare_s == WorkerLatencies.for_model(moe).prepare_s == pytest.approx(67.06)
    cfg = load_simulate_config(None, [f"cluster.profile={path}", "model.name=Qwen3-30B-A3B"])
    cost = build_cost_model(cfg)
    assert cost.worker_latencies() == lat
    # saved and loaded back, it still sets only the activation time
    assert load_cost_profile(save_cost_profile(tmp_path / "again.yaml", profile)) == profile


def test_the_no_retention_profile_cold_starts_every_activation():
    profile = load_cost_profile("paper-h800-no-retention")
    assert profile.latency_fields == ("activate_s",)
    lat = profile.model_latencies(load_model_shape("Qwen3-8B"))
    assert lat.activate_s == pytest.approx(56.29 + 11.05)
    assert lat.deactivate_s == WorkerLatencies.for_model(load_model_shape("Qwen3-8B")).deactivate_s
    assert profile.constants == load_cost_profile("paper-h800").constants
