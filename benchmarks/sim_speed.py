"""Simulator speed: one rollout batch in virtual time, fast-forward on vs off (the baseline).

Workload: the default SWE profile (4 tasks x 16 = 64 trajectories, 32K max context),
seed 0. Cluster: 8 TP2 H800 workers (16 GPUs). Models: Qwen3-30B-A3B and Qwen3-8B.
Deployments: colocated (8C) and one disaggregated split (5P3D). Each runs with the
worker's decode fast-forward on and off; off (every iteration its own timer) is the
baseline the speed-up is measured against.

Reported per run: wall seconds, simulated makespan, engine iterations (and how many
were fast-forwarded), timer events (virtual-clock jumps), iterations and timer events
per wall second, the fast-forward speed-up (wall off / wall on), and whether the two
makespans agree to 1e-9 relative (fast-forward must not change the result).
Target: one batch in under 5 s of wall time with fast-forward.

Wall times are the minimum over ``--repeat`` runs (the machines here are shared and
noisy); ``--no-gc`` disables Python's cyclic GC during each run, to measure how much of
the wall time GC passes over the simulator's large token lists take.

    .venv/bin/python benchmarks/sim_speed.py                 # both models (~2-3 min)
    .venv/bin/python benchmarks/sim_speed.py --quick         # Qwen3-30B-A3B only
    .venv/bin/python benchmarks/sim_speed.py --profile 5P3D  # + cProfile of one ff-on run
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import platform
import pstats
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from pearl.control.deployment import Deployment
from pearl.sim.costmodel import CostModel
from pearl.sim.fixed import FixedRolloutReport, simulate_fixed_rollout
from pearl.sim.hardware import get_gpu
from pearl.sim.shapes import load_model_shape
from pearl.sim.worker import SimEngineConfig
from pearl.workloads.agentic import generate_batch
from pearl.workloads.batch import RolloutBatch
from pearl.workloads.profiles import get_profile

GPU = "H800"
TP = 2
MODELS = ("Qwen3-30B-A3B", "Qwen3-8B")
DEPLOYMENTS = ("8C", "5P3D")
TARGET_WALL_S = 5.0
MAKESPAN_RTOL = 1e-9


@dataclass(slots=True)
class SpeedRow:
    """One (model, deployment, fast_forward) measurement."""

    model: str
    deployment: str
    fast_forward: bool
    wall_s: float
    wall_s_all: list[float]
    makespan_s: float
    iterations: int
    fast_forwarded_iterations: int
    timer_events: int
    iterations_per_wall_s: float
    timer_events_per_wall_s: float
    generated_tokens: int
    turns: int


def run_once(
    batch: RolloutBatch, cost: CostModel, deployment: str, fast_forward: bool, no_gc: bool
) -> FixedRolloutReport:
    """Simulate ``batch`` once; with ``no_gc`` the cyclic GC is off for the run only."""
    gc.collect()  # start every run from the same heap state
    if no_gc:
        gc.disable()
    try:
        return simulate_fixed_rollout(
            batch,
            cost,
            Deployment.parse(deployment),
            SimEngineConfig(fast_forward=fast_forward),
            vocab_size=cost.model.vocab_size,
        )
    finally:
        gc.enable()


def measure(
    batch: RolloutBatch,
    cost: CostModel,
    deployment: str,
    fast_forward: bool,
    repeat: int,
    no_gc: bool,
) -> SpeedRow:
    """Run ``repeat`` times; report the fastest wall time (the simulation is deterministic)."""
    reports = [run_once(batch, cost, deployment, fast_forward, no_gc) for _ in range(repeat)]
    makespans = {r.makespan_s for r in reports}
    if len(makespans) != 1:
        raise AssertionError(f"non-deterministic makespan across repeats: {sorted(makespans)}")
    best = min(reports, key=lambda r: r.wall_s)
    return SpeedRow(
        model=cost.model.name,
        deployment=deployment,
        fast_forward=fast_forward,
        wall_s=best.wall_s,
        wall_s_all=[r.wall_s for r in reports],
        makespan_s=best.makespan_s,
        iterations=best.iterations,
        fast_forwarded_iterations=best.fast_forwarded_iterations,
        timer_events=best.timer_events,
        iterations_per_wall_s=best.iterations / best.wall_s,
        timer_events_per_wall_s=best.timer_events / best.wall_s,
        generated_tokens=best.generated_tokens,
        turns=best.turns,
    )


def profile_run(
    batch: RolloutBatch, cost: CostModel, deployment: str, top: int = 20
) -> dict[str, object]:
    """cProfile one fast-forward run; return the top functions by own (tottime) and cumulative time."""
    profiler = cProfile.Profile()
    profiler.enable()
    report = run_once(batch, cost, deployment, fast_forward=True, no_gc=False)
    profiler.disable()
    out: dict[str, object] = {"deployment": deployment, "model": cost.model.name}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats(key).print_stats(top)
        out[key] = buf.getvalue()
    out["profiled_wall_s"] = report.wall_s
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="Qwen3-30B-A3B only")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell; min wall is kept")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--no-gc", action="store_true", help="disable cyclic GC during runs")
    parser.add_argument(
        "--profile", metavar="DEPLOYMENT", help="also cProfile one ff-on run of this deployment"
    )
    parser.add_argument("--out", default="results/sim_speed.json")
    args = parser.parse_args(argv)

    models = MODELS[:1] if args.quick else MODELS
    batch = generate_batch(get_profile("swe"), seed=args.seed)
    rows: list[SpeedRow] = []
    for model in models:
        cost = CostModel(get_gpu(GPU), load_model_shape(model), tp=TP)
        for deployment in DEPLOYMENTS:
            for ff in (True, False):
                row = measure(batch, cost, deployment, ff, args.repeat, args.no_gc)
                rows.append(row)
                print(
                    f"  {model:>14} {deployment:>5} ff={'on ' if ff else 'off'} "
                    f"wall {row.wall_s:6.2f} s  makespan {row.makespan_s:8.2f} s",
                    file=sys.stderr,
                )

    # Pair every ff-on row with its ff-off baseline.
    comparisons = []
    for on in (r for r in rows if r.fast_forward):
        off = next(
            r
            for r in rows
            if not r.fast_forward and (r.model, r.deployment) == (on.model, on.deployment)
        )
        rel = abs(on.makespan_s - off.makespan_s) / max(abs(off.makespan_s), 1e-12)
        comparisons.append(
            {
                "model": on.model,
                "deployment": on.deployment,
                "speedup": off.wall_s / on.wall_s,
                "timer_event_reduction": off.timer_events / max(on.timer_events, 1),
                "makespan_rel_diff": rel,
                "makespans_agree": rel <= MAKESPAN_RTOL,
                "same_iterations": on.iterations == off.iterations,
                "same_generated_tokens": on.generated_tokens == off.generated_tokens,
                "under_target": on.wall_s < TARGET_WALL_S,
            }
        )

    header = (
        f"{'model':<14} {'deploy':>6} {'ff':>3} {'wall s':>7} {'makespan s':>11} "
        f"{'iters':>7} {'ff iters':>8} {'timers':>7} {'iters/s':>8} {'timers/s':>9} "
        f"{'speed-up':>8} {'makespan =':>11} {'<5 s':>5}"
    )
    print(
        f"sim_speed: SWE batch of {batch.num_trajectories} trajectories "
        f"({sum(t.num_turns for t in batch.trajectories)} turns, {batch.generated_tokens} "
        f"generated tokens), 8 x TP{TP} {GPU}, seed {args.seed}, repeat {args.repeat}"
        f"{', GC off' if args.no_gc else ''}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        cmp = next(
            c for c in comparisons if (c["model"], c["deployment"]) == (row.model, row.deployment)
        )
        extra = (
            f"{cmp['speedup']:>7.2f}x {cmp['makespan_rel_diff']:>11.1e} "
            f"{'yes' if cmp['under_target'] else 'NO':>5}"
            if row.fast_forward
            else f"{'(base)':>8} {'':>11} {'':>5}"
        )
        print(
            f"{row.model:<14} {row.deployment:>6} {'on' if row.fast_forward else 'off':>3} "
            f"{row.wall_s:>7.2f} {row.makespan_s:>11.3f} {row.iterations:>7} "
            f"{row.fast_forwarded_iterations:>8} {row.timer_events:>7} "
            f"{row.iterations_per_wall_s:>8.0f} {row.timer_events_per_wall_s:>9.0f} {extra}"
        )
    all_agree = all(c["makespans_agree"] and c["same_iterations"] for c in comparisons)
    print(
        f"fast-forward vs stepping: makespans agree to {MAKESPAN_RTOL:g} relative and "
        f"iteration counts match: {'YES' if all_agree else 'NO'}"
    )

    result: dict[str, object] = {
        "benchmark": "sim_speed",
        "workload": {
            "profile": "swe",
            "seed": args.seed,
            "trajectories": batch.num_trajectories,
            "turns": sum(t.num_turns for t in batch.trajectories),
            "generated_tokens": batch.generated_tokens,
        },
        "cluster": {"gpu": GPU, "tp": TP, "workers": 8},
        "repeat": args.repeat,
        "gc_disabled": args.no_gc,
        "target_wall_s": TARGET_WALL_S,
        "rows": [asdict(r) for r in rows],
        "comparisons": comparisons,
        "all_makespans_agree": all_agree,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    if args.profile:
        prof = profile_run(
            batch, CostModel(get_gpu(GPU), load_model_shape(models[0]), tp=TP), args.profile
        )
        result["profile"] = prof
        print(f"\ncProfile of {models[0]} {args.profile} ff=on (top by own time):")
        print(prof["tottime"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if all_agree else 1


if __name__ == "__main__":
    sys.exit(main())
