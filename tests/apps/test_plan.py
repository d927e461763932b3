"""``pearl plan``: a tiny grid end to end, resuming, pricing, bad grids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pearl.apps.plan import Point, expected_work, mark_frontier, price
from pearl.cli import app
from pearl.config.plan import PlanConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def plan_args(tmp_path, name: str, *extra: str, config: str = "headline.yaml") -> list[str]:
    return [
        "plan",
        "--config",
        str(CONFIGS / config),
        "rl.duration_s=60",
        "workload.profile=tiny",
        "policies=[roll,pearl]",
        "elastic.segments=[segment2]",
        "plan.reserved_gpus=[4,8]",
        "plan.tp=[2]",
        "plan.check_seeds=1",
        "processes=2",
        f"logger.run_dir={tmp_path}",
        f"logger.run_name={name}",
        *extra,
    ]


def test_a_tiny_grid_prints_the_frontier_and_a_recommendation_and_resumes(tmp_path):
    """An RL config (the paper regime) as the plan's config, on a tiny workload."""
    args = plan_args(
        tmp_path,
        "p",
        "policies=[roll,rlboost,pearl]",
        "plan.tp=[2,4]",
        config="headline_paper.yaml",
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    folder = tmp_path / "p"
    plan = json.loads((folder / "plan.json").read_text())
    assert len(plan["rows"]) == 12  # 3 policies x 2 pool sizes x 2 TP degrees
    assert {(r["reserved_gpus"], r["tp"]) for r in plan["rows"]} == {(4, 2), (8, 2), (4, 4), (8, 4)}
    assert any(r["frontier"] for r in plan["rows"])
    best = plan["recommended"]
    assert best["cost_per_million_tokens"] == min(
        r["cost_per_million_tokens"] for r in plan["rows"]
    )
    assert "Recommended: " in result.output and "Runner-up" in result.output
    assert len(plan["seed_checks"]) == 1 and plan["seed_checks"][0]["seed"] == 1
    assert plan["runs_kept_before"] == 0 and plan["wall_s"] > 0
    kept = sorted(p.name for p in (folder / "runs").iterdir())
    assert len(kept) == 12 + 2  # the grid, then the best two on one more seed
    assert (folder / "report.html").is_file() and (folder / "plan.png").is_file()
    # Resuming a finished plan runs nothing again and gives the same table.
    stamps = {p.name: p.stat().st_mtime_ns for p in (folder / "runs").iterdir()}
    again = CliRunner().invoke(app, ["plan", "--resume", str(folder)])
    assert again.exit_code == 0, again.output
    assert {p.name: p.stat().st_mtime_ns for p in (folder / "runs").iterdir()} == stamps
    assert json.loads((folder / "plan.json").read_text())["rows"] == plan["rows"]
    # An interrupted plan resumes: remove one kept run and only it runs again.
    (folder / "runs" / kept[0]).unlink()
    third = CliRunner().invoke(app, ["plan", "--resume", str(folder)])
    assert third.exit_code == 0, third.output
    assert sorted(p.name for p in (folder / "runs").iterdir()) == kept
    assert json.loads((folder / "plan.json").read_text())["runs_kept_before"] == len(kept) - 1
    rerun = [p.name for p in (folder / "runs").iterdir() if p.stat().st_mtime_ns != stamps[p.name]]
    assert rerun == [kept[0]]
    # The same folder is not silently reused for a new plan.
    clash = CliRunner().invoke(app, args)
    assert clash.exit_code == 2 and "--resume" in clash.output


@pytest.mark.parametrize(
    "model", [[], ["model.name=Qwen3-30B-A3B", "plan.tp=[2,4]"]], ids=["8B", "30B-A3B"]
)
def test_the_readme_plan_config_runs_for_both_models(tmp_path, model):
    """configs/plan_paper.yaml as docs/plan.md runs it (Qwen3-8B at TP 1 and 2; Qwen3-30B-A3B
    at TP 2 and 4), every policy it names, on a tiny workload, its smallest and largest
    reserved pools."""
    args = plan_args(
        tmp_path,
        "readme",
        "policies=[roll,rlboost,pearl]",
        "plan.reserved_gpus=[4,20]",
        "rl.duration_s=600",  # long enough for the paper's trainer to finish a step
        *model,
        config="plan_paper.yaml",
    )
    args = [a for a in args if a != "plan.tp=[2]"]  # the config's (or the README's) TPs
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "readme" / "plan.json").read_text())
    tps = [2, 4] if model else [1, 2]
    assert {(r["policy"], r["reserved_gpus"], r["tp"]) for r in plan["rows"]} == {
        (p, r, t) for p in ("roll", "rlboost", "pearl") for r in (4, 20) for t in tps
    }
    assert all(r["trained_tokens_per_s"] > 0 for r in plan["rows"])
    # The cited AWS prices are the config's.
    cfg = yaml.safe_load((tmp_path / "readme" / "config.yaml").read_text())
    assert cfg["plan"]["price_reserved"] == 6.88 and cfg["plan"]["price_preemptible"] == 1.78


def test_the_fleet_plan_config_runs_on_its_scaled_bamboo_market(tmp_path):
    """configs/plan_fleet.yaml (docs/plan.md's fleet table) on a tiny workload: its pools
    of 128 and 256 reserved GPUs, the Bamboo segments at 16 times their depth."""
    from pearl.apps.experiment import load_segment_or_csv

    args = plan_args(
        tmp_path,
        "fleet",
        "policies=[roll,pearl]",
        "plan.reserved_gpus=[128,256]",
        "elastic.segments=[segment1]",
        "workload.num_tasks=2",
        "rl.duration_s=600",
        "plan.check_seeds=0",
        config="plan_fleet.yaml",
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "fleet" / "plan.json").read_text())
    assert {(r["policy"], r["reserved_gpus"]) for r in plan["rows"]} == {
        (p, r) for p in ("roll", "pearl") for r in (128, 256)
    }
    pearl = [r for r in plan["rows"] if r["policy"] == "pearl"]
    # More preemptible GPUs than the unscaled traces ever offer (12): the scale applied.
    assert all(r["preemptible_gpus_held"] > 12 for r in pearl), pearl
    one, sixteen = load_segment_or_csv("segment1"), load_segment_or_csv("segment1", 16)
    assert sixteen.values == tuple(16 * v for v in one.values)
    assert sixteen.times_s == one.times_s and sixteen.mean() == 16 * one.mean()


def test_a_spot_market_model_replaces_the_segments(tmp_path):
    result = CliRunner().invoke(
        app,
        plan_args(
            tmp_path,
            "spot",
            "policies=[pearl]",
            "plan.reserved_gpus=[4]",
            "plan.check_seeds=0",
            "plan.spot.max_available=6",
            "plan.spot.changes_per_hour=30",
            "plan.spot.traces=2",
        ),
    )
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "spot" / "plan.json").read_text())
    assert [Path(t).name for t in plan["traces"]] == ["spot0.csv", "spot1.csv"]
    assert plan["rows"][0]["runs"] == 2


def test_a_grid_with_no_valid_pair_is_refused_naming_why(tmp_path):
    result = CliRunner().invoke(app, plan_args(tmp_path, "bad", "plan.reserved_gpus=[3]"))
    assert result.exit_code == 2
    assert "reserved 3 at TP2" in result.output and "multiples of the TP" in result.output
    bad = CliRunner().invoke(app, plan_args(tmp_path, "bad2", "plan.price_reserved=-1"))
    assert bad.exit_code == 2 and "plan.price_reserved" in bad.output


def test_price_charges_reserved_and_training_gpus_and_the_preemptible_gpus_held():
    cfg = PlanConfig.model_validate(
        {"cluster": {"training_gpus": 8}, "plan": {"price_reserved": 3.0, "price_preemptible": 1.0}}
    )
    run = {
        # 4 reserved for the first half hour, 4 more preemptible for the second
        "rollout_gpus": [[0.0, 4], [1800.0, 8]],
        "rows": [
            {"time_s": 1800.0, "counted": True, "performance/train_tokens": 1000},
            {"time_s": 3600.0, "counted": True, "performance/train_tokens": 2000},
            {"time_s": 5000.0, "counted": False, "performance/train_tokens": 9999},
        ],
        "counters": {"turns_cut_by_shrinks": 2, "tokens_discarded": 50},
    }
    p = price(run, Point("pearl", 4, 2), cfg)
    assert p["elapsed_s"] == 3600.0 and p["trained_tokens"] == 3000
    assert p["extra_gpu_s"] == 4 * 1800.0
    assert p["cost"] == (4 + 8) * 1.0 * 3.0 + 4 * 0.5 * 1.0
    # A fixed larger pool (ROLL-Large) pays the reserved price for its extra GPUs.
    assert price(run, Point("roll-large", 4, 2), cfg)["cost"] == (4 + 8) * 3.0 + 4 * 0.5 * 3.0


def test_the_frontier_keeps_what_nothing_beats_on_both_speed_and_cost():
    rows = [
        {"trained_tokens_per_s": 10.0, "cost_per_million_tokens": 5.0},
        {"trained_tokens_per_s": 20.0, "cost_per_million_tokens": 6.0},
        {"trained_tokens_per_s": 15.0, "cost_per_million_tokens": 7.0},  # beaten by the second
    ]
    mark_frontier(rows)
    assert [r["frontier"] for r in rows] == [True, True, False]


@pytest.mark.slow  # ~40 s (the fast suite's budget, issue 63)
def test_sigterm_keeps_the_finished_runs_and_resume_finishes_the_plan(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from procfs import process_tree, wait_until_gone

    pearl = str(Path(sys.executable).parent / "pearl")
    args = plan_args(tmp_path, "t", "rl.duration_s=1800", "policies=[roll,rlboost,pearl]")
    proc = subprocess.Popen(
        [pearl, *args[:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    runs = tmp_path / "t" / "runs"
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if runs.is_dir() and any(p.suffix == ".json" for p in runs.iterdir()):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the plan ended before it could be stopped"
        children = sorted(process_tree(proc.pid) - {proc.pid})
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert f"pearl plan --resume {tmp_path / 't'}" in err
    assert not wait_until_gone(children, 60), "run processes left running"
    kept = [p for p in runs.iterdir() if p.suffix == ".json"]
    assert 1 <= len(kept) < 6 and not os.path.exists(tmp_path / "t" / "plan.json")
    done = CliRunner().invoke(app, ["plan", "--resume", str(tmp_path / "t")])
    assert done.exit_code == 0, done.output
    assert len(json.loads((tmp_path / "t" / "plan.json").read_text())["rows"]) == 6


def test_the_grid_runs_the_longest_configurations_first():
    """pearl (elastic, adaptive PD, borrowing) before rlboost before roll (a fixed pool),
    the larger pool first within a policy: the last process is not left with a long run."""
    points = [Point(p, r, 2) for p in ("roll", "rlboost", "pearl") for r in (4, 20)]
    assert [p.label for p in sorted(points, key=expected_work)] == [
        "pearl r20 tp2",
        "pearl r4 tp2",
        "rlboost r20 tp2",
        "rlboost r4 tp2",
        "roll r20 tp2",
        "roll r4 tp2",
    ]


def test_a_reserved_pool_runs_once_and_its_run_stands_for_every_trace(tmp_path):
    """roll never reads the availability trace: the grid simulates it on the first trace
    only, and its run on the other trace is what simulating there gives (but for the
    wall time); rlboost follows the trace and runs on both. A resumed plan whose copy was
    lost writes it again from the kept run."""
    from pearl.apps.experiment import run_one
    from pearl.apps.plan import _job_config, load_plan_config

    args = plan_args(
        tmp_path,
        "r",
        "policies=[roll,rlboost]",
        "elastic.segments=[segment1,segment2]",
        "plan.reserved_gpus=[4]",
        "plan.check_seeds=0",
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "plan grid: 3 runs" in result.output  # roll once, rlboost on both traces
    runs = tmp_path / "r" / "runs"
    copy = json.loads((runs / "roll@r4-tp2@segment2@seed0.json").read_text())
    assert copy["same_run_as"] == "roll@r4-tp2@segment1@seed0" and copy["segment"] == "segment2"
    assert "same_run_as" not in json.loads(
        (runs / "rlboost@r4-tp2@segment2@seed0.json").read_text()
    )
    cfg = load_plan_config(str(CONFIGS / "headline.yaml"), args[3:])
    simulated = run_one(_job_config(cfg, Point("roll", 4, 2), 0), "roll", "segment2")
    for run in (copy, simulated):
        del run["wall_s"]
    del copy["same_run_as"]
    assert json.loads(json.dumps(simulated)) == copy
    (runs / "roll@r4-tp2@segment2@seed0.json").unlink()
    again = CliRunner().invoke(app, ["plan", "--resume", str(tmp_path / "r")])
    assert again.exit_code == 0, again.output
    assert "plan grid" not in again.output  # nothing simulated again
    assert (runs / "roll@r4-tp2@segment2@seed0.json").is_file()


@pytest.mark.parametrize("config", ["plan_paper.yaml", "plan_fleet.yaml"])
def test_the_paper_plans_run_the_fitted_paper_regime(config):
    """The plans in the paper's regime run headline_paper.yaml's engine, workload profile and
    cost profile (docs/regime.md, "The fit"), so a refit of the regime reaches `pearl plan`."""
    plan = yaml.safe_load((CONFIGS / config).read_text())
    headline = yaml.safe_load((CONFIGS / "headline_paper.yaml").read_text())
    assert plan["sim"] == headline["sim"]
    assert plan["workload"]["profile"] == headline["workload"]["profile"] == "swe_paper"
    assert plan["cluster"]["profile"] == headline["cluster"]["profile"] == "paper-h800"
