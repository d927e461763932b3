"""`pearl train` on a three-node Ray cluster on this machine, losing a rollout node mid-run.

    .venv/bin/python benchmarks/node_loss.py                       # 5 runs of the default job
    .venv/bin/python benchmarks/node_loss.py --runs 2 run.steps=4  # overrides go to pearl train

Each run builds a real multi-node cluster (``ray.cluster_utils.Cluster``: a head with 2 CPU
slots for the trainer, two rollout nodes with 2 slots and a ``rollout`` resource each), runs
``pearl train`` joined to it (the default job, two rollout workers spread over the rollout
nodes), and once a random number of steps is trained removes the node of a random rollout
worker without notice. Reports per run the step of the loss, the failures and where the
replacement ran, and the trajectories lost or duplicated (every step must train on exactly
tasks x group trajectories); writes ``results/node_loss.json`` (with each run's failure,
restart and placement events) and keeps the run folders, without checkpoints, in
``results/node_loss/``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # the test cluster on loopback


def three_nodes():
    """(cluster, [two rollout nodes]); this process is not connected to it."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False}
    )
    nodes = [cluster.add_node(num_cpus=2, resources={"rollout": 2}) for _ in range(2)]
    cluster.wait_for_nodes()
    return cluster, nodes


def events(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]


def run_losing_a_node(
    cluster, nodes, folder: Path, overrides: list[str], lose_at: int, rng: random.Random
) -> dict[str, Any]:
    """``pearl train`` joined to ``cluster`` (run folder ``folder``); the node of a random
    rollout worker is removed once ``lose_at`` steps are trained. The run's output, with
    ``lost`` = {node_id, after_steps} (empty if the run ended first)."""
    from pearl.apps.train.run import TrainRun
    from pearl.config.train import load_train_config

    lost: dict[str, Any] = {}

    def lose_a_node() -> None:
        metrics = folder / "metrics.jsonl"
        while not lost:
            done = len(metrics.read_text().splitlines()) if metrics.exists() else 0
            if done >= lose_at:
                placed = [e for e in events(folder) if e.get("actor") == "rollout"]
                victim = rng.choice(placed)["node_id"]
                node = next(n for n in nodes if n.node_id == victim)
                lost.update(node_id=victim, after_steps=done)
                cluster.remove_node(node, allow_graceful=False)
            time.sleep(0.05)

    all_overrides = [
        f"cluster.ray_address={cluster.address}",
        "cluster.worker_resources={rollout: 1}",
        "cluster.spread_workers=true",
        "rollout.workers=2",
        f"run.run_dir={folder.parent}",
        f"run.run_name={folder.name}",
        *overrides,
    ]
    killer = threading.Thread(target=lose_a_node, daemon=True)
    killer.start()
    out = TrainRun(load_train_config(None, all_overrides), log=lambda _: None).run()
    if not lost:
        lost["never"] = True  # stops the thread
    killer.join(timeout=5)
    out["lost"] = {k: v for k, v in lost.items() if k != "never"}
    return out


def audit(folder: Path, expected_per_step: int, lost_node: str | None) -> dict[str, Any]:
    """Trajectories lost or duplicated per step, the failures, and where replacements ran."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    evs = events(folder)
    failures = [e for e in evs if e.get("kind") == "failure"]
    placed = [e for e in evs if e.get("kind") == "placed" and e["actor"] == "rollout"]
    after = [e["node_id"] for e in placed if failures and e["t"] > failures[0]["t"]]
    return {
        "steps": len(rows),
        "lost": sum(max(0, expected_per_step - r["trajectories"]) for r in rows),
        "duplicated": sum(max(0, r["trajectories"] - expected_per_step) for r in rows),
        "failures": len(failures),
        "replacements_on_lost_node": sum(n == lost_node for n in after),
        "replacements": len(after),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/node_loss.json")
    parser.add_argument("overrides", nargs="*", help="pearl train overrides (section.key=value)")
    args = parser.parse_args()
    import ray

    from pearl.config.train import load_train_config

    cfg = load_train_config(None, args.overrides)
    per_step = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    rng = random.Random(args.seed)
    results = []
    print(
        "| run | node lost after step | steps | failures | replacements | lost | duplicated | s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    runs_dir = Path(args.out).with_suffix("")  # each run's folder, checkpoints removed
    shutil.rmtree(runs_dir, ignore_errors=True)
    for i in range(args.runs):
        lose_at = rng.randint(1, max(1, cfg.run.steps - 1))
        cluster, nodes = three_nodes()
        t0 = time.monotonic()
        try:
            folder = runs_dir / f"run{i}"
            out = run_losing_a_node(cluster, nodes, folder, args.overrides, lose_at, rng)
            row: dict[str, Any] = {"run": i, "lose_at": lose_at, "seconds": time.monotonic() - t0}
            row |= audit(folder, per_step, out["lost"].get("node_id"))
            row["after_steps"] = out["lost"].get("after_steps")
            kinds = ("failure", "restart", "expansion_failed", "admit", "placed")
            row["events"] = [
                {k: v for k, v in e.items() if k not in ("fit", "params")}
                for e in events(folder)
                if e.get("kind") in kinds
            ]
        finally:
            ray.shutdown()
            cluster.shutdown()
            shutil.rmtree(folder / "checkpoints", ignore_errors=True)  # 1.6 GB each
        results.append(row)
        print(
            f"| {i} | {row['after_steps']} | {row['steps']} | {row['failures']} | "
            f"{row['replacements']} | {row['lost']} | {row['duplicated']} | "
            f"{row['seconds']:.0f} |"
        )
    total_lost = sum(r["lost"] for r in results)
    total_dup = sum(r["duplicated"] for r in results)
    print(f"over {len(results)} runs: {total_lost} trajectories lost, {total_dup} duplicated")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"overrides": args.overrides, "runs": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
