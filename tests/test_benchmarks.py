"""The pieces of the training benchmarks that run without TRL or a finished run."""

import asyncio
import importlib.util
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
    rows = bench.calculator_rows(3)
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
