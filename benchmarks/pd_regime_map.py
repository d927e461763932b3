"""Where disaggregation wins: heatmaps of the best P:D split's gain over colocation.

    .venv/bin/python benchmarks/pd_regime_map.py                        # Qwen3-8B, 3 maps, 4 workers
    .venv/bin/python benchmarks/pd_regime_map.py --models Qwen3-8B Qwen3-30B-A3B
    .venv/bin/python benchmarks/pd_regime_map.py --maps observation:response --workers 8

Every cell moves two knobs of the base workload (``swe_paper`` in the paper's regime,
configs/headline_paper.yaml: TP2 H800 workers, SGLang scheduling), runs batch 0 colocated
so the tracker refits, lets the PD Decision Engine pick (no hysteresis), and replays batch
1 on colocation and on every split (``pearl.apps.regime_map``). Knobs not on a map stay at
the base (``trajectories``: 8 per worker, the paper's 64 on 8 workers). Writes
``results/pd_regime_map.json`` and a heatmap per map and model (PNG + SVG) to
``--figures`` (docs/figures by default). Nothing is tuned to what this prints.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from pearl.apps.paper.ratio_selection import StepSelection
from pearl.apps.regime_map import KNOBS, Cell, evaluate_cell, heatmap
from pearl.apps.sim_build import build_cost_model, engine_config
from pearl.config.simulate import load_simulate_config
from pearl.workloads.profiles import get_profile

ROOT = Path(__file__).resolve().parents[1]

# The range of each knob: realistic values around the base (docs/workloads.md).
VALUES: dict[str, list] = {
    "observation": [0.5, 1, 3],  # x the base's observation tokens per turn
    "response": [0.25, 1, 2],  # x the base's tokens generated per turn
    "env": [0.25, 1, 4],  # x the base's environment latencies
    "trajectories": [4, 8, 16],  # per rollout worker
    "context": [8192, 16384, 32768],  # context cap (tokens)
    "reuse": ["window", "append"],  # what the prefix cache serves (module docstring)
}
DEFAULT_MAPS = ["observation:context", "response:trajectories", "env:reuse"]


def run_cell(job: tuple) -> dict:
    config, overrides, workers, values = job
    cfg = load_simulate_config(config, overrides)
    cost = build_cost_model(cfg)
    start = time.perf_counter()
    cell = evaluate_cell(
        cost, get_profile(cfg.workload.profile), engine_config(cfg.sim), workers, values
    )
    return {"model": cfg.model.name, **cell.to_dict(), "wall_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "headline_paper.yaml"))
    parser.add_argument("--models", nargs="+", default=["Qwen3-8B"])
    parser.add_argument("--maps", nargs="+", default=DEFAULT_MAPS, help="x:y knob pairs")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", default="results/pd_regime_map.json")
    parser.add_argument("--figures", default=str(ROOT / "docs" / "figures"))
    args = parser.parse_args()
    maps = []
    for m in args.maps:
        x, _, y = m.partition(":")
        if x not in KNOBS or y not in KNOBS or x == y:
            parser.error(f"--maps {m}: want two different knobs of {', '.join(KNOBS)}")
        maps.append((x, y))
    jobs, keys = [], []
    for model in args.models:
        for x, y in maps:
            for yv in VALUES[y]:
                for xv in VALUES[x]:
                    values = {"trajectories": 8, x: xv, y: yv}
                    jobs.append((args.config, [f"model.name={model}"], args.workers, values))
                    keys.append((model, x, y))
    start = time.perf_counter()
    print(f"{len(jobs)} cells, {args.workers} workers each, {args.processes} processes")
    results = []
    with ProcessPoolExecutor(args.processes) as pool:
        for key, res in zip(keys, pool.map(run_cell, jobs), strict=True):
            model, x, y = key
            results.append({"map": f"{x}:{y}", **res})
            print(
                f"{model} {x}={res['values'][x]} {y}={res['values'][y]}: best split "
                f"{res['best_split']} {100 * res['best_split_gain']:+.1f}%, engine picks "
                f"{res['chosen']} {100 * res['chosen_gain']:+.1f}% ({res['wall_s']:.0f} s)",
                flush=True,
            )
    figures = Path(args.figures)
    figures.mkdir(parents=True, exist_ok=True)
    for model in args.models:
        for x, y in maps:
            rows = [r for r in results if r["model"] == model and r["map"] == f"{x}:{y}"]
            cells = [_cell(r) for r in rows]
            heatmap(
                cells,
                x,
                y,
                f"{model}, {args.workers} TP2 H800 workers, swe_paper (SGLang): "
                "best split vs colocation; pick = the engine's choice",
                figures / f"pd_regime_{model}_{x}_{y}",
                log=print,
            )
    wins = [r for r in results if r["best_split_gain"] >= 0.10]
    print(
        f"\n{len(wins)} of {len(results)} cells where the best split beats colocation by >= 10%"
        f"; largest gain {100 * max(r['best_split_gain'] for r in results):+.1f}%; "
        f"{time.perf_counter() - start:.0f} s"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"workers": args.workers, "cells": results}, indent=1) + "\n")
    print(f"wrote {out}")


def _cell(row: dict) -> Cell:
    """A Cell rebuilt from its JSON row, enough to draw it."""
    return Cell(row["values"], StepSelection.from_dict(row["selection"]))


if __name__ == "__main__":
    main()
