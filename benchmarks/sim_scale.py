"""Simulator scale: one RL step with pearl, batch 64 -> 4,096 on 8 -> 512 TP2 workers.

    .venv/bin/python benchmarks/sim_scale.py                      # Qwen3-8B and Qwen3-30B-A3B
    .venv/bin/python benchmarks/sim_scale.py --workers 8 32 --models Qwen3-8B   # quick look
    .venv/bin/python benchmarks/sim_scale.py --workers 2048 --models Qwen3-8B --memory-durations
                                                                  # the fleet: batch 16,384

Each size is one RL step (rollout of the whole batch, training, weight sync) of the
``pearl`` policy in the paper's regime (configs/headline_paper.yaml: the swe_paper workload,
SGLang-mode engine, H800) on ``W`` dedicated TP2 rollout workers and 16 training GPUs, with
``8 W`` trajectories (tasks of 16). Every size runs in a fresh process (``pearl.processes.pool``),
so its peak memory is its own, started as ``pearl plan`` starts its runs (on transparent huge
pages where the host grants them, ``pearl.processes.huge_pages``; ``PEARL_HUGE_PAGES=0`` for
CPython's own allocator). Reported per size: wall seconds, simulated engine
iterations (and how many were fast-forwarded), events per wall second (iterations plus
turns), generated tokens, peak resident memory, and that peak less the process's memory
before the run divided by the batch (memory per trajectory in flight); then the growth
exponent of wall time and of memory in the batch size (least squares on log-log), and the
decision engine's latency for 1,024 workers (median of 20 calls, prior parameters).
Each size also reports its result's digest (``result_digest``: the step's rows and counters,
wall-clock fields left out), so a speed-up can show it changed nothing: the same size gives
the same digest before and after.
Then the headline paper-regime run (4 reserved + up to 12 preemptible GPUs on segment2, or a
constant number with ``--memory-available``)
for ~5 and ~40 steps (``--memory-durations``), each in a fresh process: peak memory after
40 steps against after 5, for ``pearl`` (whose active set follows the trace, so a longer
run also meets larger moments: more workers, more trajectories in flight) and for ``roll``
(a fixed pool: every step holds the same, so any growth is what steps leave behind).
Targets (issues 23 and 36): 512 workers x batch 4,096 in < 120 s and < 4 GB peak; 2,048
workers x batch 16,384 in < 16 GB; memory after 40 steps within 10% of after 5. Writes
``results/sim_scale.json``.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import math
import platform
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from pearl.processes.env import simulation_env
from pearl.processes.pool import run_in_processes

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "headline_paper.yaml"
GROUP = 16
TRAINING_GPUS = 16
TP = 2


def result_digest(result: dict) -> str:
    """The first 16 hex digits of the SHA-256 of a run's rows and counters, every field
    whose name holds ``wall`` left out (they time the host, not the simulated world)."""

    def simulated(x):
        if isinstance(x, dict):
            return {k: simulated(v) for k, v in x.items() if "wall" not in k}
        if isinstance(x, list):
            return [simulated(v) for v in x]
        return x

    kept = simulated({"rows": result["rows"], "counters": result["counters"]})
    blob = json.dumps(kept, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def one_step(model: str, workers: int, trace: str) -> dict:
    """One pearl RL step of ``8 * workers`` trajectories on ``workers`` TP2 workers."""
    from pearl.apps.experiment import run_one
    from pearl.config.simulate import load_simulate_config

    batch = 8 * workers
    cfg = load_simulate_config(
        CONFIG,
        [
            f"model.name={model}",
            f"cluster.tp={TP}",
            f"cluster.reserved_gpus={TP * workers}",
            "cluster.max_preemptible_gpus=0",
            f"cluster.training_gpus={TRAINING_GPUS}",
            f"workload.num_tasks={batch // GROUP}",
            f"workload.group_size={GROUP}",
            "rl.duration_s=1",  # one batch starts; it rolls out, trains and syncs
        ],
    )
    before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    r = run_one(cfg.model_dump(mode="json"), "pearl", trace)
    wall = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows = r["rows"]
    c = r["counters"]
    return {
        "model": model,
        "workers": workers,
        "batch": batch,
        "steps": len(rows),
        "wall_s": wall,
        "iterations": c["sim_iterations"],
        "fast_forwarded_iterations": c["sim_fast_forwarded_iterations"],
        "turns": c["sim_turns"],
        "generated_tokens": sum(row["performance/rollout_tokens"] for row in rows),
        "peak_mb": peak_mb,
        "before_mb": before_mb,
        "mb_per_trajectory": (peak_mb - before_mb) / batch,
        "digest": result_digest(r),
    }


def many_steps(policy: str, duration_s: float, trace: str = "segment2") -> dict:
    """``rl.duration_s`` of the paper-regime headline run of ``policy`` on ``trace`` (a
    segment name or an availability CSV): steps run and the process's peak memory (a
    finished step keeps only its counts)."""
    from pearl.apps.experiment import run_one
    from pearl.config.simulate import load_simulate_config

    cfg = load_simulate_config(CONFIG, [f"rl.duration_s={duration_s}"])
    start = time.perf_counter()
    r = run_one(cfg.model_dump(mode="json"), policy, trace)
    return {
        "policy": policy,
        "trace": Path(trace).name,
        "duration_s": duration_s,
        "steps": r["steps_run"],
        "wall_s": time.perf_counter() - start,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def decision_latency_ms(model: str, workers: int = 1024, repeat: int = 20) -> float:
    """Median seconds of one ``decide`` call for ``workers`` workers (prior parameters)."""
    from pearl.apps.sim_build import build_setting
    from pearl.config.simulate import load_simulate_config
    from pearl.control.decision import DecisionConfig, decide
    from pearl.sim.world import prior_params

    setting = build_setting(load_simulate_config(CONFIG, [f"model.name={model}"]))
    cost = setting.cost
    params = prior_params(
        cost, setting.profile, setting.engine, cost.tp * cost.gpu.network_bandwidth_Bps
    )
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        decide(params, workers, None, DecisionConfig())
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) on log(x): y ~ x^slope."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / den if den else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["Qwen3-8B", "Qwen3-30B-A3B"])
    parser.add_argument(
        "--workers", type=int, nargs="*", default=[8, 32, 128, 512], help="sizes; none to skip"
    )
    parser.add_argument(
        "--memory-durations",
        type=float,
        nargs="*",
        default=[4000.0, 30000.0],
        help="also run the headline run (segment2) this long each (~5 and ~40 steps of "
        "pearl) and compare peak memory; none to skip",
    )
    parser.add_argument(
        "--memory-policies",
        nargs="+",
        default=["pearl", "roll"],
        help="the policies of the memory-over-steps runs",
    )
    parser.add_argument(
        "--memory-available",
        type=int,
        default=None,
        metavar="GPUS",
        help="run the memory-over-steps runs at this constant number of preemptible GPUs "
        "instead of segment2 (every step then meets the same pool)",
    )
    parser.add_argument("--out", default=str(ROOT / "results" / "sim_scale.json"))
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="pearl-sim-scale-"))
    atexit.register(shutil.rmtree, folder, True)  # the traces written below
    trace = folder / "reserved_only.csv"  # no preemptible GPUs: the pool is the reserved one
    trace.write_text("time_s,available\n0,0\n")
    memory_trace = "segment2"
    if args.memory_available is not None:
        memory_trace = str(folder / f"constant_{args.memory_available}.csv")
        Path(memory_trace).write_text(f"time_s,available\n0,{args.memory_available}\n")
    jobs = [((m, w), (m, w, str(trace))) for m in args.models for w in args.workers]
    rows: list[dict] = []
    lost: dict = {}

    def done(key, row: dict) -> None:
        rows.append(row)
        print(
            f"{row['model']:>14} {row['workers']:4d} workers  batch {row['batch']:5d}  "
            f"{row['wall_s']:7.1f} s  {row['iterations']:9d} iterations "
            f"({row['fast_forwarded_iterations']} fast-forwarded)  "
            f"{(row['iterations'] + row['turns']) / row['wall_s']:8.0f} events/s  "
            f"peak {row['peak_mb']:6.0f} MB  {1024 * row['mb_per_trajectory']:6.0f} KB/trajectory  "
            f"digest {row['digest']}",
            flush=True,
        )

    env = simulation_env()  # as `pearl plan` and `pearl simulate` start their runs
    print(f"run processes' environment: {env or 'unchanged'}", flush=True)
    run_in_processes(
        one_step, jobs, 1, done, lambda key, why: lost.__setitem__(str(key), why), env=env
    )
    growth = {}
    for model in args.models:
        mine = sorted((r for r in rows if r["model"] == model), key=lambda r: r["batch"])
        if len(mine) >= 2:
            batches = [r["batch"] for r in mine]
            growth[model] = {
                "wall_exponent": exponent(batches, [r["wall_s"] for r in mine]),
                "memory_exponent": exponent(
                    batches, [max(1e-3, r["peak_mb"] - r["before_mb"]) for r in mine]
                ),
            }
            print(
                f"{model}: wall ~ batch^{growth[model]['wall_exponent']:.2f}, memory above "
                f"the process's start ~ batch^{growth[model]['memory_exponent']:.2f}"
            )
    memory: list[dict] = []

    def ran(key, row: dict) -> None:
        memory.append(row)
        print(
            f"headline {row['policy']} run of {row['duration_s']:.0f} s on {row['trace']}: "
            f"{row['steps']} steps, "
            f"{row['wall_s']:.0f} s wall, peak {row['peak_mb']:.0f} MB",
            flush=True,
        )

    run_in_processes(
        many_steps,
        [
            ((p, d), (p, d, memory_trace))
            for p in args.memory_policies
            for d in args.memory_durations
        ],
        1,
        ran,
        lambda key, why: lost.__setitem__(f"{key[0]} {key[1]} s", why),
        env=env,
    )
    for policy in args.memory_policies:
        mine = sorted((r for r in memory if r["policy"] == policy), key=lambda r: r["steps"])
        if len(mine) >= 2:
            first, last = mine[0], mine[-1]
            print(
                f"{policy}: peak memory after {last['steps']} steps / after {first['steps']} "
                f"steps: {last['peak_mb'] / first['peak_mb']:.3f}"
            )
    latency = {m: decision_latency_ms(m) for m in args.models}
    for m, ms in latency.items():
        print(f"{m}: decision engine for 1,024 workers: {ms:.1f} ms (median of 20)")
    for key, why in lost.items():
        print(f"LOST {key}: {why}")
    out = {
        "machine": platform.platform(),
        "process_env": env,
        "rows": rows,
        "growth": growth,
        "decision_latency_ms_1024_workers": latency,
        "memory_over_steps": memory,
        "lost": lost,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
