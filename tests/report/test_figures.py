from pearl.report.figures import decision_points, experiment_figures


def _run(policy="pearl-pd"):
    """Two batches: the first keeps its 4 workers, the second sees a fifth join mid-batch."""
    return {
        "policy": policy,
        "segment": "s",
        "throughput": 100.0,
        "steps": 2,
        "rows": [
            {
                "step": 0,
                "rollout_started_s": 0.0,
                "timing/rollout": 50.0,
                "time_s": 60.0,
                "performance/tokens_per_sec": 90.0,
                "time/decode_s": 30.0,
                "time/idle_env_s": 10.0,
            },
            {
                "step": 1,
                "rollout_started_s": 50.0,
                "timing/rollout": 40.0,
                "time_s": 100.0,
                "performance/tokens_per_sec": 110.0,
                "time/decode_s": 35.0,
            },
        ],
        "events": [
            {"kind": "decision", "t": 0.0, "workers": 4, "target": "4C", "target_makespan_s": 55.0},
            {
                "kind": "decision",
                "t": 50.0,
                "workers": 4,
                "target": "4C",
                "target_makespan_s": 52.0,
            },
        ],
        "timeline": [
            {"t": 0.0, "dedicated_colocated": 4},
            {"t": 70.0, "dedicated_colocated": 4, "overlap_colocated": 1},
        ],
        "rollout_gpus": [(0.0, 8), (70.0, 10)],
        "counters": {"time_by_worker_s": {"w0": {"decode": 30.0}, "o9": {"decode": 5.0}}},
    }


def test_decision_points_pair_each_batch_start_with_its_prediction_and_flag_changes():
    assert decision_points(_run()) == [(55.0, 50.0, True), (52.0, 40.0, False)]


def test_every_experiment_figure_is_written_as_png_and_svg(tmp_path):
    runs = [_run("roll"), _run("pearl")]
    written = experiment_figures(runs, ["s"], tmp_path, tp=2)
    names = sorted(p.name for p in written)
    assert names == sorted(
        f"{kind}_1_s.{ext}"
        for kind in ("throughput", "roles", "time", "decisions")
        for ext in ("png", "svg")
    )
    assert all(p.stat().st_size > 1000 for p in written)
