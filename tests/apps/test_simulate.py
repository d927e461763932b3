"""``pearl simulate``: reproducible run folders, complete trajectories, the CLI, fast-forward.

Everything runs the ``tiny`` workload (2 tasks x 4 trajectories, contexts <= 2K) on
two TP2 H800 workers of Qwen3-8B, colocated (2C) and disaggregated (1P1D); one
simulation takes about 0.1-0.2 s of wall time.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
from reportparse import parse_report
from typer.testing import CliRunner

from pearl.apps.sim_build import build_batch, build_cost_model
from pearl.apps.simulate import SimulateOutcome, run_simulate
from pearl.cli import app
from pearl.config.loading import load_config
from pearl.config.simulate import SimulateConfig
from pearl.control.agent_loop import session_id_of
from pearl.control.deployment import Deployment
from pearl.errors import ConfigError
from pearl.sim.fixed import simulate_fixed_rollout
from pearl.sim.worker import SimEngineConfig
from pearl.workloads.batch import RolloutBatch

DEPLOYMENTS = ("2C", "1P1D")
REPO = Path(__file__).resolve().parents[2]


def tiny_overrides(run_dir: Path, run_name: str, *extra: str) -> list[str]:
    return [
        "model.name=Qwen3-8B",
        "workload.profile=tiny",
        f"cluster.deployments=[{', '.join(DEPLOYMENTS)}]",
        f"logger.run_dir={run_dir}",
        f"logger.run_name={run_name}",
        *extra,
    ]


def simulate(run_dir: Path, run_name: str, *extra: str) -> tuple[SimulateConfig, SimulateOutcome]:
    cfg = load_config(SimulateConfig, None, tiny_overrides(run_dir, run_name, *extra))
    return cfg, run_simulate(cfg, log=lambda *_: None)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[SimulateConfig, SimulateOutcome, RolloutBatch]:
    cfg, outcome = simulate(tmp_path_factory.mktemp("runs"), "tiny")
    return cfg, outcome, build_batch(cfg)


# -- (a) determinism -------------------------------------------------------------------------
def test_same_config_gives_byte_identical_metrics_and_events(tmp_path, tiny_run):
    _, first, _ = tiny_run
    _, second = simulate(tmp_path, "again")
    for name in ("metrics.jsonl", "events.jsonl"):
        a, b = Path(first.run_dir, name).read_bytes(), Path(second.run_dir, name).read_bytes()
        assert a, f"{name} is empty"
        assert a == b, f"{name} differs between two runs of the same config"


def test_a_different_workload_seed_changes_metrics_and_events(tmp_path, tiny_run):
    _, first, _ = tiny_run
    _, other = simulate(tmp_path, "seed1", "workload.seed=1")
    for name in ("metrics.jsonl", "events.jsonl"):
        assert Path(first.run_dir, name).read_bytes() != Path(other.run_dir, name).read_bytes()


def test_run_folder_holds_config_metrics_events_and_summary(tiny_run):
    cfg, outcome, _ = tiny_run
    run = Path(outcome.run_dir)
    assert {p.name for p in run.iterdir()} >= {
        "config.yaml",
        "metrics.jsonl",
        "events.jsonl",
        "summary.json",
    }
    # The written config reproduces the run's configuration.
    assert load_config(SimulateConfig, run / "config.yaml") == cfg
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["deployment"] for m in metrics] == list(DEPLOYMENTS)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["makespan_s"] == {m["deployment"]: m["timing/rollout"] for m in metrics}
    assert (
        summary["best_deployment"] == min(metrics, key=lambda m: m["timing/rollout"])["deployment"]
    )
    page = parse_report(run / "report.html")  # self-contained: the figure is embedded
    (table,) = page.tables
    assert [row[0] for row in table[1:]] == list(DEPLOYMENTS)
    assert page.images == [(run / "rollout.png").read_bytes()] and (run / "rollout.svg").exists()


# -- (b) every trajectory and turn, exactly once -------------------------------------------
def test_every_trajectory_completes_exactly_once(tiny_run):
    _, outcome, batch = tiny_run
    expected = {session_id_of(t): t for t in batch.trajectories}
    assert len(expected) == batch.num_trajectories
    for report in outcome.reports:
        done = Counter(t.session_id for t in report.result.trajectories)
        assert done == Counter(expected.keys()), report.deployment
        for traj in report.result.trajectories:
            assert len(traj.turns) == traj.trajectory.num_turns
            # It ended after its environment and reward time, within the batch's makespan.
            assert traj.finished_at - traj.started_at >= traj.trajectory.env_time_s - 1e-9
            assert traj.finished_at <= report.result.finished_at
        assert report.generated_tokens == batch.generated_tokens
        assert report.turns == sum(t.num_turns for t in batch.trajectories)


def test_events_hold_every_turn_once_with_the_workloads_response_length(tiny_run):
    _, outcome, batch = tiny_run
    expected = {
        (session_id_of(t), k): turn.response_tokens
        for t in batch.trajectories
        for k, turn in enumerate(t.turns)
    }
    events = read_jsonl(Path(outcome.run_dir, "events.jsonl"))
    for deployment in DEPLOYMENTS:
        turns = [e for e in events if e["deployment"] == deployment and e["kind"] == "turn"]
        keys = Counter((e["session"], e["turn"]) for e in turns)
        assert set(keys) == set(expected), deployment
        assert max(keys.values()) == 1, f"{deployment}: a turn logged twice"
        for e in turns:
            assert e["generated"] == expected[(e["session"], e["turn"])], e
            assert e["submitted_at"] <= e["first_token_at"] <= e["finished_at"], e
            if deployment.endswith("C"):
                # Colocated: one worker prefills and decodes; no KV moves.
                assert e["kv_bytes"] == 0 and e["prefill_worker"] == e["decode_worker"], e
            elif e["generated"] > 1:
                # Disaggregated: the new KV moves P -> D, another worker decodes.
                assert e["kv_bytes"] > 0, e
                assert e["decode_worker"] not in (None, e["prefill_worker"]), e
            else:
                # A one-token response is sampled by the prefill and never reaches D.
                assert e["kv_bytes"] == 0 and e["decode_worker"] is None, e


# -- (c) the CLI -------------------------------------------------------------------------------
def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "sim.yaml"
    path.write_text(
        "model:\n  name: Qwen3-8B\n"
        "cluster:\n  deployments: [2C]\n"
        "workload:\n  profile: tiny\n"
        f"logger:\n  run_dir: {tmp_path / 'runs'}\n  run_name: cli\n"
    )
    return path


def test_cli_runs_a_config_with_overrides(tmp_path):
    path = write_config(tmp_path)
    result = CliRunner().invoke(
        app,
        ["simulate", "--config", str(path), "cluster.deployments=[2C, 1P1D]", "workload.seed=3"],
    )
    assert result.exit_code == 0, result.output
    run = tmp_path / "runs" / "cli"
    assert f"run folder: {run}" in result.output
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["deployment"] for m in metrics] == ["2C", "1P1D"]
    written = load_config(SimulateConfig, run / "config.yaml")
    assert written.workload.seed == 3 and written.model.name == "Qwen3-8B"


@pytest.mark.parametrize(
    "override, names",
    [
        ("cluster.gpus=4", ["cluster.gpus", "unknown key", "tp"]),  # lists the valid keys
        ("clustr.tp=4", ["clustr", "unknown key"]),
        ("cluster.deployments=[2C, 3X]", ["cluster.deployments", "3X"]),
        ("cluster.tp=0", ["cluster.tp"]),
    ],
)
def test_cli_bad_override_is_a_clear_error(tmp_path, override, names):
    result = CliRunner().invoke(
        app, ["simulate", "--config", str(write_config(tmp_path)), override]
    )
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    for name in names:
        assert name in result.output, result.output
    assert not (tmp_path / "runs").exists(), "a bad config must not start a run"


def test_cli_missing_config_file_names_it(tmp_path):
    missing = tmp_path / "nope.yaml"
    result = CliRunner().invoke(app, ["simulate", "--config", str(missing)])
    assert result.exit_code != 0
    assert str(missing) in result.output


def test_a_trace_truncated_at_max_model_len_replays_and_is_named_as_the_workload(
    tmp_path, tiny_run
):
    """RL traces cut trajectories at the context cap: a sequence of exactly max_model_len
    tokens is valid (the last token's KV is never computed), one token more is not."""
    from pearl.workloads.traces import save_rollout_trace

    _, _, batch = tiny_run
    trace = tmp_path / "capped.jsonl"
    save_rollout_trace(batch, trace)
    cap = max(t.peak_context_tokens for t in batch.trajectories)
    lines: list[str] = []
    cfg = load_config(
        SimulateConfig,
        None,
        tiny_overrides(tmp_path, "capped", f"workload.trace={trace}", f"sim.max_model_len={cap}"),
    )
    outcome = run_simulate(cfg, log=lines.append)
    for report in outcome.reports:
        assert len(report.result.trajectories) == batch.num_trajectories
        assert sum(len(t.turns) for t in report.result.trajectories) == sum(
            t.num_turns for t in batch.trajectories
        )
    summary = json.loads((Path(outcome.run_dir) / "summary.json").read_text())
    assert summary["workload"] == "trace capped.jsonl"
    assert "workload trace capped.jsonl" in lines[0] and "swe" not in lines[0]
    result = CliRunner().invoke(
        app,
        ["simulate", *tiny_overrides(tmp_path, "over", f"workload.trace={trace}")]
        + [f"sim.max_model_len={cap - 1}"],
    )
    assert result.exit_code == 2
    assert f"reaches {cap} tokens, over the engine's max_model_len of {cap - 1}" in result.output


def test_example_config_is_valid():
    cfg = load_config(SimulateConfig, REPO / "configs" / "simulate_default.yaml")
    for label in cfg.cluster.deployments:
        assert Deployment.parse(label).num_workers == 8
    with pytest.raises(ConfigError, match="cluster.bogus"):
        load_config(SimulateConfig, REPO / "configs" / "simulate_default.yaml", ["cluster.bogus=1"])


# -- (d) fast-forward changes speed, not results ---------------------------------------------
@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_fast_forward_gives_the_same_makespan_and_turn_times(tiny_run, deployment):
    cfg, _, batch = tiny_run
    cost = build_cost_model(cfg)
    on, off = (
        simulate_fixed_rollout(
            batch,
            cost,
            Deployment.parse(deployment),
            SimEngineConfig(fast_forward=ff),
            vocab_size=cost.model.vocab_size,
        )
        for ff in (True, False)
    )
    assert on.fast_forwarded_iterations > 0, "the tiny workload should exercise fast-forward"
    assert off.fast_forwarded_iterations == 0
    assert on.timer_events < off.timer_events
    assert math.isclose(on.makespan_s, off.makespan_s, rel_tol=1e-9, abs_tol=0.0)
    assert on.iterations == off.iterations
    assert on.generated_tokens == off.generated_tokens
    assert on.prefill_tokens_computed == off.prefill_tokens_computed
    assert on.kv_bytes_moved == off.kv_bytes_moved
    for a, b in zip(on.result.trajectories, off.result.trajectories, strict=True):
        for x, y in zip(a.turns, b.turns, strict=True):
            assert x.token_ids == y.token_ids
            assert math.isclose(x.telemetry.finished_at, y.telemetry.finished_at, rel_tol=1e-9)
