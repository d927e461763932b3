"""Headline-experiment speed: every policy on one availability segment, wall clock.

Runs ``pearl simulate --config configs/headline.yaml`` restricted to one segment (all
seven policies, two processes, Qwen3-8B unless ``--model``) twice in the same session:

* **current** — the shipped configuration (64-token KV pages in the simulator);
* **baseline** — the same with ``sim.block_size=16`` (the engine's page size, and the
  simulator's setting before the speed work).

Reported: wall seconds of each (the whole command: process start, all runs, writing the
run folder), each run's own wall seconds, and the largest relative throughput difference
between the two (the page size must not change the results). Target (issue 4): all
policies on one segment in under 120 s on this machine. The machine is shared, so wall
times vary by 10-20% run to run.

    .venv/bin/python benchmarks/headline_speed.py                   # segment1, ~6 min
    .venv/bin/python benchmarks/headline_speed.py --skip-baseline   # current only, ~2 min
    .venv/bin/python benchmarks/headline_speed.py --segment segment2 --model Qwen3-30B-A3B
    .venv/bin/python benchmarks/headline_speed.py --config configs/headline_paper.yaml --skip-baseline
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

from pearl.apps.experiment import run_experiment
from pearl.config.simulate import load_simulate_config

TARGET_WALL_S = 120.0
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "headline.yaml"


def run(config: str, segment: str, model: str, overrides: list[str], run_dir: str) -> dict:
    cfg = load_simulate_config(
        config,
        [
            f"elastic.segments=[{segment}]",
            f"model.name={model}",
            f"logger.run_dir={run_dir}",
            *overrides,
        ],
    )
    outcome = run_experiment(cfg, log=lambda _msg: None)
    return {
        "overrides": overrides,
        "wall_s": outcome.wall_s,
        "block_size": cfg.sim.block_size,
        "runs": {
            r["policy"]: {"throughput": r["throughput"], "wall_s": r["wall_s"]}
            for r in outcome.runs
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(CONFIG), help="an rl config (headline_paper.yaml ...)")
    ap.add_argument("--segment", default="segment1")
    ap.add_argument("--model", default="Qwen3-8B")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--out", default="results/headline_speed.json")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        results = {"current": run(args.config, args.segment, args.model, [], tmp)}
        if not args.skip_baseline:
            results["baseline"] = run(
                args.config, args.segment, args.model, ["sim.block_size=16"], tmp
            )

    print(f"{Path(args.config).name}: {args.model}, {args.segment}, all policies, 2 processes")
    print(f"{'config':<10} {'block':>5} {'wall s':>8}  per-run wall s")
    for name, r in results.items():
        runs = ", ".join(f"{p} {v['wall_s']:.0f}" for p, v in r["runs"].items())
        print(f"{name:<10} {r['block_size']:>5} {r['wall_s']:>8.1f}  {runs}")
    report = {
        "machine": platform.platform(),
        "config": args.config,
        "segment": args.segment,
        "model": args.model,
        "results": results,
        "targets": {"wall_s<120": results["current"]["wall_s"] < TARGET_WALL_S},
    }
    if "baseline" in results:
        cur, base = results["current"]["runs"], results["baseline"]["runs"]
        diff = max(
            abs(cur[p]["throughput"] - base[p]["throughput"]) / base[p]["throughput"] for p in cur
        )
        report["max_relative_throughput_difference"] = diff
        report["speedup_vs_baseline"] = results["baseline"]["wall_s"] / results["current"]["wall_s"]
        print(
            f"speed-up vs baseline {report['speedup_vs_baseline']:.2f}x; largest throughput "
            f"difference {100 * diff:.3f}%"
        )
    verdict = "met" if report["targets"]["wall_s<120"] else "MISSED"
    print(f"target: all policies on one segment < {TARGET_WALL_S:.0f} s: {verdict}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
