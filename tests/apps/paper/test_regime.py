"""The regime rows and the ratio-selection replay run and report consistent numbers."""

import dataclasses
from pathlib import Path

import pytest

from pearl.apps.paper.ratio_selection import select_and_replay
from pearl.apps.paper.regime import RegimeSetting, Row, measure
from pearl.sim.costmodel import CostModel
from pearl.sim.hardware import get_gpu
from pearl.sim.shapes import load_model_shape
from pearl.sim.worker import SimEngineConfig
from pearl.workloads.profiles import get_profile

TINY = dataclasses.replace(get_profile("tiny"), num_tasks=1, group_size=4)


def test_regime_rows_cover_c2_to_c8_and_judge_by_the_tolerance():
    rows = measure(RegimeSetting(TINY, SimEngineConfig(block_size=64, scheduling="sglang")))
    assert [r.id for r in rows][:2] == ["C2", "C3"] and rows[-1].id == "C8"
    assert {r.id for r in rows} == {"C2", "C3", "C4", "C5", "C6", "C7", "C8"}
    for r in rows:
        assert r.sim == r.sim  # not NaN
        assert r.ok == (r.sim < r.target if r.upper_bound else abs(r.sim / r.target - 1) <= 0.15)
    assert Row("C9", "x", 100.0, 114.0).ok and not Row("C9", "x", 100.0, 116.0).ok


def test_ratio_selection_replays_every_candidate_and_measures_the_gap():
    cost = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)
    sel = select_and_replay(cost, TINY, SimEngineConfig(block_size=64), workers=3, step=1)
    assert [c.label for c in sel.candidates] == ["3C", "1P2D", "2P1D"]
    assert all(c.simulated_s > 0 and c.predicted_s > 0 for c in sel.candidates)
    assert sel.chosen in {c.label for c in sel.candidates}
    assert sel.best.simulated_s == min(c.simulated_s for c in sel.candidates)
    assert sel.gap >= 0 and sel.to_dict()["best"] == sel.best.label


def test_model_accuracy_separates_the_modes_and_counts_ordered_pairs():
    from pearl.apps.paper.ratio_selection import CandidateOutcome, StepSelection, model_accuracy

    step = StepSelection(
        1,
        4,
        (
            CandidateOutcome("4C", 110.0, 100.0, True),  # 1.1
            CandidateOutcome("1P3D", 200.0, 100.0, True),  # 2.0: the model is biased against PD
            CandidateOutcome("2P2D", 240.0, 120.0, True),  # 2.0
            CandidateOutcome("3P1D", 900.0, None, False),  # infeasible: not replayed
        ),
        "4C",
    )
    acc = model_accuracy([step])
    assert acc["median_ratio_colocated"] == pytest.approx(1.1)
    assert acc["median_ratio_disaggregated"] == pytest.approx(2.0)
    # pairs: 4C<1P3D predicted but tied replayed (disagree), 4C<2P2D (agree), 1P3D<2P2D (agree)
    assert acc["pairs_ordered_as_replayed"] == pytest.approx(2 / 3)


def test_model_accuracy_of_the_papers_forms_reads_their_predictions():
    from pearl.apps.paper.ratio_selection import CandidateOutcome, StepSelection, model_accuracy

    step = StepSelection(
        1,
        2,
        (
            CandidateOutcome("2C", 100.0, 100.0, True, paper_s=150.0),
            CandidateOutcome("1P1D", 120.0, 110.0, True, paper_s=330.0),
        ),
        "2C",
    )
    ours, paper = model_accuracy([step]), model_accuracy([step], paper=True)
    assert ours["median_ratio_disaggregated"] == pytest.approx(120 / 110)
    assert paper["median_ratio_colocated"] == pytest.approx(1.5)
    assert paper["max_ratio_disaggregated"] == pytest.approx(3.0)
    assert ours["pairs_ordered_as_replayed"] == paper["pairs_ordered_as_replayed"] == 1.0


def test_a_regime_map_cell_moves_its_knobs_and_measures_the_best_split(tmp_path):
    from pearl.apps.regime_map import apply_knob, evaluate_cell, heatmap

    cost = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)
    engine = SimEngineConfig(block_size=64, scheduling="sglang")
    assert apply_knob(TINY, "trajectories", 4, workers=2).batch_size == 8
    assert apply_knob(TINY, "reuse", "append", 2).observation_window is None
    doubled = apply_knob(TINY, "observation", 2, 2).observation_tokens
    assert doubled == TINY.observation_tokens.scaled(2)
    with pytest.raises(ValueError, match="unknown knob 'colour'"):
        apply_knob(TINY, "colour", 1, 2)
    cell = evaluate_cell(cost, TINY, engine, 2, {"trajectories": 2, "response": 0.5})
    labels = [c.label for c in cell.selection.candidates]
    assert labels == ["2C", "1P1D"] and cell.best_split == "1P1D"
    colocated, split = (c.simulated_s for c in cell.selection.candidates)
    assert cell.best_split_gain == pytest.approx(1 - split / colocated)
    assert cell.chosen_gain == (0.0 if cell.selection.chosen == "2C" else cell.best_split_gain)
    assert cell.to_dict()["values"] == {"trajectories": 2, "response": 0.5}
    other = evaluate_cell(cost, TINY, engine, 2, {"trajectories": 2, "response": 1})
    files = heatmap([cell, other], "response", "trajectories", "t", tmp_path / "map")
    assert [Path(f).name for f in files] == ["map.png", "map.svg"]
    assert all(Path(f).stat().st_size > 1000 for f in files)


def _tiny_at(turns_median: float, env_scale: float):
    from pearl.workloads.distributions import LogNormal

    return dataclasses.replace(
        TINY,
        turns=LogNormal(median=turns_median, sigma=0.5, low=1, high=40),
        env_latency_s=TINY.env_latency_s.scaled(env_scale),
        env_setup_s=TINY.env_setup_s.scaled(env_scale),
        reward_latency_s=TINY.reward_latency_s.scaled(env_scale),
        env_overhead_s=TINY.env_overhead_s * env_scale,
    )


def test_refitting_recovers_the_environment_scale_and_keeps_the_nearest_median():
    from pearl.apps.paper.regime import fit_c4_c5, fit_env_scale, mean_trajectory_s

    s = RegimeSetting(TINY, SimEngineConfig(block_size=64, scheduling="sglang"))
    target = mean_trajectory_s(s, _tiny_at(6, 0.3))
    scale, trajectory = fit_env_scale(s, _tiny_at, 6, steps=10, high=1.0, target_s=target)
    assert scale == pytest.approx(0.3, abs=0.01) and trajectory == pytest.approx(target, rel=0.02)
    fit = fit_c4_c5(s, _tiny_at, (2, 8), c5_target_s=target, c2_target_s=5.0)
    assert [m for m, _, _ in fit.tried] == [2, 8]
    nearest = min(fit.tried, key=lambda t: abs(t[2] + 0.192))
    assert (fit.turns_median, fit.env_scale, fit.change_16_32) == nearest
    # C2: the MFU is bisected on the fitted batch's 16-GPU rollout (tiny's batch is too small
    # for the paper's 163.8 s step, so the bisection is checked at a target it can reach).
    from pearl.apps.paper.regime import _run, fit_train_mfu, train_step_s
    from pearl.workloads.agentic import generate_batch

    assert fit.train_mfu == fit_train_mfu(
        s, _tiny_at(fit.turns_median, fit.env_scale), target_s=5.0
    )
    mfu = fit_train_mfu(s, _tiny_at(6, 0.3), target_s=5.0)
    at = dataclasses.replace(s, constants=dataclasses.replace(s.constants, train_mfu=mfu))
    batch = generate_batch(_tiny_at(6, 0.3), seed=s.seed)
    assert train_step_s(at, _run(at, batch, "Qwen3-8B", 8)) == pytest.approx(5.0, rel=1e-3)
    with pytest.raises(ValueError, match="at least one turns median"):
        fit_c4_c5(s, _tiny_at, ())
    with pytest.raises(ValueError, match="no environment scale in"):  # tiny never takes 216 s
        fit_env_scale(s, _tiny_at, 6, steps=4)
    with pytest.raises(ValueError, match="no trainer MFU"):
        fit_train_mfu(s, _tiny_at(6, 0.3), target_s=1e6)
