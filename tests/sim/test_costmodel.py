"""Model shapes and the iteration/training cost model (pearl.sim.shapes, pearl.sim.costmodel)."""

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.errors import ConfigError
from pearl.sim.costmodel import MEASURED_LATENCIES, CostConstants, CostModel, WorkerLatencies
from pearl.sim.hardware import H800, get_gpu
from pearl.sim.shapes import CATALOG_CONFIGS, ModelShape, load_model_shape

QWEN8 = load_model_shape("Qwen3-8B")
MOE = load_model_shape("Qwen3-30B-A3B")
FAST = settings(max_examples=100, deadline=None)

contexts = st.lists(st.integers(1, 65536), max_size=48)
prefills = st.lists(st.tuples(st.integers(1, 8192), st.integers(0, 32768)), max_size=4)
models = st.sampled_from([QWEN8, MOE])
tps = st.sampled_from([1, 2, 4])


# --- model shapes ------------------------------------------------------------------------


def test_catalog_parameter_counts_match_the_published_sizes():
    assert QWEN8.total_params == pytest.approx(8.19e9, rel=0.01)
    assert load_model_shape("Qwen3-14B").total_params == pytest.approx(14.8e9, rel=0.01)
    assert load_model_shape("Qwen3-32B").total_params == pytest.approx(32.8e9, rel=0.01)
    assert load_model_shape("Llama-3.1-8B").total_params == pytest.approx(8.03e9, rel=0.01)
    assert load_model_shape("Llama-3.1-70B").total_params == pytest.approx(70.6e9, rel=0.01)
    assert MOE.total_params == pytest.approx(30.5e9, rel=0.01)
    assert MOE.active_params == pytest.approx(3.3e9, rel=0.03)
    assert QWEN8.active_params == QWEN8.total_params


def test_shape_derived_quantities():
    # Qwen3-8B: 36 layers x 8 KV heads x 128 x (K and V) x 2 bytes.
    assert QWEN8.kv_bytes_per_token == 36 * 8 * 128 * 2 * 2
    assert MOE.kv_bytes_per_token == 48 * 4 * 128 * 2 * 2
    assert QWEN8.attention_flops_per_token_pair == 4 * 36 * 32 * 128
    assert QWEN8.weight_bytes == 2 * QWEN8.total_params
    assert MOE.moe_layers == 48 and MOE.dense_mlp_layers == 0
    assert MOE.dense_params + MOE.expert_params == MOE.total_params
    assert MOE.expert_params == 48 * 128 * 3 * 2048 * 768
    assert QWEN8.expert_params == 0 and not QWEN8.is_moe
    assert dataclasses.replace(QWEN8, dtype_bytes=4).weight_bytes == 4 * QWEN8.total_params


def test_any_qwen_moe_style_config_works_including_sparse_steps_and_shared_experts():
    config = {
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
        "shared_expert_intermediate_size": 48,
        "tie_word_embeddings": True,
    }
    shape = ModelShape.from_hf_config(config, "toy")
    assert [shape.is_moe_layer(i) for i in range(4)] == [False, True, False, False]
    assert shape.head_dim == 16 and shape.num_key_value_heads == 4 and shape.attention_bias
    assert shape.expert_params == 8 * 3 * 64 * 32
    shared = 3 * 64 * 48 + 64
    assert shape.moe_dense_params_per_layer == 64 * 8 + shared
    assert shape.active_params == shape.total_params - shape.expert_params + 2 * 3 * 64 * 32
    # Tied: one vocab x hidden table in the total.
    assert shape.total_params == shape.layer_dense_params + shape.expert_params + 100 * 64 + 64


def test_load_from_a_config_file_or_folder_and_clear_errors(tmp_path):
    folder = tmp_path / "Qwen3-8B-local"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CATALOG_CONFIGS["Qwen3-8B"]))
    from_folder = load_model_shape(folder)
    assert from_folder.name == "Qwen3-8B-local"
    assert dataclasses.replace(from_folder, name="Qwen3-8B") == QWEN8
    assert load_model_shape(folder / "config.json").total_params == QWEN8.total_params
    assert load_model_shape("Qwen/Qwen3-8B") == QWEN8
    assert load_model_shape("qwen3-30b-a3b") == MOE
    with pytest.raises(ConfigError, match="Qwen3-8B, Qwen3-14B.*Llama-3.1-70B"):
        load_model_shape("GPT-5")
    bad = dict(CATALOG_CONFIGS["Qwen3-8B"], num_hidden_layers=0)
    with pytest.raises(ConfigError, match="<x>: field 'num_hidden_layers'"):
        ModelShape.from_hf_config(bad, source="<x>")
    moe = dict(CATALOG_CONFIGS["Qwen3-30B-A3B"], num_experts_per_tok=200)
    with pytest.raises(ConfigError, match="num_experts_per_tok must be in 1..num_experts"):
        ModelShape.from_hf_config(moe, source="<y>")


# --- iteration cost: exactness and monotonicity --------------------------------------------


@FAST
@given(models, tps, contexts)
def test_decode_time_aggregate_form_is_exact(model, tp, ctx):
    cost = CostModel(H800, model, tp)
    aggregate = cost.decode_time(len(ctx), sum(ctx))
    assert aggregate == pytest.approx(cost.iteration_time([], ctx), rel=1e-12, abs=0.0)


@FAST
@given(models, tps, prefills, contexts, st.data())
def test_more_work_never_takes_less_time(model, tp, chunks, ctx, data):
    cost = CostModel(H800, model, tp)
    before = cost.iteration_time(chunks, ctx)
    change = data.draw(st.sampled_from(["token", "prior", "chunk", "decode", "context"]))
    chunks, ctx = list(chunks), list(ctx)
    if change in ("token", "prior") and chunks:
        i = data.draw(st.integers(0, len(chunks) - 1))
        n, p = chunks[i]
        chunks[i] = (n + 1, p) if change == "token" else (n, p + data.draw(st.integers(1, 4096)))
    elif change == "context" and ctx:
        i = data.draw(st.integers(0, len(ctx) - 1))
        ctx[i] += data.draw(st.integers(1, 4096))
    elif change == "chunk":
        chunks.append((data.draw(st.integers(1, 4096)), data.draw(st.integers(0, 4096))))
    else:
        ctx.append(data.draw(st.integers(1, 65536)))
    assert cost.iteration_time(chunks, ctx) >= before


@FAST
@given(
    models,
    tps,
    prefills,
    contexts,
    st.floats(1.0, 10.0),
    st.sampled_from(["peak_flops", "hbm_bandwidth_Bps", "nvlink_bandwidth_Bps"]),
)
def test_faster_hardware_is_never_slower(model, tp, chunks, ctx, factor, field):
    slow = CostModel(H800, model, tp)
    fast_gpu = dataclasses.replace(H800, **{field: getattr(H800, field) * factor})
    assert CostModel(fast_gpu, model, tp).iteration_time(chunks, ctx) <= slow.iteration_time(
        chunks, ctx
    )


def test_empty_iteration_is_free_and_bad_inputs_are_rejected():
    cost = CostModel(H800, QWEN8, 2)
    assert cost.iteration_time([], []) == 0.0 == cost.decode_time(0, 0)
    with pytest.raises(ValueError, match="decode context"):
        cost.iteration_time([], [0])
    with pytest.raises(ValueError, match="prefill chunk tokens"):
        cost.iteration_time([(0, 5)], [])
    with pytest.raises(ValueError, match="total_context"):
        cost.decode_time(4, 3)
    with pytest.raises(ConfigError, match="tp must be a positive integer"):
        CostModel(H800, QWEN8, 0)


def test_regimes_decode_is_memory_bound_and_large_prefill_compute_bound():
    cost = CostModel(H800, QWEN8, 1)
    c, g = cost.constants, cost.gpu
    weights_s = cost.iteration_work([], [1]).weight_bytes / (
        g.hbm_bandwidth_Bps * c.weight_memory_efficiency
    )
    # Batch-1 decode costs about one read of the weights, plus a launch per linear kernel.
    kernels_s = (4 * QWEN8.num_hidden_layers + 1) * c.linear_kernel_overhead_s
    assert cost.decode_time(1, 1) == pytest.approx(
        weights_s + kernels_s + c.iteration_overhead_s, rel=0.01
    )
    # A long prefill's linear part is FLOP-bound: time grows linearly with tokens.
    t4k, t8k = (cost.iteration_cost([(n, 0)], []).linear_s for n in (4096, 8192))
    assert t8k == pytest.approx(2 * t4k, rel=0.01)
    # Decode per-sequence cost grows with context (KV reads).
    assert cost.decode_time(32, 32 * 16384) > 1.5 * cost.decode_time(32, 32 * 4096)


@pytest.mark.parametrize("model", [QWEN8, MOE], ids=["dense", "moe"])
def test_tensor_parallel_trade_off(model):
    tp1, tp2 = CostModel(H800, model, 1), CostModel(H800, model, 2)
    for prefill, ctx in (([], [8192] * 32), ([(4096, 0)], []), ([(2048, 8192)], [4096] * 8)):
        t1, t2 = tp1.iteration_time(prefill, ctx), tp2.iteration_time(prefill, ctx)
        # Two GPUs are faster than one, but not twice as fast (all-reduces, fixed overhead).
        assert t1 / 2 < t2 < t1
        assert tp2.iteration_cost(prefill, ctx).communication_s > 0
        assert tp1.iteration_cost(prefill, ctx).communication_s == 0
    # A wider TP group also holds more KV.
    assert tp2.kv_capacity_tokens() > 2 * tp1.kv_capacity_tokens()


def test_moe_expert_bytes_grow_with_tokens_and_saturate_at_all_experts():
    cost = CostModel(H800, MOE, 1)
    assert cost.expected_experts_touched(1) == pytest.approx(8)
    touched = [cost.expected_experts_touched(t) for t in (1, 2, 8, 64, 512, 4096)]
    assert touched == sorted(touched) and touched[-1] == pytest.approx(128, rel=1e-6)
    bytes_read = [cost.iteration_work([], [1] * t).weight_bytes for t in (1, 8, 64, 512, 4096)]
    assert bytes_read == sorted(bytes_read)
    assert bytes_read[-1] == pytest.approx(MOE.weight_bytes - MOE.embedding_params * 2, rel=1e-6)
    # One token reads ~k/E of the experts plus the dense part: a small fraction of the model.
    assert bytes_read[0] < 0.2 * MOE.weight_bytes
    assert CostModel(H800, QWEN8, 1).expected_experts_touched(100) == 0.0


def test_prefill_helpers_and_kv_sizes():
    cost = CostModel(H800, QWEN8, 2)
    assert cost.prefill_time(4096, 1024) == cost.iteration_time([(4096, 1024)], [])
    assert cost.prefill_time(4096, 16384) > cost.prefill_time(4096, 0)
    assert cost.kv_bytes(1000) == 1000 * QWEN8.kv_bytes_per_token


# --- training, weight sync, lifecycle ------------------------------------------------------


def test_train_step_scales_with_tokens_and_gpus_and_counts_attention():
    cost = CostModel(H800, QWEN8, 2)
    tokens = 64 * 20_000
    base = cost.train_step_time(tokens, 16)
    assert cost.train_step_time(2 * tokens, 16) > base
    assert cost.train_step_time(tokens, 16, sequence_length=20_000) > base
    assert cost.train_step_time(tokens, 8) > base
    no_overhead = CostModel(H800, QWEN8, 2, CostConstants(train_step_overhead_s=0.0))
    # FLOP-dominated: double the tokens, almost double the time.
    ratio = no_overhead.train_step_time(2 * tokens, 16) / no_overhead.train_step_time(tokens, 16)
    assert 1.6 < ratio <= 2.0
    with pytest.raises(ValueError, match="tokens"):
        cost.train_step_time(0, 16)


def test_weight_sync_is_bandwidth_bound_and_nearly_independent_of_receivers():
    cost = CostModel(H800, QWEN8, 2)
    assert cost.weight_sync_time(0) == 0.0
    one, many = cost.weight_sync_time(1), cost.weight_sync_time(12)
    assert one < many < one + 0.01
    assert cost.weight_sync_time(4, bandwidth_Bps=100e9) < cost.weight_sync_time(4)
    assert CostModel(H800, MOE, 2).weight_sync_time(4) > cost.weight_sync_time(4)


def test_worker_latencies_reproduce_measurements_and_scale_with_weight_bytes():
    for name, measured in MEASURED_LATENCIES.items():
        got = WorkerLatencies.for_model(load_model_shape(name))
        for f in dataclasses.fields(WorkerLatencies):
            assert getattr(got, f.name) == pytest.approx(getattr(measured, f.name))
    assert WorkerLatencies() == MEASURED_LATENCIES["Qwen3-8B"]
    big = WorkerLatencies.for_model(load_model_shape("Llama-3.1-70B"))
    moe = MEASURED_LATENCIES["Qwen3-30B-A3B"]
    assert big.prepare_s > moe.prepare_s and big.finalize_s > moe.finalize_s
    # Activation got slightly faster between the two measurements; it never extrapolates down.
    assert big.activate_s == pytest.approx(moe.activate_s)
    tiny = WorkerLatencies.for_model(
        dataclasses.replace(
            QWEN8, architecture=dataclasses.replace(QWEN8.architecture, num_hidden_layers=1)
        )
    )
    assert 0 <= tiny.prepare_s < MEASURED_LATENCIES["Qwen3-8B"].prepare_s


def test_constants_are_validated_with_the_field_name():
    with pytest.raises(ConfigError, match="linear_compute_efficiency must be > 0"):
        CostConstants(linear_compute_efficiency=0.0)
    with pytest.raises(ConfigError, match="iteration_overhead_s must be >= 0"):
        CostConstants(iteration_overhead_s=-1.0)


def test_other_catalog_gpus_rank_as_expected_for_decode():
    ctx = [8192] * 32
    times = {
        name: CostModel(get_gpu(name), QWEN8, 2).iteration_time([], ctx)
        for name in ("A100-80G", "H800", "H100", "H200", "B200")
    }
    assert times["A100-80G"] > times["H800"] >= times["H100"] > times["H200"] > times["B200"]


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["Qwen3-8B", "Qwen3-30B-A3B"]),
    batch=st.integers(1, 256),
    context=st.integers(1, 40_000),
    steps=st.integers(1, 300),
    tp=st.sampled_from([1, 2, 4]),
)
def test_decode_times_equal_stepping_decode_time(name, batch, context, steps, tp):
    cost = CostModel(get_gpu("H800"), load_model_shape(name), tp=tp)
    total = batch * context
    bulk = cost.decode_times(batch, total, steps)
    for i, dt in enumerate(bulk):
        assert dt == pytest.approx(cost.decode_time(batch, total + i * batch), rel=1e-12)
    # When each iteration ends (the worker's fast-forward): the sums a loop adds up, bitwise.
    from pearl.sim.worker import iteration_ends

    t, ends = 1234.5678, []
    for dt in bulk:
        t += dt
        ends.append(t)
    assert iteration_ends(1234.5678, bulk) == ends
    assert cost.decode_ends(1234.5678, batch, total, steps).tolist() == ends  # one-pass form


def test_linear_constants_are_the_fit_of_measured_h100_gemms():
    from pearl.sim.operator_fit import (
        LINEAR_FIELDS,
        fit_linear,
        held_out,
        load_rows,
        ratio_stats,
        training,
    )

    rows = load_rows()
    assert len(rows) == 441 and len(training(rows)) == 126
    fitted, shipped = fit_linear(training(rows)), CostConstants()
    for name in LINEAR_FIELDS:  # the defaults are this fit, not hand-picked numbers
        assert getattr(shipped, name) == pytest.approx(getattr(fitted, name), rel=2e-3), name
    for regime, stats in ratio_stats(held_out(rows), shipped).items():
        assert 0.85 <= stats["median"] <= 1.15, (regime, stats)
    # The sharp roofline before the fit was ~26% too fast on held-out mid-size GEMMs.
    sharp = dataclasses.replace(
        shipped,
        linear_compute_efficiency=0.6,
        weight_memory_efficiency=0.8,
        linear_roofline_exponent=float("inf"),
        linear_kernel_overhead_s=0.0,
    )
    assert ratio_stats(held_out(rows), sharp)["65-511"]["median"] < 0.8


def test_smooth_linear_roofline():
    from pearl.sim.costmodel import linear_seconds

    g = H800
    c = dataclasses.replace(CostConstants(), linear_kernel_overhead_s=0.0)
    flops, weights = 1e12, 1e9  # compute 1e12 / (peak * eff) vs memory 1e9 / (bw * eff)
    t_c = flops / (g.peak_flops * c.linear_compute_efficiency)
    t_m = weights / (g.hbm_bandwidth_Bps * c.weight_memory_efficiency)
    sharp = dataclasses.replace(c, linear_roofline_exponent=float("inf"))
    assert linear_seconds(flops, weights, 10, sharp, g) == max(t_c, t_m)
    one = dataclasses.replace(c, linear_roofline_exponent=1.0)
    assert linear_seconds(flops, weights, 10, one, g) == pytest.approx(t_c + t_m)
    smooth = linear_seconds(flops, weights, 10, c, g)
    assert max(t_c, t_m) < smooth < t_c + t_m
    assert linear_seconds(flops, weights, 10, CostConstants(), g) == pytest.approx(
        smooth + 10 * CostConstants().linear_kernel_overhead_s
    )
    for bad in (0.5, float("nan")):
        with pytest.raises(ConfigError, match="linear_roofline_exponent must be >= 1"):
            CostConstants(linear_roofline_exponent=bad)


def test_large_tp_allreduces_match_measured_nccl_bandwidth():
    from pearl.sim.costmodel import allreduce_seconds
    from pearl.sim.operator_fit import load_allreduce

    rows = load_allreduce()
    assert len(rows) == 45 and {g for g, _, _ in rows} == {2, 4, 8}
    link = get_gpu("H100").nvlink_bandwidth_Bps
    for gpus, size, seconds in rows:
        if size >= 1 << 24:  # bandwidth-bound: the ring formula holds within 25%
            ratio = allreduce_seconds(size, gpus, link, CostConstants()) / seconds
            assert 0.75 < ratio < 1.25, (gpus, size, ratio)


def test_a_shape_reads_its_architecture_fields_but_not_the_cpu_engines_properties():
    from pearl.models.config import ModelConfig

    llama = ModelConfig.from_dict(
        {
            "model_type": "llama",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "vocab_size": 100,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
        },
    )
    shape = ModelShape.from_model_config(llama, "l")
    assert shape.hidden_size == 64 and hash(shape) == hash(dataclasses.replace(shape))
    assert shape.kv_bytes_per_token == 2 * 2 * 4 * 16 * 2  # bf16 KV, not the engine's fp32
    with pytest.raises(AttributeError):
        shape.context_limit  # noqa: B018 - an engine property, not a shape field


@pytest.mark.parametrize("name", ["Qwen3-8B", "Qwen3-30B-A3B"])
def test_decode_steps_take_the_larger_attention_bound_with_or_without_the_shortcut(name):
    # The fast-forward prices decode attention by the bound that is the larger at every
    # context; with no such bound (None) it takes the elementwise max: the same, bitwise.
    import dataclasses

    cost = CostModel(get_gpu("H800"), load_model_shape(name), tp=2)
    assert cost._attention_slope is not None
    plain = dataclasses.replace(cost)
    object.__setattr__(plain, "_attention_slope", None)
    for batch, context, steps in [(1, 1, 1), (8, 20_000, 75), (256, 40_000, 300)]:
        total = batch * context
        assert (
            cost.decode_ends(5.0, batch, total, steps).tolist()
            == plain.decode_ends(5.0, batch, total, steps).tolist()
        )
        # and the batch-fixed parts cached on first use price the same on later calls as a
        # model that never cached them (its first call)
        cost.decode_times(batch, total, steps)
        fresh = CostModel(get_gpu("H800"), load_model_shape(name), tp=2)
        assert cost.decode_times(batch, total, steps) == fresh.decode_times(batch, total, steps)


def test_moe_compute_efficiency_prices_only_the_routed_experts_flops():
    moe, dense = load_model_shape("Qwen3-30B-A3B"), load_model_shape("Qwen3-8B")
    ratio = 0.25
    slow = CostConstants(moe_compute_efficiency_ratio=ratio)
    base_moe, slow_moe = (CostModel(H800, moe, tp=2, constants=c) for c in (CostConstants(), slow))
    # Compute-bound: an 8K prefill's linear time grows by exactly the experts' FLOPs
    # re-priced, with the sharp roofline (p = inf) so the compute bound is the whole term.
    sharp = dict(linear_roofline_exponent=float("inf"), linear_kernel_overhead_s=0.0)
    a = CostModel(H800, moe, tp=2, constants=CostConstants(**sharp))
    b = CostModel(
        H800, moe, tp=2, constants=CostConstants(moe_compute_efficiency_ratio=ratio, **sharp)
    )
    routed = 2.0 * moe.moe_layers * moe.num_experts_per_tok * moe.expert_params_per_expert / 2
    extra = 8192 * routed * (1 / ratio - 1) / (H800.peak_flops * 0.7285)
    assert b.iteration_cost([(8192, 0)], ()).linear_s == pytest.approx(
        a.iteration_cost([(8192, 0)], ()).linear_s + extra, rel=1e-9
    )
    assert slow_moe.prefill_time(8192) > 1.3 * base_moe.prefill_time(8192)
    # Decode of a few sequences reads weights (memory-bound): almost unchanged.
    assert slow_moe.decode_time(4, 4 * 16384) < 1.02 * base_moe.decode_time(4, 4 * 16384)
    # A dense model has no routed experts: bitwise the same prices.
    d0, d1 = (CostModel(H800, dense, tp=2, constants=c) for c in (CostConstants(), slow))
    assert d1.prefill_time(8192, 4096) == d0.prefill_time(8192, 4096)
    assert d1.decode_times(8, 8 * 1000, 5) == d0.decode_times(8, 8 * 1000, 5)
    with pytest.raises(ConfigError, match="moe_compute_efficiency_ratio must be > 0"):
        CostConstants(moe_compute_efficiency_ratio=0.0)
