"""`pearl train` with our engine and with vLLM as the rollout backend, same job, same run.

    bash scripts/vllm_env.sh                                    # once: the venv with vLLM
    .venv-vllm/bin/python benchmarks/rollout_backends.py        # the default job twice, ~10 min
    .venv-vllm/bin/python benchmarks/rollout_backends.py --policies all \
        rollout.workers=2 run.steps=4 run.eval_tasks=16          # every policy, both backends
    .venv-vllm/bin/python benchmarks/rollout_backends.py run.steps=3 run.eval_tasks=8

Runs the default job (or it with the given overrides) for each policy of ``--policies``
(default: the job's own) with ``rollout.backend=pearl`` and then ``rollout.backend=vllm``,
one after the other in fresh processes of the venv this script runs in (vLLM's CPU build
needs its own), and prints per policy and backend: the rollout's tokens per second
(generated tokens over rollout seconds, median over steps), the median step's rollout
makespan, rollout and training seconds, the roles the steps ran, held-out success before
and after (95% Wilson intervals), and the per-step rewards. Writes
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


def run(
    backend: str, overrides: list[str], runs: Path, policy: str | None = None, reuse: bool = False
) -> dict:
    pearl = Path(sys.executable).with_name("pearl")
    name = f"{policy}-{backend}" if policy else backend
    chosen = [f"cluster.policy={policy}"] if policy else []
    args = [
        str(pearl),
        "train",
        f"rollout.backend={backend}",
        *chosen,
        f"run.run_dir={runs}",
        f"run.run_name={name}",
        *overrides,
    ]
    folder = runs / name
    seconds = None  # not known for a run reused from an earlier invocation
    if not (reuse and (folder / "summary.json").exists()):
        shutil.rmtree(folder, ignore_errors=True)
        t0 = time.monotonic()
        done = subprocess.run(args, capture_output=True, text=True)
        seconds = time.monotonic() - t0
        if done.returncode != 0:
            raise SystemExit(f"{name}: pearl train failed:\n{done.stderr[-3000:]}")
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((folder / "summary.json").read_text())
    return {
        "backend": backend,
        "policy": policy,
        "wall_s": seconds,
        "rollout_tokens_per_s": statistics.median(r["rollout_tokens_per_s"] for r in rows),
        "makespan_s": statistics.median(r["rollout_s"] for r in rows),
        "roles": sorted({r["roles"] for r in rows}),
        "rollout_s": sum(r["rollout_s"] for r in rows),
        "train_s": sum(r["train_s"] for r in rows),
        "rewards": [r["reward_mean"] for r in rows],
        "before": summary["before"].get("success_rate"),
        "after": summary["after"].get("success_rate"),
        "heldout_tasks": summary["after"].get("tasks"),
    }


def wall(r: dict) -> str:
    return "-" if r["wall_s"] is None else f"{r['wall_s']:.0f}"


def heldout(r: dict) -> str:
    from pearl.apps.train.metrics import wilson_interval

    if r["before"] is None:
        return "-"
    n = r["heldout_tasks"]

    def one(rate: float) -> str:
        lo, hi = wilson_interval(round(rate * n), n)
        return f"{round(rate * n)}/{n} [{lo:.2f}, {hi:.2f}]"

    return f"{one(r['before'])} -> {one(r['after'])}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/rollout_backends.json")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the finished runs of an interrupted invocation (same overrides) and run the rest",
    )
    parser.add_argument(
        "--policies",
        default="",
        help="comma-separated policies, or 'all' (default: the job's own)",
    )
    parser.add_argument("overrides", nargs="*", help="pearl train overrides (section.key=value)")
    args = parser.parse_args()
    runs = Path(args.out).with_suffix("")
    if not args.reuse:
        shutil.rmtree(runs, ignore_errors=True)
    if args.policies == "all":
        from pearl.control.policies import POLICIES

        policies: list[str | None] = list(POLICIES)
    else:
        policies = args.policies.split(",") if args.policies else [None]
    results = [
        run(backend, args.overrides, runs, policy, args.reuse)
        for policy in policies
        for backend in ("pearl", "vllm")
    ]
    print(
        "| policy | backend | rollout tok/s (median step) | makespan s (median step) | "
        "rollout s | train s | roles | held-out before -> after | wall s |"
    )
    print("|---|---|---:|---:|---:|---:|---|---|---:|")
    for r in results:
        print(
            f"| {r['policy'] or 'default'} | {r['backend']} | {r['rollout_tokens_per_s']:.1f} | "
            f"{r['makespan_s']:.2f} | {r['rollout_s']:.1f} | {r['train_s']:.1f} | "
            f"{'; '.join(r['roles'])} | {heldout(r)} | {wall(r)} |"
        )
    for r in results:
        print(
            f"{r['policy'] or 'default'} {r['backend']} rewards per step: "
            + ", ".join(f"{x:.3f}" for x in r["rewards"])
        )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {"overrides": args.overrides, "policies": args.policies, "runs": results}, indent=2
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
