"""Live PD: the decision engine picks colocation or a P:D split from a live batch, then both
run live on the same trajectories (SmolLM2-135M-Instruct, our engine, Ray workers, this machine).

    .venv/bin/python benchmarks/live_pd.py                       # three workloads, 3 repeats each
    .venv/bin/python benchmarks/live_pd.py --workloads balanced --repeats 5
    .venv-vllm/bin/python benchmarks/live_pd.py --backend vllm --out results/live_pd_vllm.json

Per workload: one batch (seed 100) runs on 2 colocated workers, and the runtime tracker
refits the decision model from its iterations and trajectories, as a running ``pearl-pd``
would after its first step (the KV move's latency and bandwidth are measured between two
actors first: a colocated batch moves no KV). The PD Decision Engine then predicts 2C and
1P1D and decides from 2C with the default thresholds. Then another batch (seed 0) runs on
2C and on 1P1D, ``--repeats`` times each, alternating which goes first; each run starts
fresh workers (warmed up, not timed). Prints the predicted and measured makespans; writes
``results/live_pd.json``. Needs the machine otherwise idle: two workers take both cores.

The workloads (nothing here is tuned to what the run prints):
- ``balanced``: per turn ~16 generated and ~60 observation tokens, 16 trajectories, 6-10
  turns, environment steps of 10-50 ms: each colocated worker's time splits about evenly
  between decode steps and prefill (a SmolLM2 decode step costs about as much as ~50
  prefill tokens on one core).
- ``small-batch``: the same with 8 trajectories and 30-60 observation tokens: a decode
  worker's step costs little more at 8 sequences than at 4, so concentrating decode is cheap.
- ``swe-cpu``: the fidelity runs' SWE shape (1/16 of the tokens, 1/200 of the times), 8
  trajectories: observations of hundreds of tokens, prefill-bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

from pearl.apps.fidelity import measure_transfer, run_live_batch
from pearl.control.decision import DecisionConfig, decide, evaluate_candidates
from pearl.control.deployment import Deployment
from pearl.control.rollout import BatchResult
from pearl.control.state import Topology
from pearl.control.tracker import RuntimeTracker
from pearl.engine.config import EngineConfig
from pearl.live.server import ModelSpec
from pearl.live.world import as_observation, cpu_prior
from pearl.models.catalog import resolve_model
from pearl.models.config import ModelConfig
from pearl.workloads.agentic import generate_batch
from pearl.workloads.distributions import Fixed, Uniform, UniformInt
from pearl.workloads.profiles import AgenticProfile, get_profile, scaled

ENGINE = EngineConfig(
    block_size=16,
    num_kv_blocks=4096,
    max_num_batched_tokens=512,
    max_num_seqs=64,
    model_id="smollm2-135m",
)
FIT_SEED, MEASURE_SEED = 100, 0
DEPLOYMENTS = ("2C", "1P1D")
BACKEND = {"name": "pearl"}  # rollout engine of every run (--backend)


def workloads() -> dict[str, AgenticProfile]:
    balanced = AgenticProfile(
        name="balanced",
        max_context_tokens=2_048,
        group_size=4,
        num_tasks=4,
        turns=UniformInt(6, 10),
        min_turns=1,
        max_turns=12,
        shared_prefix_tokens=64,
        task_prompt_tokens=UniformInt(50, 150),
        max_prompt_tokens=512,
        response_tokens=UniformInt(12, 20),
        observation_tokens=UniformInt(40, 80),
        env_latency_s=Uniform(0.01, 0.05),
        env_setup_s=Fixed(0.0),
        description="decode and prefill about even per colocated worker (SmolLM2 on one core)",
    )
    small = dataclasses.replace(
        balanced,
        name="small-batch",
        num_tasks=2,
        observation_tokens=UniformInt(30, 60),
        description="8 trajectories, lighter prefill: the decode worker's batch stays small",
    )
    swe_cpu = dataclasses.replace(
        scaled(get_profile("swe"), token_factor=1 / 16, time_factor=1 / 200, name="swe-cpu"),
        num_tasks=2,
        group_size=4,
    )
    return {"balanced": balanced, "small-batch": small, "swe-cpu": swe_cpu}


def refit(tracker: RuntimeTracker, result, log: list, current: Topology) -> dict:
    """The tracker refitted on one more batch (as a running ``pearl-pd`` after a step), the
    engine's predictions for 2 workers and its decision from ``current``."""
    for traj in result.trajectories:
        tracker.observe_result(traj)
    for it in log:
        tracker.observe_iteration(as_observation(it))
    params = tracker.end_step(len(result.trajectories), result.makespan_s)
    config = DecisionConfig()
    candidates = evaluate_candidates(params, 2, config)
    decision = decide(params, 2, current, config)
    return {
        "batch_makespan_s": result.makespan_s,
        "fit": {k: v.to_dict() for k, v in tracker.fit_report.items()},
        "predicted_s": {c.topology.label: c.makespan_s for c in candidates},
        "candidates": [c.to_dict() for c in candidates],
        "decision": decision.to_dict(),
        "chosen": decision.target.label,
    }


def fit(
    profile: AgenticProfile,
    model: ModelSpec,
    config: ModelConfig,
    vocab: int,
    link: tuple[float, float],
) -> tuple[dict, RuntimeTracker]:
    """One colocated batch, the tracker refitted on it, the engine's predictions and choice;
    ``link`` is the measured (latency s, bandwidth B/s) of a KV move between two actors."""
    latency, bandwidth = link
    batch = generate_batch(profile, seed=FIT_SEED)
    result, log = run_live_batch(
        batch, Deployment.parse("2C"), model, ENGINE, vocab, backend=BACKEND["name"]
    )
    # The prior's KV link: the measured actor-to-actor move at a typical turn's size.
    move_bytes = config.kv_bytes_per_token * 100
    prior = dataclasses.replace(
        cpu_prior(config, len(batch.trajectories), profile.max_context_tokens),
        pd_bandwidth_bytes_per_s=move_bytes / (latency + move_bytes / bandwidth),
    )
    tracker = RuntimeTracker(prior)
    row = refit(tracker, result, log, Topology.colocation(2))
    row["kv_link"] = {"latency_s": latency, "bandwidth_bytes_per_s": bandwidth}
    return row, tracker


def breakdown(result, log: list) -> dict:
    """Where a run's time went: engine-busy seconds by iteration kind (summed over workers),
    the mean decode batch, and the KV moves' seconds (summed over turns)."""
    busy = {"prefill": 0.0, "decode": 0.0, "mixed": 0.0}
    batches = []
    for prefills, decodes, seconds in log:
        kind = "mixed" if prefills and decodes else "prefill" if prefills else "decode"
        busy[kind] += seconds
        if decodes:
            batches.append(len(decodes))
    moves = [o.telemetry.kv_transfer_s for t in result.trajectories for o in t.turns]
    return {
        "busy_s": busy,
        "mean_decode_batch": statistics.fmean(batches) if batches else 0.0,
        "kv_move_s": sum(moves),
        "turns": len(moves),
    }


def measure(
    profile: AgenticProfile, model: ModelSpec, vocab: int, repeats: int
) -> tuple[dict, dict[str, tuple[BatchResult, list]]]:
    """The same batch on each deployment, ``repeats`` times, alternating the order; also
    each deployment's first run (result, iteration log)."""
    batch = generate_batch(profile, seed=MEASURE_SEED)
    runs: dict[str, list[float]] = {d: [] for d in DEPLOYMENTS}
    where: dict[str, list[dict]] = {d: [] for d in DEPLOYMENTS}
    first: dict[str, tuple[BatchResult, list]] = {}
    for r in range(repeats):
        order = DEPLOYMENTS if r % 2 == 0 else DEPLOYMENTS[::-1]
        for label in order:
            result, log = run_live_batch(
                batch, Deployment.parse(label), model, ENGINE, vocab, backend=BACKEND["name"]
            )
            runs[label].append(result.makespan_s)
            where[label].append(breakdown(result, log))
            first.setdefault(label, (result, log))
            b = where[label][-1]
            print(
                f"  run {r + 1}/{repeats} {label}: {result.makespan_s:.2f} s; engines busy "
                + ", ".join(f"{k} {v:.1f} s" for k, v in b["busy_s"].items())
                + f"; mean decode batch {b['mean_decode_batch']:.1f}; KV moves {b['kv_move_s']:.1f} s",
                flush=True,
            )
    return {
        label: {
            "makespans_s": xs,
            "mean_s": statistics.fmean(xs),
            "spread": (max(xs) - min(xs)) / statistics.fmean(xs),
            "breakdown": where[label],
        }
        for label, xs in runs.items()
    }, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["balanced", "small-batch", "swe-cpu"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/live_pd.json")
    parser.add_argument(
        "--backend", choices=("pearl", "vllm"), default="pearl", help="the rollout engine"
    )
    args = parser.parse_args()
    BACKEND["name"] = args.backend
    known = workloads()
    unknown = [w for w in args.workloads if w not in known]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; known: {', '.join(known)}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")

    folder = resolve_model("smollm2-135m", log=print)
    config = ModelConfig.from_folder(folder)
    model = ModelSpec(folder=str(folder))
    vocab = config.vocab_size
    start = time.perf_counter()
    link = measure_transfer(model, ENGINE, backend=args.backend)  # 2C moves no KV
    out = {}
    for name in args.workloads:
        profile = known[name]
        print(f"{name}: {profile.description or profile.name}", flush=True)
        row, tracker = fit(profile, model, config, vocab, link)
        print(
            f"  fit batch on 2C: {row['batch_makespan_s']:.2f} s; predicted "
            + ", ".join(f"{k} {v:.2f} s" for k, v in row["predicted_s"].items())
            + f"; the engine chooses {row['chosen']} ({row['decision']['reason']})",
            flush=True,
        )
        row["measured"], first = measure(profile, model, vocab, args.repeats)
        # Where the engine chose the split: its next decision, refitted on a batch run there.
        if row["chosen"] != "2C":
            result, log = first[row["chosen"]]
            again = refit(tracker, result, log, Topology.split(1, 1))
            row["after_split_batch"] = again
            print(
                "  refitted on its 1P1D batch: predicted "
                + ", ".join(f"{k} {v:.2f} s" for k, v in again["predicted_s"].items())
                + f"; the engine now chooses {again['chosen']} ({again['decision']['reason']})",
                flush=True,
            )
        out[name] = row
    print()
    print("| workload | deployment | predicted (s) | measured mean (s) | spread | chosen |")
    print("|---|---|---:|---:|---:|---|")
    for name, row in out.items():
        for label in DEPLOYMENTS:
            m = row["measured"][label]
            mark = "yes" if row["chosen"] == label else ""
            print(
                f"| {name} | {label} | {row['predicted_s'][label]:.2f} | {m['mean_s']:.2f} "
                f"| {100 * m['spread']:.0f}% | {mark} |"
            )
        c, d = (row["measured"][label]["mean_s"] for label in DEPLOYMENTS)
        print(f"| {name} | 1P1D's makespan against 2C's | | {100 * (d - c) / c:+.1f}% | | |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"\n{time.perf_counter() - start:.0f} s; wrote {args.out}")


if __name__ == "__main__":
    main()
