"""`pearl train` with our engine and with vLLM as the rollout backend, same job, same run.

    bash scripts/vllm_env.sh                                    # once: the venv with vLLM
    .venv-vllm/bin/python benchmarks/rollout_backends.py        # the default job twice, ~10 min
    .venv-vllm/bin/python benchmarks/rollout_backends.py run.steps=3 run.eval_tasks=8

Runs the default job (or it with the given overrides) with ``rollout.backend=pearl`` and
then ``rollout.backend=vllm``, one after the other in fresh processes of the venv this
script runs in (vLLM's CPU build needs its own), and prints per backend: the rollout's
tokens per second (generated tokens over rollout seconds, median over steps), rollout and
training seconds, held-out success before and after, and the per-step rewards. Writes
``results/rollout_backends.json``; the run folders (checkpoints removed) stay in
``results/rollout_backends/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def run(backend: str, overrides: list[str], runs: Path) -> dict:
    pearl = Path(sys.executable).with_name("pearl")
    args = [
        str(pearl),
        "train",
        f"rollout.backend={backend}",
        f"run.run_dir={runs}",
        f"run.run_name={backend}",
        *overrides,
    ]
    t0 = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{backend}: pearl train failed:\n{done.stderr[-3000:]}")
    folder = runs / backend
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((folder / "summary.json").read_text())
    return {
        "backend": backend,
        "wall_s": seconds,
        "rollout_tokens_per_s": statistics.median(r["rollout_tokens_per_s"] for r in rows),
        "rollout_s": sum(r["rollout_s"] for r in rows),
        "train_s": sum(r["train_s"] for r in rows),
        "rewards": [r["reward_mean"] for r in rows],
        "before": summary["before"].get("success_rate"),
        "after": summary["after"].get("success_rate"),
        "heldout_tasks": summary["after"].get("tasks"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/rollout_backends.json")
    parser.add_argument("overrides", nargs="*", help="pearl train overrides (section.key=value)")
    args = parser.parse_args()
    runs = Path(args.out).with_suffix("")
    shutil.rmtree(runs, ignore_errors=True)
    results = [run(backend, args.overrides, runs) for backend in ("pearl", "vllm")]
    print(
        "| backend | rollout tok/s (median step) | rollout s | train s | held-out before -> after | wall s |"
    )
    print("|---|---:|---:|---:|---|---:|")
    for r in results:
        heldout = (
            f"{r['before']:.3f} -> {r['after']:.3f} of {r['heldout_tasks']}"
            if r["before"] is not None
            else "-"
        )
        print(
            f"| {r['backend']} | {r['rollout_tokens_per_s']:.1f} | {r['rollout_s']:.1f} | "
            f"{r['train_s']:.1f} | {heldout} | {r['wall_s']:.0f} |"
        )
    for r in results:
        print(f"{r['backend']} rewards per step: " + ", ".join(f"{x:.3f}" for x in r["rewards"]))
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"overrides": args.overrides, "runs": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
