"""The PD decision model against hindsight, per step, in the paper's regime.

    .venv/bin/python benchmarks/ratio_selection.py                         # 8 workers (16 GPUs), steps 1-6
    .venv/bin/python benchmarks/ratio_selection.py --workers 5 6 8 --steps 1 2 3
    .venv/bin/python benchmarks/ratio_selection.py model.name=Qwen3-30B-A3B
    .venv/bin/python benchmarks/ratio_selection.py --run-dir runs/<headline run>   # into that run folder

For each step i: batch i-1 runs colocated and the runtime tracker refits the decision
model from it (as online); the PD Decision Engine predicts colocation and every P:D split
for N workers; batch i is replayed on every candidate with the same seeds. Prints the
predicted and simulated makespan of each candidate, the engine's choice, the hindsight
best and the gap, and writes ``ratio_selection.json``. Uses the workload, engine and cost
profile of an rl config (default configs/headline_paper.yaml; with ``--run-dir``, the
config.yaml of that run folder, and the JSON goes there too). No parameter is tuned to
what this prints.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from statistics import median

from pearl.apps.paper.ratio_selection import model_accuracy, select_and_replay
from pearl.apps.sim_build import build_cost_model, engine_config
from pearl.config.simulate import load_simulate_config
from pearl.control.decision import DecisionConfig
from pearl.workloads.profiles import get_profile

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "headline_paper.yaml"))
    parser.add_argument("--workers", type=int, nargs="+", default=[8])
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--out", default="results/ratio_selection.json")
    parser.add_argument(
        "--run-dir", help="a headline run folder: replay its config.yaml, write the JSON there"
    )
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args()
    if args.run_dir:
        run_dir = Path(args.run_dir)
        if not (run_dir / "config.yaml").is_file():
            parser.error(f"--run-dir {run_dir}: no config.yaml there (not a run folder?)")
        args.config, args.out = str(run_dir / "config.yaml"), str(run_dir / "ratio_selection.json")
    cfg = load_simulate_config(args.config, args.overrides)
    cost = build_cost_model(cfg)
    profile = get_profile(cfg.workload.profile)
    engine = engine_config(cfg.sim)
    decision = DecisionConfig(
        mode_switch_threshold=cfg.pd.mode_switch_threshold,
        ratio_change_threshold=cfg.pd.ratio_change_threshold,
    )
    start = time.perf_counter()
    print(f"{cost.model.name} TP{cost.tp} {cost.gpu.name}, {profile.name}, {cfg.sim.scheduling}")
    results = []
    for n in args.workers:
        for step in args.steps:
            sel = select_and_replay(
                cost, profile, engine, n, step, cfg.workload.seed, decision, log=print
            )
            results.append(sel)
            print(
                f"{n} workers, step {step}: chose {sel.chosen} "
                f"({sel.chosen_outcome.simulated_s:.1f} s), best {sel.best.label} "
                f"({sel.best.simulated_s:.1f} s), gap {100 * sel.gap:+.1f}%"
            )
    gaps = [s.gap for s in results]
    best_disagg = [s for s in results if not s.best.label.endswith("C")]
    picked = sum(1 for s in best_disagg if not s.chosen.endswith("C"))
    print()
    print("| workers | step | chosen | best (hindsight) | gap |")
    print("|---:|---:|---|---|---:|")
    for s in results:
        print(f"| {s.workers} | {s.step} | {s.chosen} | {s.best.label} | {100 * s.gap:+.1f}% |")
    accuracy = model_accuracy(results)
    paper = model_accuracy(results, paper=True)
    print("\npredicted / replayed makespan over every candidate (target: median 0.85-1.15 both)")
    print(
        "| model | colocated median (range) | disaggregated median (range) | pairs ordered as replayed |"
    )
    print("|---|---|---|---:|")
    for name, a in (
        ("PEARL's (pearl.control.makespan)", accuracy),
        ("the paper's Eqs. 1-3", paper),
    ):
        print(
            f"| {name} | {a['median_ratio_colocated']:.2f} ({a['min_ratio_colocated']:.2f}-"
            f"{a['max_ratio_colocated']:.2f}) | {a['median_ratio_disaggregated']:.2f} "
            f"({a['min_ratio_disaggregated']:.2f}-{a['max_ratio_disaggregated']:.2f}) | "
            f"{100 * a['pairs_ordered_as_replayed']:.0f}% |"
        )
    print(
        f"median gap {100 * median(gaps):+.2f}%; hindsight-best disaggregated in "
        f"{len(best_disagg)} of {len(results)} steps, engine chose disaggregation in {picked} "
        f"of those; {time.perf_counter() - start:.0f} s"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "config": Path(args.config).name,
                "overrides": args.overrides,
                "median_gap": median(gaps),
                "model_accuracy": accuracy,
                "paper_model_accuracy": paper,
                "steps": [s.to_dict() for s in results],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
