"""Calibration (pearl.apps.calibrate): profiling a live engine, fitting, saving the profile."""

import dataclasses
import json

import numpy as np
import pytest

from pearl.apps.calibrate import (
    RANDOM_MODELS,
    FittedRates,
    build_engine,
    calibrate,
    fit_profile,
    model_shape_of,
    run_calibrate,
    samples_from_profile,
)
from pearl.engine.iteration_timing import (
    BatchKind,
    BatchShape,
    CalibrationGrid,
    Sample,
    get_grid,
    profile_engine,
)
from pearl.engine.sequence import Request, SamplingParams
from pearl.errors import ConfigError, EngineStateError
from pearl.sim.cost_profile import load_cost_profile, save_cost_profile
from pearl.sim.costmodel import CostModel
from pearl.sim.shapes import ModelShape

REPEATS = 5
# Qwen3, vocab 512, hidden 64, 2 layers: iterations take ~3-15 ms here.
TINY = RANDOM_MODELS["qwen3-tiny"]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """One quick-grid calibration of the tiny model, shared by the tests below (~3 s)."""
    grid = get_grid("quick")
    engine = build_engine(TINY, grid, REPEATS)
    path = tmp_path_factory.mktemp("calibration") / "cpu.yaml"
    report = calibrate(engine, path, grid, repeats=REPEATS)
    return engine, grid, report, load_cost_profile(path)


def predictions(profile, model, samples):
    cost = CostModel(profile.gpu, profile.adapt_model(model), 1, profile.constants)
    return np.array([cost.iteration_time(s.prefills, s.decode_contexts) for s in samples])


def exact_samples(cost: CostModel, shapes) -> list[Sample]:
    """Samples whose seconds are ``cost``'s predictions for each shape (no noise)."""
    out = []
    for shape in shapes:
        prefills = ((shape.prefill_tokens, shape.prefill_prior),) * shape.prefill_chunks
        contexts = (shape.decode_context,) * shape.decodes
        out.append(Sample(prefills, contexts, cost.iteration_time(prefills, contexts)))
    return out


# --- profiling ----------------------------------------------------------------------------


def test_profiled_batches_are_the_shapes_asked_for(calibrated):
    engine, grid, _, profile = calibrated
    samples = samples_from_profile(profile)
    assert [s.shape for s in samples] == list(grid.shapes)
    for s in samples:
        shape = s.shape
        assert s.kind is shape.kind
        assert (
            sorted(s.prefills)
            == [(shape.prefill_tokens, shape.prefill_prior)] * shape.prefill_chunks
        )
        # Decodes advance one token per repeat; the sample holds the median repeat's batch.
        assert len(s.decode_contexts) == shape.decodes
        assert len(set(s.decode_contexts)) <= 1
        assert all(
            shape.decode_context <= c < shape.decode_context + REPEATS for c in s.decode_contexts
        )
        # The median repeat on the CPU clock, with its wall time alongside.
        assert len(s.repeat_seconds) == len(s.repeat_cpu_seconds) == REPEATS
        assert s.cpu_seconds == sorted(s.repeat_cpu_seconds)[REPEATS // 2]
        assert s.seconds == s.repeat_seconds[s.repeat_cpu_seconds.index(s.cpu_seconds)]
    assert {s.kind for s in samples} == set(BatchKind)
    # The engine is left as found: idle, no pinned probes, its own batching limits.
    assert not engine.scheduler.has_work() and not engine.scheduler.sessions
    assert engine.scheduler.config.max_num_batched_tokens == engine.config.max_num_batched_tokens
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def test_profile_engine_refuses_a_busy_engine_and_shapes_that_do_not_fit(calibrated):
    engine, *_ = calibrated
    too_big = CalibrationGrid("big", (BatchShape(decodes=4096, decode_context=1024),))
    with pytest.raises(ConfigError, match="4096 dec @1024.*num_kv_blocks"):
        profile_engine(engine, too_big, 1)
    too_long = CalibrationGrid("long", (BatchShape(prefill_chunks=1, prefill_tokens=4096),))
    with pytest.raises(ConfigError, match="max_model_len"):
        profile_engine(engine, too_long, 1)
    engine.add_request(Request("busy", [1, 2, 3], SamplingParams(max_new_tokens=1)))
    try:
        with pytest.raises(EngineStateError, match="1 requests in flight"):
            profile_engine(engine, get_grid("quick"), 1)
    finally:
        engine.abort("busy")


# --- fitting ------------------------------------------------------------------------------


def fit_errors(engine, report, profile) -> tuple[float, float]:
    """The fit's median relative error on its own samples, and that of a constant predictor
    (every iteration at the median time), after checking the report agrees with both."""
    samples = samples_from_profile(profile)
    measured = np.array([s.cpu_seconds for s in samples])
    errors = np.abs(predictions(profile, model_shape_of(engine), samples) / measured - 1)
    assert errors.tolist() == pytest.approx([abs(e) for e in report.relative_errors])
    assert report.clock == "cpu"
    for kind in BatchKind:
        assert report.errors[kind.value].count == sum(s.kind is kind for s in samples)
    constant = float(np.median(np.abs(np.median(measured) / measured - 1)))
    return report.errors["all"].median, constant


def test_fit_predicts_the_measured_iterations(calibrated, tmp_path):
    # Fits here land at a 6-13% median, with busy neighbours too: CPU time leaves out the
    # time they hold the core, and the median ignores the few samples they still disturb.
    # 15% still fails a fit that misses the structure: predicting every iteration at the
    # median time is 30-90% off on this grid. A host saturated for the whole second of a
    # calibration disturbs most samples (medians of 0.3-0.7 measured here beside two busy
    # loops), so a missed fit is measured again, twice at most, on a fresh engine: a fit
    # that is wrong misses every time.
    engine, grid, report, profile = calibrated
    tries = [fit_errors(engine, report, profile)]
    while not (tries[-1][0] < min(0.15, 0.5 * tries[-1][1])) and len(tries) < 3:
        engine = build_engine(TINY, grid, REPEATS)
        path = tmp_path / f"again-{len(tries)}.yaml"
        report = calibrate(engine, path, grid, repeats=REPEATS)
        tries.append(fit_errors(engine, report, load_cost_profile(path)))
    median, constant = tries[-1]
    assert median < 0.15 and median < 0.5 * constant, f"(fit, constant) medians: {tries}"


def test_fit_recovers_a_known_cost_model():
    model = ModelShape.from_hf_config(RANDOM_MODELS["qwen3-16m"], "qwen3-16m", dtype_bytes=4)
    truth = FittedRates(
        linear_flops_per_s=20e9,
        attention_flops_per_s=12e9,
        weight_bytes_per_s=6e9,
        kv_bytes_per_s=1.5e9,
        iteration_overhead_s=4e-3,
        per_sequence_overhead_s=1.5e-4,
        per_prefill_chunk_overhead_s=6e-4,
    )
    cost = CostModel(truth.gpu(16e9), model, 1, truth.constants())
    samples = exact_samples(cost, get_grid("default").shapes)
    profile, report = fit_profile(samples, model, clock="wall", memory_bytes=16e9)
    assert report.errors["all"].max < 0.01
    # Shapes the fit never saw are predicted as well (every parameter is pinned down).
    held_out = exact_samples(
        cost,
        [
            BatchShape(decodes=8, decode_context=1000),
            BatchShape(decodes=48, decode_context=3000),
            BatchShape(prefill_chunks=3, prefill_tokens=300, prefill_prior=700),
            BatchShape(20, 700, 1, 100, 300),
        ],
    )
    measured = np.array([s.seconds for s in held_out])
    np.testing.assert_allclose(predictions(profile, model, held_out), measured, rtol=0.01)


def test_anchor_samples_set_the_fits_level():
    """A grid timed on an idle machine gives the shape; live iterations 1.3x slower (a loaded
    host) set the level: the anchored fit predicts them, the grid-only fit is 1.3x fast."""
    model = ModelShape.from_hf_config(TINY, "tiny", dtype_bytes=4)
    truth = FittedRates(20e9, 12e9, 6e9, 1.5e9, 4e-3, 1.5e-4, 6e-4)
    cost = CostModel(truth.gpu(16e9), model, 1, truth.constants())
    grid = exact_samples(cost, get_grid("quick").shapes)
    shapes = [
        BatchShape(decodes=8, decode_context=1000),
        BatchShape(decodes=32, decode_context=300),
    ]
    live = [dataclasses.replace(s, seconds=1.3 * s.seconds) for s in exact_samples(cost, shapes)]
    measured = np.array([s.seconds for s in live])
    plain, _ = fit_profile(grid, model, clock="wall", memory_bytes=16e9)
    np.testing.assert_allclose(predictions(plain, model, live), measured / 1.3, rtol=0.02)
    anchored, report = fit_profile(
        grid + live, model, clock="wall", memory_bytes=16e9, anchor=len(grid)
    )
    # The fit itself already leans toward the live samples; the level does the rest.
    assert 1.0 < report.level < 1.3
    ratios = predictions(anchored, model, live) / measured
    assert np.median(ratios) == pytest.approx(1.0, abs=0.01) and np.all(abs(ratios - 1) < 0.05)
    assert "level set by the live iterations" in report.table()


def test_anchor_level_keeps_the_live_busy_time_with_stalls():
    """Live iterations where one in five was descheduled for 3x its time (a shared host):
    the median iteration is not slowed, the busy time is. The anchored fit reproduces the
    busy time (what a makespan adds up), not the median iteration."""
    model = ModelShape.from_hf_config(TINY, "tiny", dtype_bytes=4)
    truth = FittedRates(20e9, 12e9, 6e9, 1.5e9, 4e-3, 1.5e-4, 6e-4)
    cost = CostModel(truth.gpu(16e9), model, 1, truth.constants())
    grid = exact_samples(cost, get_grid("quick").shapes)
    shapes = [BatchShape(decodes=8, decode_context=1000)] * 10
    live = [
        dataclasses.replace(s, seconds=s.seconds * (3.0 if i % 5 == 0 else 1.0))
        for i, s in enumerate(exact_samples(cost, shapes))
    ]
    measured = np.array([s.seconds for s in live])
    anchored, _ = fit_profile(grid + live, model, clock="wall", memory_bytes=16e9, anchor=len(grid))
    predicted = predictions(anchored, model, live)
    assert predicted.sum() == pytest.approx(measured.sum(), rel=0.01)
    assert np.median(predicted / measured) > 1.2  # the median iteration is over-predicted


def test_live_iterations_alone_set_their_own_level():
    """With no grid (vLLM's fit: its own iterations only), ``set_level`` makes the fit keep
    the iterations' busy time, stalls included; without it the fit follows the median."""
    model = ModelShape.from_hf_config(TINY, "tiny", dtype_bytes=4)
    truth = FittedRates(20e9, 12e9, 6e9, 1.5e9, 4e-3, 1.5e-4, 6e-4)
    cost = CostModel(truth.gpu(16e9), model, 1, truth.constants())
    live = [
        dataclasses.replace(s, seconds=s.seconds * (3.0 if i % 5 == 0 else 1.0))
        for i, s in enumerate(exact_samples(cost, get_grid("quick").shapes))
    ]
    measured = np.array([s.seconds for s in live])
    leveled, _ = fit_profile(live, model, clock="wall", memory_bytes=16e9, set_level=True)
    assert predictions(leveled, model, live).sum() == pytest.approx(measured.sum(), rel=0.01)
    plain, _ = fit_profile(live, model, clock="wall", memory_bytes=16e9)
    assert predictions(plain, model, live).sum() < 0.9 * measured.sum()


def test_fit_needs_enough_positive_samples():
    model = ModelShape.from_hf_config(TINY, "tiny", dtype_bytes=4)
    sample = Sample(((16, 0),), (), 0.01)
    with pytest.raises(ConfigError, match="at least 7 samples"):
        fit_profile([sample] * 3, model)
    with pytest.raises(ConfigError, match="sample 7 has wall seconds=0.0"):
        fit_profile([sample] * 7 + [dataclasses.replace(sample, seconds=0.0)], model, clock="wall")
    with pytest.raises(ConfigError, match="no 'cpu' time"):
        fit_profile([sample] * 7, model)


# --- saving -------------------------------------------------------------------------------


def test_saved_profile_loads_back_with_the_same_predictions(calibrated, tmp_path):
    engine, grid, report, profile = calibrated
    model = model_shape_of(engine)
    samples = samples_from_profile(profile)
    assert report.profile_path is not None and report.profiling_seconds > 0
    assert profile.gpu.name == "cpu" and profile.dtype_bytes == 4
    meta = profile.meta
    assert meta["grid"] == "quick" and meta["repeats"] == REPEATS and meta["model"] == model.name
    assert meta["fit"]["errors"]["all"]["median"] == pytest.approx(report.errors["all"].median)
    assert "cpu" in meta["fitted_on"] and "date" in meta
    # YAML -> JSON -> back: the same numbers, the same predictions.
    again = load_cost_profile(save_cost_profile(tmp_path / "cpu.json", profile))
    assert again == profile
    np.testing.assert_allclose(
        predictions(again, model, samples), predictions(profile, model, samples), rtol=1e-12
    )


def test_sample_round_trips_through_plain_data():
    sample = Sample(
        ((64, 128), (32, 0)),
        (300, 300, 300, 17),
        0.0123,
        (0.0123, 0.02),
        BatchShape(3, 300),
        0.011,
        (0.011, 0.012),
    )
    raw = sample.to_dict()
    assert raw["decodes"] == [[300, 3], [17, 1]] and raw["kind"] == "mixed"
    assert Sample.from_dict(raw) == sample
    with pytest.raises(ConfigError, match="samples\\[2\\].*decodes"):
        Sample.from_dict({"prefills": [], "seconds": 1.0}, "samples[2]")


def test_grids_and_shapes_validate():
    with pytest.raises(ConfigError, match="unknown calibration grid 'huge'.*default, quick"):
        get_grid("huge")
    with pytest.raises(ConfigError, match="decodes >= 1 or prefill_chunks >= 1"):
        BatchShape()
    with pytest.raises(ConfigError, match="prefill_tokens must be >= 2"):
        BatchShape(prefill_chunks=1, prefill_tokens=1)
    with pytest.raises(ConfigError, match="decodes must be an integer >= 0"):
        BatchShape(decodes=-1)
    assert BatchShape(4, 512, 1, 64, 0).describe() == "4 dec @512 + 1x64 pf @0"
    default = get_grid("default")
    assert {s.kind for s in default.shapes} == set(BatchKind)
    assert default.max_len(3) < RANDOM_MODELS["qwen3-16m"]["max_position_embeddings"]


def test_run_calibrate_on_a_model_folder_prints_the_fit_and_saves_json(tmp_path):
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))  # no weights: random init
    lines: list[str] = []
    report = run_calibrate(str(folder), str(tmp_path / "cpu.json"), "quick", 1, echo=lines.append)
    text = "\n".join(lines)
    assert "[16/16]" in text and "median" in text and str(tmp_path / "cpu.json") in text
    profile = load_cost_profile(tmp_path / "cpu.json")
    assert profile.meta["model"] == "tiny-model" and profile.meta["repeats"] == 1
    assert len(samples_from_profile(profile)) == len(report.relative_errors) == 16
    with pytest.raises(ConfigError, match="neither a model folder.*qwen3-16m"):
        build_engine(str(tmp_path / "missing"), get_grid("quick"))


def test_every_in_situ_fit_gets_its_minimum_of_held_out_runs():
    """Each deployment a case runs on (its first, then one per change) has an in-situ fit
    of its workload, and each fit gets at least MIN_HELD_OUT_RUNS held-out runs, shared
    among the cases that use it (not the minimum once per case)."""
    from pearl.apps import fidelity as fid

    plan = fid.held_out_plan(fid.DEFAULT_CASES)
    runs: dict[str, int] = {}
    for case_runs in plan:
        for key, deployment in case_runs:
            assert key.startswith(deployment + "/")
            runs[key] = runs.get(key, 0) + 1
    assert sorted(runs) == ["1C/swe-cpu", "1P1D/game", "1P1D/swe-cpu", "2C/game", "2C/swe-cpu"]
    assert min(runs.values()) >= fid.MIN_HELD_OUT_RUNS
    by_name = dict(zip((c.name for c in fid.DEFAULT_CASES), plan, strict=True))
    # 2C -> 1P1D needs the 1P1D fit too; 2C/swe-cpu, used by four cases, one run after each.
    assert [d for _, d in by_name["swe-cpu 8 traj, 2C -> 1P1D at 3 s"]] == ["2C", "1P1D", "1P1D"]
    assert by_name["swe-cpu 16 traj, 2 colocated"] == [("2C/swe-cpu", "2C")]
    assert runs["2C/swe-cpu"] == 4
