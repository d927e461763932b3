"""`pearl plan` on a Ray cluster against the local process pool: the same grid, the same plan?

    .venv/bin/python benchmarks/plan_cluster.py                  # ~10 min here
    .venv/bin/python benchmarks/plan_cluster.py rl.duration_s=600  # any plan override

Runs one grid twice in this process: first with ``processes=2`` (the local pool), then as
Ray tasks on a three-raylet cluster started here (``ray.cluster_utils.Cluster``: a head
that runs no task and two nodes of one CPU slot each, so both have two runs at a time on
this 2-core machine). Reports each wall time and whether ``plan.md`` and ``plan.json``
(without the wall time and the count of runs kept from before) are identical; writes
``results/plan_cluster.json``. The grid (``configs/plan_paper.yaml``, Qwen3-8B, two pool
sizes, the three Bamboo segments, ranking checked on one seed) is small enough to run
twice in minutes and has every kind of run: a fixed pool run once for all traces,
elastic policies per trace, and the ranking check's second seed.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = [
    "rl.duration_s=3600",
    "plan.reserved_gpus=[4,8]",
    "plan.tp=[2]",
    "plan.check_seeds=1",
    "processes=2",
]


def plan_once(folder: Path, name: str, overrides: list[str]) -> tuple[float, tuple[str, dict]]:
    from pearl.apps.plan import load_plan_config, run_plan

    cfg = load_plan_config(
        str(ROOT / "configs" / "plan_paper.yaml"),
        [*GRID, f"logger.run_dir={folder}", f"logger.run_name={name}", *overrides],
    )
    start = time.perf_counter()
    out = run_plan(cfg, log=lambda line: print(f"  [{name}] {line}", flush=True))
    wall = time.perf_counter() - start
    plan = json.loads((Path(out.run_dir) / "plan.json").read_text())
    for key in ("wall_s", "runs_kept_before"):
        plan.pop(key)
    return wall, ((Path(out.run_dir) / "plan.md").read_text(), plan)


def main() -> None:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
    import ray
    from ray.cluster_utils import Cluster

    overrides = sys.argv[1:]
    folder = Path(tempfile.mkdtemp(prefix="pearl-plan-cluster-"))
    local_s, local = plan_once(folder, "local", overrides)
    print(f"local pool (2 processes): {local_s:.0f} s", flush=True)
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        ray_s, on_ray = plan_once(
            folder, "ray", [*overrides, f"plan.ray_address={cluster.address}"]
        )
    finally:
        ray.shutdown()
        cluster.shutdown()
    same = on_ray == local
    print(f"three-raylet cluster (2 task slots): {ray_s:.0f} s; the same plan: {same}")
    out = {
        "machine": platform.platform(),
        "grid": GRID + overrides,
        "local_pool_s": local_s,
        "ray_cluster_s": ray_s,
        "same_plan": same,
        "recommendation": local[0].strip().splitlines()[-1],
    }
    path = ROOT / "results" / "plan_cluster.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
