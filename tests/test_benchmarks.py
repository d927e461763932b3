"""The pieces of the training benchmarks that run without TRL or a finished run."""

import asyncio
import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trl_side_gets_pearls_prompts_and_the_environments_reward():
    from pearl.envs import make_env, split_seed

    bench = load("train_vs_trl")
    rows = bench.calculator_rows(3, "single")
    assert [r["seed"] for r in rows] == [split_seed("train", i) for i in range(3)]
    env = make_env("calculator", max_turns=1)
    question = asyncio.run(env.reset(rows[1]["seed"]))
    roles = [m["role"] for m in rows[1]["prompt"]]
    assert roles == ["system", "user", "assistant", "user"]  # system, worked example, task
    assert rows[1]["prompt"][0]["content"] == env.system_prompt
    assert rows[1]["prompt"][-1]["content"] == question
    right = f"<answer>{env.problem.answer}</answer>"
    completions = [
        [{"role": "assistant", "content": right}],
        [{"role": "assistant", "content": "<answer>-1</answer>"}],
        [{"role": "assistant", "content": "no idea"}],
    ]
    seeds = [rows[1]["seed"]] * 3
    assert bench.calculator_reward(None, completions, seeds) == [1.0, 0.1, 0.0]


def test_trl_multi_turn_side_gets_the_same_tool_and_prompts():
    """TRL's environment exposes the same calculate tool (its schema, derived by
    transformers from the method, equals the PEARL environment's) with the same results."""
    pytest.importorskip("transformers")
    from transformers.utils import get_json_schema

    from pearl.envs.calculator import CALCULATE

    bench = load("train_vs_trl")
    schema = get_json_schema(bench.TrlCalculator().calculate)
    schema["function"].pop("return", None)
    assert schema == CALCULATE
    env = bench.TrlCalculator()
    assert env.reset(seed=3) is None and env.calculate("12 * 7") == "84"
    assert env.calculate("1 +").startswith("error:")
    rows = bench.calculator_rows(2, "multi")
    shown = [m["content"] for m in rows[0]["prompt"]]
    assert '"name": "calculate"' in shown[2] and shown[3].startswith("<tool_response>")


@pytest.mark.parametrize("task", ["single", "multi"])
def test_the_dr_grpo_variant_sets_the_same_loss_on_both_sides(task):
    """``--variant dr_grpo``: TRL's loss_type and scaling, and PEARL's overrides that
    tests/live/test_grpo_vs_trl.py pairs with them (normalizer: TRL's completion cap)."""
    from pearl.config.train import load_train_config

    bench = load("train_vs_trl")
    settings = {"variant": "dr_grpo", "max_new_tokens": bench.TURN_TOKENS}
    trl, ours = bench.variant(settings, task)
    assert trl == {"loss_type": "dr_grpo", "scale_rewards": "none"}
    trainer = load_train_config(None, ours).trainer
    assert (trainer.loss_agg_mode, trainer.scale_rewards) == ("seq-mean-token-sum-norm", "none")
    cap = bench.TURN_TOKENS * bench.TASKS[task]["max_turns"]
    assert trainer.loss_norm_tokens == cap
    assert bench.variant({**settings, "variant": "default"}, task) == ({}, [])


def test_replay_rebuilds_a_steps_rollout_from_its_token_counts():
    bench = load("train_live_vs_sim")
    step = {
        "step": 1,
        "rollout_s": 2.0,
        "shared_prefix_tokens": 50,
        "trajectories": [
            {"group": "train0", "turns": [[80, 12, 12, 0.0]]},
            {"group": "train0", "turns": [[80, 5, 5, 0.01], [9, 7, 7, 0.0]]},
            {"group": "train1", "turns": [[75, 64, 64, 0.0]]},
        ],
        "iterations": [],
    }
    batch = bench.batch_of(step, 768)
    assert [g.task_id for g in batch.groups] == ["train0", "train1"]
    first, second = batch.groups[0].trajectories
    assert [t.observation_tokens for t in second.turns] == [80, 9]
    assert [t.response_tokens for t in second.turns] == [5, 7]
    assert second.turns[0].env_latency_s == pytest.approx(0.01)
    assert first.shared_prefix_tokens == 50 and second.index_in_group == 1


def test_regime_map_rebuilds_cells_from_json_and_rejects_unknown_knobs(monkeypatch, capsys):
    from pearl.apps.paper.ratio_selection import CandidateOutcome, StepSelection
    from pearl.apps.regime_map import Cell

    bench = load("pd_regime_map")
    sel = StepSelection(
        1,
        2,
        (CandidateOutcome("2C", 10.0, 100.0, True), CandidateOutcome("1P1D", 9.0, 90.0, True)),
        "1P1D",
    )
    row = Cell({"observation": 3, "context": 32768}, sel).to_dict()
    again = bench._cell(row)
    assert again.best_split == "1P1D" and again.best_split_gain == pytest.approx(0.1)
    assert again.chosen_gain == pytest.approx(0.1) and again.values == row["values"]
    monkeypatch.setattr("sys.argv", ["pd_regime_map.py", "--maps", "observation:colour"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "want two different knobs" in capsys.readouterr().err


def test_kernel_checks_fit_on_their_fit_rows_and_report_every_held_out_row(tmp_path, monkeypatch):
    import json

    bench = load("costmodel_vs_kernels")
    out = tmp_path / "k.json"
    monkeypatch.setattr("sys.argv", ["costmodel_vs_kernels.py", "--out", str(out)])
    bench.main()
    res = json.loads(out.read_text())
    decode = res["decode_attention"]["rows"]
    assert [r["split"] for r in decode] == ["fit", "held out", "held out", "held out"]
    assert decode[0]["fitted_ratio"] == pytest.approx(1.0)
    assert 0 < res["decode_attention"]["fitted_kv_efficiency"] < 1
    prefill = res["prefill_attention"]
    assert set(prefill["held_out_ratio_fitted"]) == {"512", "2048", "8192"}
    # the fitted efficiency is the geometric mean of the fit rows' measured efficiencies
    assert 0.4 < prefill["fitted_efficiency"] < 0.7
    assert set(res["moe"]["ratio_by_tokens"]) == {str(t) for t in bench.MIXTRAL_MOE_TP2}
    # a chunk appended to a long context is priced as its causal pairs: the new tokens' rows
    # over the prior context plus their own triangle, at the fitted efficiency
    chunks = res["chunk_append"]["rows"]
    assert len(chunks) == len(bench.CUDNN_H200_APPEND)
    cost = bench.attention_cost(64, 8, bench.CostConstants(attention_compute_efficiency=1.0))
    pairs = 512 * 7680 + 512 * 513 // 2
    flops = pairs * 4 * 64 * 128
    assert bench.chunk_attention_s(cost, 512, 7680) == pytest.approx(flops / cost.gpu.peak_flops)
    full = [r["fitted_ratio"] for r in chunks if r["heads"][0] * r["new_tokens"] >= 32768]
    assert 0.8 < min(full) and max(full) < 1.2  # the measured result this check reports
    assert len(res["decode_attention_gqa_h200"]) == 10
    # one expert shape at one token reads 2 of 8 experts: the weights of two experts
    one = bench.moe_layer_s(1, 2, bench.CostConstants())
    assert 1e-4 < one < 2e-4


def _tiny_model_and_no_ray(tmp_path):
    """A tiny chat model folder; no Ray runtime left from an earlier test (the benchmark
    starts its own)."""
    import ray
    from tiny_model import tiny_chat_model

    if ray.is_initialized():
        ray.shutdown()
    return tiny_chat_model(tmp_path / "model")


def test_trainer_processes_reports_one_and_two_processes_agreeing(tmp_path, monkeypatch):
    import json

    model = _tiny_model_and_no_ray(tmp_path)
    bench = load("trainer_processes")
    out = tmp_path / "t.json"
    argv = ["trainer_processes.py", "--model", str(model), "--steps", "2", "--out", str(out)]
    monkeypatch.setattr("sys.argv", argv)
    bench.main()
    trainers = json.loads(out.read_text())["trainers"]
    assert set(trainers) == {
        "1 process, 2 threads",
        "1 process, 1 thread",
        "2 processes, 1 thread each",
    }
    for row in trainers.values():
        assert len(row["step_s"]) == 2 and row["max_weight_diff"] < 1e-5


@pytest.mark.slow  # ~37 s: a three-node Ray cluster (the fast suite's budget)
def test_node_loss_runs_and_audits_every_step(tmp_path, monkeypatch):
    import json

    model = _tiny_model_and_no_ray(tmp_path)
    bench = load("node_loss")
    out = tmp_path / "n.json"
    overrides = [
        f"model.name={model}",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=8",
        "run.steps=4",
        "run.eval_tasks=0",
    ]
    monkeypatch.setattr("sys.argv", ["node_loss.py", "--runs", "1", "--out", str(out), *overrides])
    bench.main()
    (run,) = json.loads(out.read_text())["runs"]
    assert run["steps"] == 4 and run["lost"] == 0 == run["duplicated"]
    # (the last step may finish on the survivor before the lost worker is asked anything)
    assert 1 <= run["lose_at"] <= 3 and run["failures"] <= 1


def test_gpu_check_compares_the_engine_with_transformers_on_any_device(tmp_path, monkeypatch):
    """scripts/gpu_check.py, the first GPU session's engine check, run here on the CPU."""
    import json

    from tiny_model import tiny_chat_model

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = tiny_chat_model(tmp_path / "model")
    out = tmp_path / "engine.json"
    argv = ["gpu_check.py", "--device", "cpu", "--model", str(model), "--out", str(out)]
    monkeypatch.setattr("sys.argv", [*argv, "--batches", "1", "3"])
    module.main()
    result = json.loads(out.read_text())
    rows = result["checks"]
    assert [r["dtype"] for r in rows] == ["float32", "bfloat16"] and all(r["ok"] for r in rows)
    assert rows[0]["max_logit_diff"] < 1e-4 and rows[0]["greedy_tokens_equal"] == 16
    decode = result["decode"]
    assert [(r["dtype"], r["batch"]) for r in decode] == [
        (d, b) for d in ("float32", "bfloat16") for b in (1, 3)
    ]
    assert all(r["engine_tokens_per_s"] > 0 and r["generate_tokens_per_s"] > 0 for r in decode)


def test_sim_scale_measures_each_size_in_its_own_process(tmp_path):
    """The scale benchmark at its smallest: two sizes and one short memory run; every row
    complete."""
    import json
    import subprocess
    import sys

    out = tmp_path / "scale.json"
    args = ["--workers", "2", "4", "--models", "Qwen3-8B", "--out", str(out)]
    args += ["--memory-durations", "300", "--memory-policies", "roll", "--memory-available", "2"]
    scratch = tmp_path / "tmp"  # its traces' folder goes here, and is gone at the end
    scratch.mkdir()
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sim_scale.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not list(scratch.glob("pearl-sim-scale-*"))
    res = json.loads(out.read_text())
    assert not res["lost"]
    assert [(r["workers"], r["batch"], r["steps"]) for r in res["rows"]] == [(2, 16, 1), (4, 32, 1)]
    assert all(r["iterations"] > 0 and r["turns"] > 0 and r["peak_mb"] > 0 for r in res["rows"])
    # Each size's result digest, the same when the size runs again (what a speed-up that
    # must not change results is checked by).
    digests = [r["digest"] for r in res["rows"]]
    assert len(set(digests)) == 2 and all(len(d) == 16 for d in digests)
    bench = load("sim_scale")
    trace = tmp_path / "reserved_only.csv"
    trace.write_text("time_s,available\n0,0\n")
    assert bench.one_step("Qwen3-8B", 2, str(trace))["digest"] == digests[0]
    assert "Qwen3-8B" in res["growth"] and res["decision_latency_ms_1024_workers"]["Qwen3-8B"] > 0
    (memory,) = res["memory_over_steps"]  # the memory run, at a constant availability
    assert (memory["policy"], memory["trace"], memory["duration_s"]) == (
        "roll",
        "constant_2.csv",
        300,
    )
    assert memory["peak_mb"] > 0


def test_trainer_memory_batch_scores_every_trajectory():
    """The memory benchmark's batch: 8 groups of 4 whose rewards differ within each group,
    so no trajectory is skipped and every variant does the same work."""
    from pearl.live.grpo import advantages

    bench = load("trainer_memory")
    batch = bench.synthetic_batch(1000)
    samples = batch.samples
    assert len(samples) == 32 and len({s.group for s in samples}) == 8
    assert all(a != 0 for a in advantages([s.reward for s in samples], [s.group for s in samples]))
    assert set(bench.VARIANTS) == {"full", "full + KL", "LoRA", "LoRA + KL"}


def test_sim_ab_alternates_a_revision_with_the_tree_and_compares_digests(capsys):
    """benchmarks/sim_ab.py: runs in ABBA order, each on its own tree, and the same code
    on both sides gives one digest (exit 0)."""
    bench = load("sim_ab")
    assert bench.order(3) == ["base", "new", "new", "base", "base", "new"]
    bench.main(["--base", "HEAD", "--workers", "2", "--pairs", "1"])
    out = capsys.readouterr().out
    assert "2 workers, 1 pairs" in out and "on every run" in out
    assert "base's runs' environment: " in out and "new's runs' environment: " in out
    assert [line.split()[0] for line in out.splitlines()[:2]] == ["base", "new"]
    # the verdict when a side's runs give another digest (a change that moved results)
    runs = {"base": [{"digest": "a"}, {"digest": "a"}], "new": [{"digest": "b"}, {"digest": "a"}]}
    assert bench.digest_verdict(runs) == (
        False,
        "DIGESTS DIFFER: {'base': ['a'], 'new': ['a', 'b']}",
    )
    assert bench.digest_verdict({"base": [{"digest": "a"}], "new": [{"digest": "a"}]})[0]


def test_c7_reuse_arithmetic_prices_both_readings_on_the_simulated_trajectories(
    tmp_path, monkeypatch
):
    """benchmarks/c7_reuse_arithmetic.py (one task of swe_paper, ~1 s): each turn priced
    alone reproduces the simulator's own prefill seconds; zero reuse prefills every prompt
    token, costs more but less per token than reuse (its tokens attend to shorter contexts),
    so the issue's same-price estimate overstates its share."""
    import json
    import sys

    # Its dataclasses look their module up in sys.modules while the class is built.
    name = "c7_reuse_arithmetic"
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, bench)
    spec.loader.exec_module(bench)
    out = tmp_path / "c7.json"
    monkeypatch.setattr("sys.argv", ["c7_reuse_arithmetic.py", "--tasks", "1", "--out", str(out)])
    bench.main()
    res = json.loads(out.read_text())
    rows = {r["reading"]: r for r in res["rows"]}
    sim = rows["simulator as run (reuse)"]
    reuse = rows["(a) reuse, priced per turn"]
    zero = rows["(b) zero reuse, priced per turn"]
    naive = rows["naive: (a) per token x (b) tokens"]
    assert reuse["prefill_s"] == pytest.approx(sim["prefill_s"], rel=0.02)
    assert reuse["prefill_tokens_per_decoded"] == pytest.approx(sim["prefill_tokens_per_decoded"])
    assert res["prompt_tokens"] / res["decoded_tokens"] == pytest.approx(
        zero["prefill_tokens_per_decoded"]
    )
    assert res["computed_tokens_with_reuse"] < res["prompt_tokens"]
    assert reuse["prefill_share"] < zero["prefill_share"] < naive["prefill_share"]
    assert zero["us_per_token_per_worker"] < reuse["us_per_token_per_worker"]
    assert naive["us_per_token_per_worker"] == pytest.approx(reuse["us_per_token_per_worker"])
    # a chunk pays attention over everything before it: alone, the whole prompt is cheaper
    assert zero["attention_s"] / reuse["attention_s"] < zero["linear_s"] / reuse["linear_s"]


def test_swe_trace_reads_each_turns_quantities_and_summarizes_them(tmp_path):
    """benchmarks/swe_trace.py: the first turn's appended tokens are the prompt, later ones
    observations (a re-prompt when >= the prompt); the last turn's environment seconds are
    the agent's time after its last answer, kept apart; a trajectory without turns is left
    out; the profile side reads a sampled batch the same way."""
    import json

    from pearl.workloads.agentic import generate_batch
    from pearl.workloads.profiles import get_profile

    bench = load("swe_trace")
    steps = [
        {
            "step": 0,
            "trajectories": [
                {"group": "a", "turns": [[100, 10, 0, 0.5], [20, 30, 0, 1.5], [40, 50, 50, 9.0]]},
                {"group": "a", "turns": []},
            ],
        },
        {
            "step": 1,
            "trajectories": [{"group": "b", "turns": [[300, 70, 0, 2.5], [300, 90, 90, 7.0]]}],
        },
    ]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    live = bench.live_samples(bench.load_steps(tmp_path))
    assert live["turns"] == [3, 2]
    assert live["first_prompt_tokens"] == [100, 300]
    assert live["observation_tokens"] == [20, 40, 300]
    assert live["reprompts"] == [300]
    assert live["generated_tokens"] == [10, 30, 50, 70, 90]
    assert live["env_s"] == [0.5, 1.5, 2.5]
    assert live["final_env_s"] == [9.0, 7.0]

    s = bench.summary([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    assert (s["count"], s["median"], s["p10"], s["p90"], s["mean"]) == (11, 6, 2, 10, 6)
    assert bench.summary([])["median"] is None

    batch = generate_batch(get_profile("swe"), num_tasks=2, group_size=3, seed=1)
    profile = bench.profile_samples(batch)
    trajectories = [t for g in batch.groups for t in g.trajectories]
    assert profile["turns"] == [t.num_turns for t in trajectories]
    assert (
        len(profile["env_s"])
        == len(profile["observation_tokens"])
        == sum(t.num_turns - 1 for t in trajectories)
    )
    assert sum(profile["generated_tokens"]) == sum(
        u.response_tokens for t in trajectories for u in t.turns
    )
    rows = {r["quantity"]: r for r in bench.compare(live, profile)}
    assert rows["generated_tokens"]["live"]["median"] == 50
    assert rows["generated_tokens"]["median_ratio"] == pytest.approx(
        50 / rows["generated_tokens"]["profile"]["median"]
    )


@pytest.mark.slow  # five `pearl train` runs, ~40 s
def test_slow_env_runs_every_side_and_reads_back_idle_share_and_step_time(tmp_path, monkeypatch):
    """Every side of benchmarks/slow_env.py (synchronous, asynchronous, overlapping batches,
    PEARL's policy) on the tiny model; the calculator stands in for the SWE tasks, whose
    prompts do not fit its context."""
    import json

    import yaml

    model = _tiny_model_and_no_ray(tmp_path)
    bench = load("slow_env")
    out = tmp_path / "s.json"
    overrides = [
        f"model.name={model}",
        "env.name=calculator",
        "env.options={}",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=8",
        "rollout.max_context_tokens=768",
        "run.steps=3",
    ]
    argv = ["slow_env.py", "--runs", str(tmp_path / "runs"), "--out", str(out), *overrides]
    monkeypatch.setattr("sys.argv", argv)
    bench.main()
    sides = {r["side"]: r for r in json.loads(out.read_text())["sides"]}
    assert list(sides) == list(bench.SIDES)
    for r in sides.values():
        assert r["steps"] == 3 and r["engine_busy_s"] > 0 and 0 <= r["idle_share"] < 1
        assert r["step_s"] * 3 == pytest.approx(r["steps_wall_s"])
    assert sides["sync"]["staleness_max"] == 0
    recorded = {  # each side ran with its own keys
        side: yaml.safe_load((tmp_path / "runs" / side / "config.yaml").read_text())
        for side in sides
    }
    assert [recorded[s]["run"]["max_staleness"] for s in sides] == [0, 1, 1, 1, 1]
    overlap = [recorded[s]["run"]["overlap_batches"] for s in sides]
    assert overlap == [False, False, True, False, True]
    assert [recorded[s]["cluster"]["policy"] for s in sides] == ["roll"] * 3 + ["pearl"] * 2


def test_borrowed_seconds_pair_each_borrow_with_its_give_back():
    bench = load("slow_env")
    events = [
        {"kind": "start", "t": 0.0},
        {"kind": "borrow", "t": 10.0},
        {"kind": "give_back", "t": 14.0},
        {"kind": "borrow", "t": 20.0},
        {"kind": "refit", "t": 25.0},
    ]
    assert bench.borrowed_seconds(events) == 9.0  # 4 s, then 5 s still borrowed at the end


def test_sampler_benchmark_times_both_samplers_on_every_case(tmp_path, monkeypatch):
    import json

    bench = load("sampler")
    out = tmp_path / "s.json"
    argv = ["sampler.py", "--batches", "1", "3", "--pairs", "1", "--calls", "1", "--out", str(out)]
    monkeypatch.setattr("sys.argv", argv)
    bench.main()
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["rows"]) for r in rows] == [
        (n, case) for n in (1, 3) for case in bench.CASES
    ]
    assert all(r["baseline_ms"] > 0 and r["batched_ms"] > 0 and r["speedup"] > 0 for r in rows)


def test_gpu_check_script_stops_at_once_where_torch_sees_no_gpu(tmp_path):
    """scripts/gpu_check.sh on a machine's own Python (offline mode) without a GPU: it says
    so and stops before anything else runs."""
    import subprocess
    import sys

    env = {**os.environ, "PEARL_GPU_PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "sees no GPU" in done.stdout + done.stderr
    assert not (tmp_path / "out" / "engine.json").exists()


def test_gpu_check_builds_a_random_model_of_a_named_architecture(tmp_path, monkeypatch):
    """``--random-model``: where no weights can travel, the architecture is built here with
    random weights (a tiny one stands in for SmolLM2's 30 layers) and checked the same way."""
    import json

    from tiny_model import CHAT_LLAMA

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.ARCHITECTURES["smollm2-135m"]["num_hidden_layers"] == 30
    monkeypatch.setitem(module.ARCHITECTURES, "tiny", CHAT_LLAMA)
    out = tmp_path / "engine.json"
    argv = ["gpu_check.py", "--device", "cpu", "--random-model", "tiny", "--dtypes", "float32"]
    monkeypatch.setattr("sys.argv", [*argv, "--batches", "2", "--out", str(out)])
    module.main()
    (check,) = json.loads(out.read_text())["checks"]
    assert check["ok"] and (tmp_path / "random-tiny" / "config.json").is_file()
    with pytest.raises(SystemExit, match="known are"):
        module.random_model("nope", tmp_path / "x")


def test_engine_vs_vllm_times_our_engine_in_a_pinned_process_of_its_own(tmp_path, monkeypatch):
    """benchmarks/engine_vs_vllm.py's side of our engine (vLLM's side runs with the vLLM
    suite, tests/live/test_vllm_backend.py): whole generate and decode rates per case, and
    the decode step's profile."""
    import json

    from tiny_model import tiny_chat_model

    model = tiny_chat_model(tmp_path / "model")
    bench = load("engine_vs_vllm")
    out = tmp_path / "e.json"
    argv = ["engine_vs_vllm.py", "--model", str(model), "--sides", "pearl", "pearl-plain"]
    argv += ["--profile", "--cases", "2,8,4", "4,16,3", "--repeats", "1", "--out", str(out)]
    monkeypatch.setattr("sys.argv", argv)
    bench.main()
    result = json.loads(out.read_text())
    for side, gemm in (("pearl", "mkldnn::_linear_pointwise"), ("pearl-plain", "aten::mm")):
        rows = result[side]
        cases = [r for r in rows if "batch" in r]
        assert [(r["batch"], r["prompt"], r["new"]) for r in cases] == [(2, 8, 4), (4, 16, 3)]
        assert all(r["tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0 for r in cases)
        (profile,) = [r["profile"] for r in rows if "profile" in r]
        assert profile[0]["what"] == "wall per step (ms)" and len(profile) > 3
        assert gemm in {p["what"] for p in profile}  # each side ran its own GEMM


def test_speed_machinery_turns_each_mechanism_off_alone_and_compares_digests(tmp_path):
    """benchmarks/speed_machinery.py: rounds forward then backward; each run says what it ran
    with, and the benchmark stops if a variant had anything but its own mechanism off."""
    bench = load("speed_machinery")
    assert bench.order(2, ("all", "a", "b")) == ["all", "a", "b", "b", "a", "all"]
    from pearl import native

    if not native.built():
        pytest.skip("no compiled build of these sources (python -m pearl.native)")
    out = tmp_path / "sm.json"
    bench.main(["--workers", "2", "--rounds", "2", "--variants", "default-gc", "asyncio-loop",
                "--out", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert len(result["digests"]) == 1
    for variant, runs in result["runs"].items():
        assert len(runs) == 2
        assert {m for m, on in runs[0]["on"].items() if not on} == bench.OFF[variant]
    assert set(result["variants"]) == {"all", "default-gc", "asyncio-loop"}
