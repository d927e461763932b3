"""Simulator sanity: what the cost model and simulator predict, next to the paper's numbers (docs/paper.md).

Nothing here is tuned to the paper; the point is to see where the untuned model lands.

(a) Decode rate. Qwen3-30B-A3B tokens/s per GPU of a decode-only iteration on one TP2
    H800 worker, per-GPU batch 4..64 (worker batch 8..128), every sequence at an
    SWE-like context of 8K / 14K / 20K tokens, from ``CostModel.decode_time``. SPEC
    ("The problem", point 3): ~400 tok/s/GPU between prefill insertions. Batch 64 on
    8 workers is 4 sequences per GPU, the paper's operating point.
(a') The same, measured inside a simulated colocated rollout (8C, SWE batch 64, every
    iteration stepped): decode tokens/s/GPU over decode-only iterations, and the share
    of computed tokens that are prefill vs the share of busy time in iterations that
    hold a prefill chunk. SPEC: prefill did 96.68% of tokens in 26.48% of the time.
(b) Mode crossover. Qwen3-30B-A3B on 16 H800 as 8 TP2 workers, SWE workload (group
    16, num_tasks = batch / 16, the same seed, so a bigger batch extends a smaller
    one), batch 32/48/64/80/96; colocated (8C) vs every P:D split. Per batch: the
    makespan of each deployment, the best split, and the best split's gain over
    colocation, ``T_8C / T_best - 1`` (throughput gain at equal tokens). SPEC
    (point 4): +9.7% at 32, +1.4% at 80, -6.1% at 96; best 4P4D at 48, 5P3D at 64.
    Also per batch: the environment floor (the largest environment time of any one
    trajectory: setup + tool latencies + reward; no deployment can beat it) and, as a
    second row, the mean trajectory completion time per deployment.

    .venv/bin/python benchmarks/sim_sanity.py           # full sweep (~5-10 min, 2 cores)
    .venv/bin/python benchmarks/sim_sanity.py --quick   # batches 32, 64; five deployments

A deployment whose simulation raises is shown as FAILED with its error (exit status 1).
``--env-time-factor`` scales every environment time of the workload: a diagnostic of
how much of the makespan the environment accounts for, not a calibration.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl.control.deployment import Deployment
from pearl.errors import PearlError
from pearl.sim.costmodel import CostModel
from pearl.sim.fixed import deployments_for, simulate_fixed_rollout
from pearl.sim.hardware import get_gpu
from pearl.sim.shapes import load_model_shape
from pearl.sim.worker import SimEngineConfig
from pearl.workloads.agentic import generate_batch
from pearl.workloads.batch import RolloutBatch
from pearl.workloads.profiles import get_profile, scaled

GPU = "H800"
MODEL = "Qwen3-30B-A3B"
TP = 2
WORKERS = 8
GROUP_SIZE = 16
BATCHES = (32, 48, 64, 80, 96)
QUICK_BATCHES = (32, 64)
QUICK_DEPLOYMENTS = ("8C", "2P6D", "3P5D", "4P4D", "5P3D")
PER_GPU_BATCHES = (4, 8, 16, 32, 64)
CONTEXTS = (8_192, 14_336, 20_480)

# docs/paper.md "The problem" 3 and 4 (docs/paper.md).
SPEC_DECODE_TOK_S_PER_GPU = 400.0
SPEC_PREFILL_TOKEN_SHARE_PCT = 96.68
SPEC_PREFILL_TIME_SHARE_PCT = 26.48
SPEC_GAIN_PCT = {32: 9.7, 80: 1.4, 96: -6.1}
SPEC_BEST = {48: "4P4D", 64: "5P3D"}


def make_cost(model: str = MODEL) -> CostModel:
    return CostModel(get_gpu(GPU), load_model_shape(model), tp=TP)


# -- (a) decode rate from the cost model ---------------------------------------------------
def decode_rates(cost: CostModel) -> list[dict[str, Any]]:
    """Decode-only tokens/s per GPU for each per-GPU batch and context length."""
    capacity = cost.kv_capacity_tokens()
    rows = []
    for per_gpu in PER_GPU_BATCHES:
        worker_batch = per_gpu * cost.tp
        for context in CONTEXTS:
            parts = cost.iteration_cost([], [context] * worker_batch)
            seconds = cost.decode_time(worker_batch, worker_batch * context)
            rows.append(
                {
                    "per_gpu_batch": per_gpu,
                    "worker_batch": worker_batch,
                    "context": context,
                    "iteration_ms": 1e3 * seconds,
                    "tok_s_per_gpu": worker_batch / seconds / cost.tp,
                    "linear_ms": 1e3 * parts.linear_s,
                    "decode_attention_ms": 1e3 * parts.decode_attention_s,
                    # A decode batch whose KV exceeds one worker's cache cannot run as stated.
                    "fits_kv": worker_batch * context <= capacity,
                }
            )
    return rows


# -- (a') the same inside a simulated rollout ----------------------------------------------
@dataclass
class RecordingCost:
    """A cost model that tallies prefill vs decode work of every stepped iteration.

    Only valid with fast-forward off: a fast-forwarded stretch asks ``decode_times`` for
    more steps than it may apply, so its work cannot be tallied here.
    """

    inner: CostModel
    decode_only_s: float = 0.0
    decode_only_tokens: int = 0
    decode_only_iterations: int = 0
    mixed_s: float = 0.0
    mixed_prefill_tokens: int = 0
    mixed_decode_tokens: int = 0
    mixed_iterations: int = 0
    decode_batches: list[int] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        # Everything but the iteration prices (tp, gpu, model, kv_bytes, ...) is the model's.
        return getattr(self.inner, name)

    def iteration_time(
        self, prefills: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> float:
        seconds = self.inner.iteration_time(prefills, decode_contexts)
        if prefills:
            self.mixed_s += seconds
            self.mixed_prefill_tokens += sum(tokens for tokens, _ in prefills)
            self.mixed_decode_tokens += len(decode_contexts)
            self.mixed_iterations += 1
        elif decode_contexts:
            self.decode_only_s += seconds
            self.decode_only_tokens += len(decode_contexts)
            self.decode_only_iterations += 1
            self.decode_batches.append(len(decode_contexts))
        return seconds

    def decode_time(self, batch_size: int, total_context: int) -> float:
        raise AssertionError("RecordingCost needs fast_forward=False")

    def decode_times(self, batch_size: int, total_context: int, steps: int) -> list[float]:
        raise AssertionError("RecordingCost needs fast_forward=False")


def simulated_interval(batch: RolloutBatch, cost: CostModel) -> dict[str, Any]:
    """Prefill/decode split of a colocated rollout, every iteration stepped."""
    rec = RecordingCost(cost)
    report = simulate_fixed_rollout(
        batch,
        rec,  # type: ignore[arg-type]  # duck-typed: the simulator needs only these methods
        Deployment(colocated=WORKERS),
        SimEngineConfig(fast_forward=False),
        vocab_size=cost.model.vocab_size,
    )
    prefill_tokens = rec.mixed_prefill_tokens
    all_tokens = prefill_tokens + rec.mixed_decode_tokens + rec.decode_only_tokens
    busy = rec.mixed_s + rec.decode_only_s
    batches = sorted(rec.decode_batches)
    return {
        "deployment": report.deployment,
        "batch": batch.num_trajectories,
        "makespan_s": report.makespan_s,
        "wall_s": report.wall_s,
        "decode_tok_s_per_gpu_between_prefills": rec.decode_only_tokens
        / max(rec.decode_only_s, 1e-12)
        / cost.tp,
        "decode_only_batch_median": batches[len(batches) // 2] if batches else 0,
        "decode_only_batch_mean": sum(batches) / max(1, len(batches)),
        "prefill_token_share_pct": 100.0 * prefill_tokens / max(all_tokens, 1),
        "prefill_time_share_pct": 100.0 * rec.mixed_s / max(busy, 1e-12),
        "iterations_with_prefill": rec.mixed_iterations,
        "decode_only_iterations": rec.decode_only_iterations,
        "mean_worker_busy_fraction": sum(report.worker_busy_fraction)
        / len(report.worker_busy_fraction),
    }


# -- (b) colocated vs every P:D split across batch sizes ------------------------------------
def swe_batch(size: int, seed: int, time_factor: float = 1.0) -> RolloutBatch:
    """``size`` SWE trajectories in groups of 16; ``time_factor`` scales every environment time."""
    if size % GROUP_SIZE:
        raise ValueError(f"batch {size} is not a multiple of the group size {GROUP_SIZE}")
    profile = get_profile("swe")
    if time_factor != 1.0:
        # Same name, so task ids and every token draw stay those of the unscaled batch.
        profile = scaled(profile, time_factor=time_factor, name=profile.name)
    return generate_batch(profile, num_tasks=size // GROUP_SIZE, group_size=GROUP_SIZE, seed=seed)


def sweep(
    batches: Sequence[int],
    deployments: Sequence[str],
    seed: int,
    cost: CostModel,
    time_factor: float = 1.0,
) -> list[dict[str, Any]]:
    """One row per batch size: each deployment's makespan and mean trajectory time."""
    rows = []
    for size in batches:
        batch = swe_batch(size, seed, time_factor)
        runs: dict[str, dict[str, float]] = {}
        errors: dict[str, str] = {}
        for label in deployments:
            try:
                report = simulate_fixed_rollout(
                    batch,
                    cost,
                    Deployment.parse(label),
                    SimEngineConfig(fast_forward=True),
                    vocab_size=cost.model.vocab_size,
                )
            except PearlError as exc:
                # A simulator failure is a finding to report, not a reason to lose the sweep.
                errors[label] = f"{type(exc).__name__}: {exc}"
                print(f"  batch {size:>3} {label:>5}: FAILED {errors[label]}", file=sys.stderr)
                continue
            trajectories = report.result.trajectories
            runs[label] = {
                "makespan_s": report.makespan_s,
                "mean_trajectory_s": sum(t.finished_at - t.started_at for t in trajectories)
                / len(trajectories),
                "mean_turn_latency_s": report.mean_turn_latency_s,
                "kv_bytes_moved": report.kv_bytes_moved,
                "mean_worker_busy_fraction": sum(report.worker_busy_fraction)
                / len(report.worker_busy_fraction),
                "wall_s": report.wall_s,
            }
            print(
                f"  batch {size:>3} {label:>5}: makespan {report.makespan_s:8.2f} s "
                f"({report.wall_s:.1f} s wall)",
                file=sys.stderr,
            )
        row: dict[str, Any] = {
            "batch": size,
            "env_floor_s": max(t.env_time_s for t in batch.trajectories),
            "turns": sum(t.num_turns for t in batch.trajectories),
            "generated_tokens": batch.generated_tokens,
            "runs": runs,
            "errors": errors,
            "spec_gain_pct": SPEC_GAIN_PCT.get(size),
            "spec_best": SPEC_BEST.get(size),
        }
        for metric in ("makespan_s", "mean_trajectory_s"):
            coloc = runs.get(f"{WORKERS}C", {}).get(metric)
            disagg = {k: v[metric] for k, v in runs.items() if not k.endswith("C")}
            best = min(disagg, key=disagg.__getitem__) if disagg else None
            row[metric] = {
                "best_split": best,
                "best_overall": min(runs, key=lambda k: runs[k][metric]) if runs else None,
                "gain_pct": 100.0 * (coloc / disagg[best] - 1.0) if coloc and best else None,
            }
        rows.append(row)
    return rows


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="batches 32, 64; five deployments")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument(
        "--env-time-factor",
        type=float,
        default=1.0,
        help="diagnostic only: scale every environment time of the workload (default 1)",
    )
    parser.add_argument("--out", default="results/sim_sanity.json")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    cost = make_cost()
    batches = QUICK_BATCHES if args.quick else BATCHES
    deployments = (
        QUICK_DEPLOYMENTS if args.quick else tuple(d.label for d in deployments_for(WORKERS))
    )

    rates = decode_rates(cost)
    tf = args.env_time_factor
    interval = simulated_interval(swe_batch(64, args.seed, tf), cost)
    rows = sweep(batches, deployments, args.seed, cost, tf)

    # (a) and (a'): decode rate vs SPEC.
    print(
        f"sim_sanity: {MODEL} on TP{TP} {GPU}, SWE workload seed {args.seed}"
        f"{' (quick)' if args.quick else ''}"
        f"{f', environment times x{tf:g} (diagnostic)' if tf != 1.0 else ''}"
    )
    print(
        f"(a) decode-only tok/s/GPU from the cost model, vs SPEC ~{SPEC_DECODE_TOK_S_PER_GPU:.0f}"
        f" ('*': batch x context exceeds one worker's KV cache of "
        f"{cost.kv_capacity_tokens():,} tokens)"
    )
    head = f"{'per-GPU batch':>13} " + " ".join(f"{f'ctx {c // 1024}K':>12}" for c in CONTEXTS)
    print(head)
    for per_gpu in PER_GPU_BATCHES:
        cells = []
        for c in CONTEXTS:
            r = next(x for x in rates if x["per_gpu_batch"] == per_gpu and x["context"] == c)
            cells.append(f"{r['tok_s_per_gpu']:>11.0f}{' ' if r['fits_kv'] else '*'}")
        print(f"{per_gpu:>13} " + " ".join(cells))
    print(
        f"(a') simulated 8C rollout, batch 64 (stepped): decode between prefills "
        f"{interval['decode_tok_s_per_gpu_between_prefills']:.0f} tok/s/GPU "
        f"(median decode batch {interval['decode_only_batch_median']}/worker; SPEC ~400); "
        f"prefill {interval['prefill_token_share_pct']:.2f}% of tokens in "
        f"{interval['prefill_time_share_pct']:.2f}% of busy time "
        f"(SPEC {SPEC_PREFILL_TOKEN_SHARE_PCT}% in {SPEC_PREFILL_TIME_SHARE_PCT}%); "
        f"workers busy {100 * interval['mean_worker_busy_fraction']:.1f}% of the makespan"
    )

    # (b): one table, two rows per batch (makespan, then mean trajectory time).
    print(
        f"(b) {WORKERS} x TP{TP} {GPU}: seconds per deployment; gain = T_{WORKERS}C / T_best_split - 1"
    )
    cols = " ".join(f"{d:>7}" for d in deployments)
    header = (
        f"{'batch':>5} {'metric':<9} {'env floor':>9} {cols} {'best':>5} {'gain':>7} "
        f"{'SPEC gain':>9} {'SPEC best':>9}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        for metric, name in (("makespan_s", "makespan"), ("mean_trajectory_s", "mean traj")):
            summary = row[metric]
            values = " ".join(
                f"{row['runs'][d][metric]:>7.1f}" if d in row["runs"] else f"{'FAILED':>7}"
                for d in deployments
            )
            # Batch, environment floor and SPEC's numbers are about the makespan row only.
            if metric == "makespan_s":
                lead = f"{row['batch']:>5} {name:<9} {row['env_floor_s']:>9.1f}"
                spec = f"{_pct(row['spec_gain_pct']):>9} {row['spec_best'] or '-':>9}"
            else:
                lead = f"{'':>5} {name:<9} {'':>9}"
                spec = f"{'':>9} {'':>9}"
            print(
                f"{lead} {values} {summary['best_split'] or '-':>5} "
                f"{_pct(summary['gain_pct']):>7} {spec}"
            )

    result = {
        "benchmark": "sim_sanity",
        "model": MODEL,
        "gpu": GPU,
        "tp": TP,
        "workers": WORKERS,
        "seed": args.seed,
        "quick": args.quick,
        "env_time_factor": tf,
        "kv_capacity_tokens_per_worker": cost.kv_capacity_tokens(),
        "decode_rates": rates,
        "simulated_interval": interval,
        "crossover": rows,
        "spec": {
            "decode_tok_s_per_gpu": SPEC_DECODE_TOK_S_PER_GPU,
            "prefill_token_share_pct": SPEC_PREFILL_TOKEN_SHARE_PCT,
            "prefill_time_share_pct": SPEC_PREFILL_TIME_SHARE_PCT,
            "best_disagg_over_coloc_pct": SPEC_GAIN_PCT,
            "best_ratio": SPEC_BEST,
        },
        "wall_s": time.perf_counter() - t0,
        "python": platform.python_version(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for row in rows:
        for label, error in row["errors"].items():
            print(f"FAILED batch {row['batch']} {label}: {error}")
    print(f"wrote {out} ({result['wall_s']:.0f} s)")
    return 1 if any(row["errors"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
