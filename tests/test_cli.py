import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pearl.cli import app
from pearl.control.policies import POLICIES


def test_demo_runs_and_both_paths_agree():
    result = CliRunner().invoke(app, ["demo", "--sessions", "2", "--turns", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["turns_total"] == 4
    assert report["turns_identical"] == 4
    assert report["generated_tokens"] > 0 and report["kv_bytes_moved"] > 0
    assert report["prefix_cache_hit_rate"] > 0.3  # turn 2 reuses turn 1's KV


def test_demo_rejects_bad_options_with_a_clear_message():
    result = CliRunner().invoke(app, ["demo", "--sessions", "0"])
    assert result.exit_code != 0
    assert "sessions" in result.output


def headline_args(config: str, tmp_path, name: str, *overrides: str) -> list[str]:
    """A one-minute run of a shipped headline config on the tiny workload."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "configs" / config
    return [
        "simulate",
        "--config",
        str(path),
        "rl.duration_s=60",
        "workload.profile=tiny",
        *overrides,
        f"logger.run_dir={tmp_path}",
        f"logger.run_name={name}",
    ]


def test_headline_experiment_runs_every_policy_and_writes_the_table(tmp_path):
    import json

    from reportparse import parse_report

    args = headline_args(
        "headline.yaml",
        tmp_path,
        "h",
        "elastic.segments=[segment2]",
        "policies=[roll,rlboost,pearl]",
        "processes=1",
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run = tmp_path / "h"
    table, times, steps = (run / "table.md").read_text().split("\n\n")[:3]
    assert "| idle_env |" in times and "| roles at start |" in steps
    names = [[c.strip() for c in line.split("|")[1:3]] for line in table.splitlines()[2:]]
    assert names == [["ROLL", "roll"], ["RLBoost+", "rlboost"], ["PEARL", "pearl"]]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {m["policy"] for m in metrics} == {"roll", "rlboost", "pearl"}
    assert all(m["performance/tokens_per_sec"] > 0 for m in metrics)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "roles" for e in events)
    assert any(e["kind"] == "start" for e in events)
    assert any(e["kind"] == "budget" for e in events)
    for figure in ("throughput", "roles", "time", "decisions"):
        assert (run / f"{figure}_1_segment2.png").read_bytes()[:4] == b"\x89PNG"
        assert "<svg" in (run / f"{figure}_1_segment2.svg").read_text()
    page = parse_report(run / "report.html")
    assert "RLBoost+" in page.text and len(page.tables) == 3
    assert len(page.images) == 4  # every figure embedded, none linked from outside
    assert {"metrics.jsonl", "events.jsonl", "summary.json", "table.md"} <= set(page.links)
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["throughput_tokens_per_s"]["segment2"]) == {"roll", "rlboost", "pearl"}
    assert summary["complete"] is True
    kept = sorted(f.name for f in (run / "runs").iterdir())  # each run kept as it finished
    assert kept == ["pearl@segment2.json", "rlboost@segment2.json", "roll@segment2.json"]


def test_sigterm_stops_the_pool_and_keeps_the_finished_runs(tmp_path):
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    pearl = str(Path(sys.executable).parent / "pearl")
    args = headline_args("headline.yaml", tmp_path, "t", "processes=2", "rl.duration_s=1800")
    proc = subprocess.Popen(
        [pearl, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    runs = tmp_path / "t" / "runs"
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if runs.is_dir() and any(runs.iterdir()):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the experiment ended before it could be interrupted"
        children = [int(x) for x in os.popen(f"pgrep -P {proc.pid}").read().split()]
        assert children, "no pool workers"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert "interrupted:" in err and str(runs) in err
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert summary["complete"] is False and summary["runs"] == 21
    assert sorted(f"{k}.json" for k in summary["finished"]) == sorted(
        x.name for x in runs.iterdir()
    )

    from procfs import wait_until_gone

    alive = wait_until_gone(children, 60)
    assert not alive, f"pool workers left running: {alive}"
    # The finished runs make a report of their own (pearl report), marked as partial.
    from reportparse import parse_report

    redone = CliRunner().invoke(app, ["report", str(tmp_path / "t")])
    assert redone.exit_code == 0, redone.output
    page = parse_report(tmp_path / "t" / "report.html")
    assert "interrupted" in page.text
    assert len(page.tables[0]) - 1 == len({k.split("@")[0] for k in summary["finished"]})


def test_a_killed_run_process_is_reported_and_the_other_runs_finish_and_are_kept(tmp_path):
    """The out-of-memory killer takes one run's process: the experiment does not hang; it
    names the lost run and why, finishes the others, keeps them and reports them."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from procfs import process_tree

    pearl = str(Path(sys.executable).parent / "pearl")
    args = headline_args(
        "headline.yaml",
        tmp_path,
        "k",
        "processes=2",
        "policies=[roll,pearl,rlboost]",
        "elastic.segments=[segment2]",
        "rl.duration_s=900",
    )
    proc = subprocess.Popen(
        [pearl, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def run_processes() -> list[int]:
        found = []
        for pid in process_tree(proc.pid) - {proc.pid}:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"spawn_main" in f.read():
                        found.append(pid)
            except OSError:
                continue
        return found

    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and not run_processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        victims = run_processes()
        assert victims, "no run process to kill"
        os.kill(victims[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    summary = json.loads((tmp_path / "k" / "summary.json").read_text())
    assert summary["complete"] is False and len(summary["lost"]) == 1
    [(lost, why)] = summary["lost"].items()
    assert "SIGKILL" in why and f"1 of 3 runs lost ({lost}: " in err
    assert sorted(summary["finished"] + [lost]) == sorted(
        f"{p}@segment2" for p in ("roll", "pearl", "rlboost")
    )
    kept = sorted(x.stem for x in (tmp_path / "k" / "runs").iterdir())
    assert kept == sorted(summary["finished"])
    assert (tmp_path / "k" / "report.html").is_file()


def test_simulate_rejects_bad_experiment_keys_clearly(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "kind=rl", "policies=[roll,pearl9]"])
    assert result.exit_code == 2
    assert "pearl9" in result.output and "valid: roll" in result.output
    result = CliRunner().invoke(app, ["simulate", "kind=rl", "elastic.segments=[/nope.csv]"])
    assert result.exit_code == 2 and "/nope.csv" in result.output
    result = CliRunner().invoke(app, ["simulate", "kind=batch"])
    assert result.exit_code == 2 and "rollout, rl" in result.output
    result = CliRunner().invoke(app, ["simulate", "rl.duration_s=60"])  # forgot kind=rl
    assert result.exit_code == 2 and "add kind=rl" in result.output
    result = CliRunner().invoke(app, ["simulate", "--help"])
    assert "workload.num_tasks" in result.output and "rl.duration_s" in result.output
    for bad, why in [
        ("rl.duration_s=inf", "finite"),
        ("rl.duration_s=1e12", "less than or equal"),
        ("workload.num_tasks=100000000", "less than or equal to 100000"),
    ]:
        result = CliRunner().invoke(app, ["simulate", "kind=rl", bad])
        assert result.exit_code == 2 and why in result.output, (bad, result.output)


def test_thinking_headline_config_runs_in_worker_processes(tmp_path):
    import json

    args = headline_args(
        "headline_thinking.yaml",
        tmp_path,
        "t",
        "elastic.segments=[segment1]",
        "policies=[rlboost,pearl]",
        "processes=2",
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    config_written = (tmp_path / "t" / "config.yaml").read_text()
    assert "overlap_batches: true" in config_written
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert set(summary["throughput_tokens_per_s"]["segment1"]) == {"rlboost", "pearl"}


def test_static_pd_runs_on_a_context_editing_profile(tmp_path):
    """swe_thinking strips earlier turns' thinking from the context: the decode workers keep
    the common prefix (no 'lost the KV' retry storm); every policy with a PD path runs."""
    args = [
        "simulate",
        "--config",
        str(Path(__file__).resolve().parents[1] / "configs" / "headline_thinking.yaml"),
        "rl.duration_s=1500",
        "workload.num_tasks=1",
        "workload.group_size=4",
        "elastic.segments=[segment2]",
        "policies=[static-pd,pearl-pd]",
        "sim.scheduling=sglang",
        "processes=1",
        f"logger.run_dir={tmp_path}",
        "logger.run_name=pd",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "engine scheduling sglang" in result.output
    assert "scheduling: sglang" in (tmp_path / "pd" / "config.yaml").read_text()
    summary = json.loads((tmp_path / "pd" / "summary.json").read_text())
    assert all(v > 0 for v in summary["throughput_tokens_per_s"]["segment2"].values())
    assert summary["counters"]["static-pd@segment2"]["kv_transfer_retries"] == 0


def test_workloads_no_worker_can_hold_are_rejected_up_front(tmp_path):
    result = CliRunner().invoke(
        app, ["simulate", "kind=rl", "sim.max_model_len=8000", f"logger.run_dir={tmp_path}"]
    )
    assert result.exit_code == 2
    assert "sim.max_model_len is 8000" in result.output and "32768" in result.output
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "model.name=Qwen3-32B",
            "cluster.tp=1",
            "cluster.gpu=A100-80G",
            f"logger.run_dir={tmp_path}",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "holds the KV of" in result.output
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "model.name=Qwen3-32B",
            "sim.max_model_len=65536",
            f"logger.run_dir={tmp_path}",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "beyond Qwen3-32B's own context limit of 40960 tokens" in result.output


@pytest.mark.parametrize(
    "config", ["headline.yaml", "headline_thinking.yaml", "headline_paper.yaml"]
)
def test_every_shipped_headline_config_runs_every_policy(tmp_path, config):
    """Each shipped config, all seven policies, on a one-minute tiny workload."""
    args = headline_args(config, tmp_path, "all", "elastic.segments=[segment2]", "processes=1")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "all" / "summary.json").read_text())
    assert set(summary["throughput_tokens_per_s"]["segment2"]) == set(POLICIES)


@pytest.mark.parametrize("cases", ["9", "x", "1,", ""])
def test_calibrate_rejects_bad_cases_before_calibrating(tmp_path, cases):
    result = CliRunner().invoke(
        app, ["calibrate", "--cases", cases, "--out", str(tmp_path / "cpu.yaml")]
    )
    assert result.exit_code == 2
    assert "use all, or a comma list of indices 0-7" in result.output
    assert not (tmp_path / "cpu.yaml").exists()  # nothing was calibrated


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--backend", "sglang"], "--backend 'sglang' is not one of pearl, vllm"),
        (["--backend", "vllm", "--no-fidelity"], "drop --no-fidelity"),
        (["--backend", "vllm", "--calibration", "grid"], "fits in situ only"),
    ],
)
def test_calibrate_against_vllm_refuses_what_it_cannot_do_before_starting(tmp_path, extra, said):
    result = CliRunner().invoke(
        app, ["calibrate", "--out", str(tmp_path / "cpu.yaml"), "--results", "r.json", *extra]
    )
    assert result.exit_code == 2 and said in result.output, result.output
    assert not (tmp_path / "cpu.yaml").exists()


def test_an_availability_trace_that_starts_late_or_ends_early_is_reported(tmp_path):
    import json

    csv = tmp_path / "late.csv"
    csv.write_text("time_s,available\n20,4\n40,2\n")
    args = headline_args(
        "headline.yaml",
        tmp_path,
        "w",
        f"elastic.segments=[{csv}]",
        "policies=[rlboost]",
        "processes=1",
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "starts at 20 s, not 0" in result.output and "before rl.duration_s 60 s" in result.output
    run = tmp_path / "w"
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert sum(e["kind"] == "warning" for e in events) == 2
    assert len(json.loads((run / "summary.json").read_text())["warnings"]) == 2
    (kept,) = (run / "runs").iterdir()  # a CSV path as the segment: a flat file name
    assert kept.name.startswith("rlboost@") and kept.name.endswith("late.csv.json")


@pytest.mark.parametrize("kind", ["rollout", "rl", "train", "plan"])
def test_config_show_prints_every_default_with_its_meaning_as_a_loadable_config(kind, tmp_path):
    from pearl.config.loading import load_config
    from pearl.config.plan import PlanConfig
    from pearl.config.simulate import RLExperimentConfig, SimulateConfig
    from pearl.config.train import TrainConfig

    result = CliRunner().invoke(app, ["config", "show", kind])
    assert result.exit_code == 0, result.output
    leaves = [line for line in result.output.splitlines() if ":" in line and not line.endswith(":")]
    undocumented = [line for line in leaves if not line.startswith("#") and "  # " not in line]
    assert leaves and not undocumented
    path = tmp_path / "shown.yaml"
    path.write_text(result.output)
    model = {
        "rollout": SimulateConfig,
        "rl": RLExperimentConfig,
        "train": TrainConfig,
        "plan": PlanConfig,
    }[kind]
    assert load_config(model, path) == model()  # the printout is the defaults, as a config


def test_config_show_names_the_valid_kinds():
    result = CliRunner().invoke(app, ["config", "show", "rlx"])
    assert result.exit_code == 2 and "valid: rollout, rl, train, plan" in result.output


def test_long_runs_report_progress_and_quiet_leaves_only_the_results(tmp_path):
    args = headline_args(
        "headline.yaml",
        tmp_path,
        "p",
        "elastic.segments=[segment2]",
        "policies=[roll,pearl]",
        "processes=1",
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "[1/2] 50% simulated RL runs" in result.output and "ETA" in result.output
    assert "[2/2] 100%" in result.output and "| RLBoost+ |" not in result.output
    quiet = CliRunner().invoke(app, ["--quiet", *args[:-1], "logger.run_name=q"])
    assert quiet.exit_code == 0, quiet.output
    assert "simulated RL runs" not in quiet.output and "run folder:" in quiet.output
    assert "| PEARL | pearl |" in quiet.output  # the table is a result: stdout, always
    both = CliRunner().invoke(app, ["--quiet", "--verbose", *args])
    assert both.exit_code == 2 and "exclude each other" in both.output


def test_throughput_table_uses_the_papers_names_and_enough_decimals():
    from pearl.report.tables import throughput_table

    runs = [
        {"policy": p, "segment": "s1", "throughput": t, "steps": 12}
        for p, t in (("roll", 3419.04), ("rlboost", 3558.1), ("pearl", 3560.43))
    ]
    lines = throughput_table(runs, ["roll", "rlboost", "pearl"], ["s1"]).splitlines()
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]]
    assert cells[0] == ["ROLL", "roll", "3419.0", "12", "1.000x", "-3.91%"]
    # PEARL and RLBoost+ differ by 0.06%: two decimals of a percentage show it
    assert cells[2] == ["PEARL", "pearl", "3560.4", "12", "1.041x", "+0.07%"]


def test_report_of_a_folder_without_runs_says_what_it_needs(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "runs/<policy>@<segment>.json" in result.output


def test_calibrate_without_fidelity_logs_its_phases_and_writes_the_profile(tmp_path):
    out = tmp_path / "cpu.yaml"
    args = ["calibrate", "--model", "qwen3-tiny", "--grid", "quick", "--repeats", "1"]
    result = CliRunner().invoke(app, [*args, "--no-fidelity", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "calibrate: profile qwen3-tiny on the 'quick' grid" in result.output
    assert "[16/16]" in result.output and str(out) in result.output and out.is_file()
