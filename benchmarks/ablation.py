"""The paper's ablation ladder (Fig 7) in the simulator, against the paper's numbers.

    .venv/bin/python benchmarks/ablation.py                              # Qwen3-8B, 4/8/16 GPUs
    .venv/bin/python benchmarks/ablation.py model.name=Qwen3-30B-A3B
    .venv/bin/python benchmarks/ablation.py --pools 4 8 --rungs roll A pearl rl.duration_s=3600

On fixed pools of dedicated rollout GPUs (16 training GPUs beside them), each rung of
``pearl.apps.paper.ablation.RUNGS`` runs ``rl.duration_s`` of the config (default
configs/headline_paper.yaml) and is compared with ROLL on the same pool in the same run:
A = forced disaggregation (the engine's best P:D split), B = A + ungated borrowing,
C = A + the benefit gate, pearl = adaptive PD + the gate. Prints throughput, the change
against ROLL next to the paper's Fig 7, the roles each rung ran with and where the rollout
workers' time went, and writes ``results/ablation_<model>.json``. Fig 7 chose nothing in
the simulator.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pearl.apps.paper.ablation import PAPER_FIG7_PCT, RUNGS, relative_to_roll, run_ladder
from pearl.config.simulate import load_simulate_config
from pearl.report.tables import time_table, topology_at

ROOT = Path(__file__).resolve().parents[1]


def paper_value(model: str, gpus: int, rung: str) -> str:
    key = "4" if gpus == 4 else "8-16" if 8 <= gpus <= 16 else None
    value = PAPER_FIG7_PCT.get(model, {}).get(key, {}).get(rung) if key else None
    if value is None:
        return "-"
    if isinstance(value, list):
        return f"{value[0]:+.1f} .. {value[1]:+.1f}%"
    return f"{value:+.1f}%"


def roles_used(run: dict) -> str:
    """Distinct role layouts at the start of the run's steps (``2C``, ``1P1D +8Co`` ...)."""
    labels: list[str] = []
    for row in run["rows"]:
        label = topology_at(run["timeline"], row["rollout_started_s"])
        if label not in labels:
            labels.append(label)
    return ", ".join(labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "headline_paper.yaml"))
    parser.add_argument("--pools", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--rungs", nargs="+", default=list(RUNGS), choices=list(RUNGS))
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", default=None, help="default results/ablation_<model>.json")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args()
    if "roll" not in args.rungs:
        parser.error("--rungs must include roll (the baseline every rung is compared with)")
    cfg = load_simulate_config(args.config, args.overrides)
    model = cfg.model.name
    start = time.perf_counter()
    print(
        f"{model}, {cfg.workload.profile}, {cfg.sim.scheduling} scheduling, "
        f"{cfg.cluster.training_gpus} training GPUs, {cfg.rl.duration_s:.0f} s per run"
    )
    runs = run_ladder(cfg, args.pools, args.rungs, args.processes)
    rel = relative_to_roll(runs)
    print()
    print("| pool | rung | tok/s | steps | vs ROLL | paper (Fig 7) | roles at step starts |")
    print("|---|---|---:|---:|---:|---:|---|")
    rows = []
    for r in runs:
        gpus = int(r["segment"].split()[0])
        vs = rel.get(r["segment"], {}).get(r["policy"])
        print(
            f"| {r['segment']} | {r['policy']} | {r['throughput']:.0f} | {r['steps']} | "
            f"{'-' if vs is None else f'{vs:+.1f}%'} | {paper_value(model, gpus, r['policy'])} | "
            f"{roles_used(r)} |"
        )
        rows.append(
            {
                "pool_gpus": gpus,
                "rung": r["policy"],
                "throughput": r["throughput"],
                "steps": r["steps"],
                "vs_roll_pct": vs,
                "paper_vs_roll": paper_value(model, gpus, r["policy"]),
                "roles": roles_used(r),
                "wall_s": r["wall_s"],
            }
        )
    print()
    print(time_table(runs))
    wall = time.perf_counter() - start
    print(f"\n{len(runs)} runs in {wall:.0f} s wall ({args.processes} processes)")
    out = Path(args.out or f"results/ablation_{model}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "config": Path(args.config).name,
                "overrides": args.overrides,
                "model": model,
                "duration_s": cfg.rl.duration_s,
                "rows": rows,
                "time_table": time_table(runs),
                "wall_s": wall,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
