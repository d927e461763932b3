"""LoRA beside full fine-tuning: the default job with each, one after the other.

    .venv/bin/python benchmarks/lora.py                      # rank 16, ~10 min
    .venv/bin/python benchmarks/lora.py --rank 8 --lora-lr 2e-4 run.seed=1

Runs ``pearl train`` (the embedded default job: SmolLM2-135M-Instruct, calculator, 10
steps of 8 x 4 trajectories, 32 held-out tasks before and after) with every weight
trained, then with ``trainer.lora.rank`` adapters on all linear layers of the decoder
(the base frozen), and reports per run: the trainer's peak memory (its process's
resident set on CPU, PyTorch's allocated device memory on a GPU; ``trainer_memory_mb``
in metrics.jsonl), the median training seconds per step, held-out success before and
after with 95% Wilson intervals, and the wall time. LoRA trains at ``--lora-lr``
(default 1e-4, ten times the full run's 1e-5: LoRA's best learning rate is ~10x full
fine-tuning's, Schulman et al. 2025, "LoRA Without Regret"). Writes ``results/lora.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from pearl.apps.train.run import TrainRun
from pearl.config.train import load_train_config


def run(name: str, overrides: list[str]) -> dict:
    cfg = load_train_config(None, [*overrides, f"run.run_name=lora-bench-{name}"])
    t0 = time.monotonic()
    out = TrainRun(cfg).run()
    wall = time.monotonic() - t0
    rows = [
        json.loads(line)
        for line in (Path(out["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]
    return {
        "name": name,
        "overrides": overrides,
        "trainer_memory_mb": max(r["trainer_memory_mb"] for r in rows),
        "train_s_median": statistics.median(r["train_s"] for r in rows),
        "train_s": [r["train_s"] for r in rows],
        "reward": [r["reward_mean"] for r in rows],
        "before": out["before"],
        "after": out["after"],
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lora-lr", type=float, default=1e-4)
    parser.add_argument("--out", default="results/lora.json")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for both runs")
    args = parser.parse_args()
    lora = [f"trainer.lora.rank={args.rank}", f"trainer.learning_rate={args.lora_lr}"]
    results = [run("full", args.overrides), run(f"lora{args.rank}", [*args.overrides, *lora])]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print()
    print(
        "| run | trainer peak memory | train s / step (median) | held-out before -> after | wall |"
    )
    print("|---|---:|---:|---|---:|")
    for r in results:
        b, a = r["before"], r["after"]
        print(
            f"| {r['name']} | {r['trainer_memory_mb'] / 1024:.2f} GiB | {r['train_s_median']:.1f} | "
            f"{100 * b['success_rate']:.1f}% [{100 * b['ci95'][0]:.1f}, {100 * b['ci95'][1]:.1f}]"
            f" -> {100 * a['success_rate']:.1f}% [{100 * a['ci95'][0]:.1f}, "
            f"{100 * a['ci95'][1]:.1f}] | {r['wall_s'] / 60:.1f} min |"
        )


if __name__ == "__main__":
    main()
