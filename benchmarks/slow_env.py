"""Rollout where the environment is slow: synchronous GRPO against asynchronous rollout and
PEARL's policies on the same job, one run each, side by side.

    .venv/bin/python benchmarks/slow_env.py                      # configs/train_swe_slow_env.yaml
    .venv/bin/python benchmarks/slow_env.py --sides sync async run.steps=2   # a subset, shorter

The job (``configs/train_swe_slow_env.yaml``): SmolLM2-135M-Instruct fixing the shipped SWE
tasks in PEARL's sandbox, every command waiting a remote sandbox's round trip first
(``env.options.remote_latency_s``, a wait that holds no CPU). The sides differ only in the
keys below; each is a whole ``pearl train`` run in this process, one after another:

- ``sync``: synchronous GRPO (``run.max_staleness=0``): a batch rolls out only once the
  previous step has trained and its weights are on the workers.
- ``async``: staleness 1: batch i + 1 rolls out while step i trains.
- ``overlap``: staleness 1 and ``run.overlap_batches``: batch i + 1 also starts while the
  tail of batch i still waits on its environment.
- ``pearl``: PEARL's policy (adaptive PD, gated borrowing of the trainer's slot between
  updates), staleness 1; ``pearl-overlap``: the same with ``run.overlap_batches``.

Per side, read back from the run folder: seconds per step (the steps' wall, from the first
rollout's start to the last step's end, over the steps), rollout seconds per step (median),
training seconds, and the rollout workers' idle share: 1 - the engines' busy seconds (the
iterations in ``rollouts.jsonl``) / the seconds the workers were there (the dedicated
workers over the steps' wall, plus the trainer's slot while borrowed). Writes
``results/slow_env.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "train_swe_slow_env.yaml"
SIDES: dict[str, list[str]] = {
    "sync": ["cluster.policy=roll", "run.max_staleness=0"],
    "async": ["cluster.policy=roll", "run.max_staleness=1"],
    "overlap": ["cluster.policy=roll", "run.max_staleness=1", "run.overlap_batches=true"],
    "pearl": ["cluster.policy=pearl", "run.max_staleness=1"],
    "pearl-overlap": ["cluster.policy=pearl", "run.max_staleness=1", "run.overlap_batches=true"],
}


def run_side(side: str, runs: Path, overrides: list[str], config: Path) -> dict[str, Any]:
    """One ``pearl train`` run of ``side`` (its folder ``runs/side``), read back."""
    from pearl.apps.train.run import TrainRun
    from pearl.config.train import load_train_config

    # Each side starts its own runtime (PEARL's needs a slot more); ray is not imported
    # here before PEARL has set up the first one (loopback only).
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    cfg = load_train_config(
        config, [*SIDES[side], *overrides, f"run.run_dir={runs}", f"run.run_name={side}"]
    )
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    TrainRun(cfg, log=lambda _: None).run()
    wall = time.monotonic() - t0
    return {"side": side, "run_wall_s": wall, "load_before": load_before} | read_run(
        runs / side, cfg.rollout.workers
    )


def read_run(folder: Path, workers: int) -> dict[str, Any]:
    """A finished run's step timing, the engines' busy seconds and the workers' idle share."""
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    shapes = [json.loads(x) for x in (folder / "rollouts.jsonl").read_text().splitlines()]
    events = [json.loads(x) for x in (folder / "events.jsonl").read_text().splitlines()]
    if not rows:
        raise SystemExit(f"{folder}: no step was trained")
    start = min(r["rollout_start_s"] for r in rows)
    wall = max(r["elapsed_s"] for r in rows) - start
    busy = sum(s for shape in shapes for _, _, s in shape["iterations"])
    borrowed = borrowed_seconds(events)
    available = workers * wall + borrowed
    env_s = [t[3] for shape in shapes for traj in shape["trajectories"] for t in traj["turns"]]
    return {
        "steps": len(rows),
        "step_s": wall / len(rows),
        "rollout_s_median": statistics.median(r["rollout_s"] for r in rows),
        "rollout_s": [round(r["rollout_s"], 2) for r in rows],
        "train_s_median": statistics.median(r["train_s"] for r in rows),
        "steps_wall_s": wall,
        "engine_busy_s": busy,
        "borrowed_s": borrowed,
        "idle_share": 1 - busy / available if available > 0 else float("nan"),
        "trajectories_per_min": 60 * sum(r["trajectories"] for r in rows) / wall,
        "env_s_per_turn_median": statistics.median(env_s) if env_s else 0.0,
        "staleness_max": max(r["staleness"] for r in rows),
        "reward_mean": statistics.fmean(r["reward_mean"] for r in rows),
        "roles": sorted({r["roles"] for r in rows}),
    }


def borrowed_seconds(events: list[dict]) -> float:
    """Seconds the trainer's slot served rollout (``borrow`` to ``give_back`` events; one
    still borrowed at the end counts to the last event)."""
    total, since = 0.0, None
    for e in events:
        if e.get("kind") == "borrow" and since is None:
            since = e["t"]
        elif e.get("kind") == "give_back" and since is not None:
            total, since = total + e["t"] - since, None
    if since is not None:
        total += events[-1]["t"] - since
    return total


def table(results: list[dict]) -> str:
    base = next((r for r in results if r["side"] == "sync"), results[0])
    lines = [
        "| side | s / step | vs sync | rollout s / step (median) | train s / step | "
        "idle share of rollout workers | trajectories / min | borrowed s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        gain = base["step_s"] / r["step_s"] - 1
        lines.append(
            f"| {r['side']} | {r['step_s']:.1f} | {100 * gain:+.1f}% | "
            f"{r['rollout_s_median']:.1f} | {r['train_s_median']:.1f} | "
            f"{100 * r['idle_share']:.0f}% | {r['trajectories_per_min']:.1f} | "
            f"{r['borrowed_s']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", nargs="+", choices=list(SIDES), default=list(SIDES))
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--runs", type=Path, default=Path("runs/slow_env"))
    parser.add_argument("--out", type=Path, default=Path("results/slow_env.json"))
    parser.add_argument("overrides", nargs="*", help="section.key=value for every side")
    args = parser.parse_args()
    results = []
    for side in args.sides:
        print(f"{side}: {' '.join(SIDES[side])}", flush=True)
        results.append(run_side(side, args.runs, args.overrides, args.config))
        r = results[-1]
        print(
            f"  {r['steps']} steps, {r['step_s']:.1f} s a step, rollout {r['rollout_s']}, "
            f"idle {100 * r['idle_share']:.0f}%, borrowed {r['borrowed_s']:.0f} s",
            flush=True,
        )
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"config": str(args.config), "overrides": args.overrides, "sides": results}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
