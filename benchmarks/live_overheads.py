"""Where a live turn's time goes outside the engine's iterations (issue: simulator fidelity).

    .venv/bin/python benchmarks/live_overheads.py                 # swe-cpu 8 traj on 1C, 2C, 1P1D
    .venv/bin/python benchmarks/live_overheads.py --cases 2 --repeats 3
    .venv/bin/python benchmarks/live_overheads.py --cases 2 --repeats 3 --sim   # + simulated
    .venv-vllm/bin/python benchmarks/live_overheads.py --backend vllm --cases 2 5 --sim

Runs fidelity cases live (Ray actors, the calibration model, wall clock) with every worker
handle wrapped in a timing proxy, and reports, per case:

* per worker call the router makes (``generate``, ``prefill``, ``decode``,
  ``match_session``, ``session_length``, ``release_session``) and per KV move: count,
  median and p90 of its driver-side duration;
* for turns, the **gap**: driver-side duration minus the engine-side latency (submitted ->
  finished on the actor's clock): Ray's round trip plus the wait for the actor's event
  loop, which is blocked while an iteration runs;
* the engine iterations' median duration (what a call waits for, at most, to land).

Compare with what the simulator charges (``SimEngineConfig.request_overhead_s`` and
``rpc_overhead_s``, both measured by ``pearl calibrate`` on an idle worker). With
``--sim`` the same calls are timed in the simulator too (virtual clock; profile fitted as
``pearl calibrate`` does, on held-out runs of the case's workload and deployment) and
shown beside the live ones: where the simulated turn is shorter. Writes
``results/live_overheads.json``. The machine is shared: run it when nothing else runs,
and repeat.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

from pearl.apps import fidelity as fid
from pearl.control.call_timer import TIMED, TimedWorker
from pearl.live.cluster import ensure_ray
from pearl.live.server import ModelSpec


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(values),
        "median_ms": 1e3 * statistics.median(ordered),
        "p90_ms": 1e3 * ordered[int(0.9 * (len(ordered) - 1))],
        "total_s": sum(ordered),
    }


def run_case(case, model, vocab: int, sim: dict | None = None, backend: str = "pearl") -> dict:
    """The case live on ``backend``'s engine, or with ``sim`` (cost, latency, overhead, rpc,
    twin) in the simulator."""
    calls: list = []

    def wrap(worker):
        return TimedWorker(worker, calls)

    t0 = time.monotonic()
    if sim is None:
        result, iterations = fid.run_live_case(
            case, model, fid.CALIBRATION_ENGINE, vocab, wrap, backend
        )
    else:
        iterations = []
        sim = dict(sim)
        engine = sim.pop("engine", fid.CALIBRATION_ENGINE)
        result = fid.run_sim_case(
            case,
            **sim,
            engine=engine,
            vocab=vocab,
            wrap=wrap,
            on_iteration=lambda worker, start, dt, out, n: iterations.append(((), (), dt / n)),
        )
    wall = time.monotonic() - t0
    by_method = {m: stats([c.seconds for c in calls if c.name == m]) for m in TIMED}
    gaps = [c.gap_s for c in calls if c.gap_s is not None]
    moves = [o.telemetry.kv_transfer_s for t in result.trajectories for o in t.turns]
    turns = sum(len(t.turns) for t in result.trajectories)
    return {
        "case": case.name,
        "makespan_s": result.makespan_s,
        "wall_s": wall,
        "turns": turns,
        "calls": by_method,
        "turn_gap": stats(gaps),
        "kv_move": stats([m for m in moves if m > 0]),
        "iteration": stats([seconds for _, _, seconds in iterations]),
        "non_turn_calls_per_turn": sum(1 for c in calls if c.engine_s is None) / max(1, turns),
        "non_turn_call_s_per_turn": sum(c.seconds for c in calls if c.engine_s is None)
        / max(1, turns),
    }


def fit_for(case, model, vocab: int, passes: int, backend: str = "pearl") -> dict:
    """What ``pearl calibrate`` gives the simulator for ``case``: the in-situ fit on held-out
    runs of the case's workload and deployment (plus the grid, on our engine), the per-turn
    and per-call overheads and the KV move's latency and bandwidth; on vLLM, its twin."""
    engine = fid.CALIBRATION_ENGINE
    extra: dict = {}
    if backend == "vllm":
        overhead, rpc, sizing = fid.measure_vllm_overheads(model, engine)
        grid: list = []
        extra = {
            "twin": fid.VLLM_TWIN,
            "engine": fid.EngineConfig(**sizing, model_id="calibration"),
        }
    else:
        _, _, (overhead, rpc), grid = fid.calibrate_in_worker(model, engine)
    latency, bandwidth = fid.measure_transfer(model, engine, backend=backend)
    measured = fid.HeldOut()
    for _ in range(passes):
        measured.extend(
            fid.held_out_samples(
                model, engine, vocab, fid._fit_key(case.deployment), case.workload, backend
            )
        )
    profile, _ = fid.fit_in_situ(measured.samples, grid)
    overhead, rpc = measured.load_overheads(overhead, rpc)
    gpu = dataclasses.replace(
        profile.gpu, nvlink_bandwidth_Bps=bandwidth, network_bandwidth_Bps=bandwidth
    )
    cost = fid.sim_cost(dataclasses.replace(profile, gpu=gpu), fid.CALIBRATION_MODEL)
    print(
        f"fit for {case.name}: {len(measured.samples)} held-out iterations, turn overhead under load "
        f"{overhead * 1e3:.1f} ms, call {rpc * 1e3:.1f} ms, KV move {latency * 1e3:.1f} ms + "
        f"{bandwidth / 1e6:.0f} MB/s"
    )
    return dict(
        cost=cost, link_latency_s=latency, request_overhead_s=overhead, rpc_overhead_s=rpc, **extra
    )


def print_row(row: dict) -> None:
    c = row["calls"]
    print(
        f"{row['case']} ({row['world']}, repeat {row['repeat']}): makespan "
        f"{row['makespan_s']:.2f} s, {row['turns']} turns, iteration median "
        f"{row['iteration']['median_ms']:.1f} ms"
    )
    for name, st in c.items():
        if st["n"]:
            print(
                f"  {name:16s} n={st['n']:4d}  median {st['median_ms']:7.2f} ms  "
                f"p90 {st['p90_ms']:7.2f} ms"
            )
    g, k = row["turn_gap"], row["kv_move"]
    print(
        f"  turn gap (driver - engine): median {g['median_ms']:.2f} ms, p90 "
        f"{g['p90_ms']:.2f} ms, total {g['total_s']:.2f} s over {g['n']} turns"
    )
    if k["n"]:
        print(f"  KV moves: n={k['n']} median {k['median_ms']:.2f} ms p90 {k['p90_ms']:.2f} ms")
    print(
        f"  other calls per turn: {row['non_turn_calls_per_turn']:.1f}, "
        f"{1e3 * row['non_turn_call_s_per_turn']:.2f} ms"
    )


def print_side_by_side(live: list[dict], sim: dict) -> None:
    """Per call: seconds per turn (all calls of that kind over all turns), live mean of the
    repeats against the simulator; the difference is where the simulated turn is shorter."""
    print(f"{sim['case']}: seconds per turn by call, live (mean of {len(live)}) vs simulated")
    rows = [(m, f"calls.{m}") for m in TIMED] + [("KV move", "kv_move"), ("turn gap", "turn_gap")]
    for label, key in rows:

        def per_turn(row, key=key):
            st = row
            for part in key.split("."):
                st = st[part]
            return st.get("total_s", 0.0) / max(1, row["turns"])

        a = statistics.fmean(per_turn(r) for r in live)
        b = per_turn(sim)
        if a or b:
            print(
                f"  {label:16s} live {1e3 * a:8.1f} ms  sim {1e3 * b:8.1f} ms  ({1e3 * (b - a):+.1f})"
            )
    a = statistics.fmean(r["makespan_s"] for r in live)
    print(
        f"  makespan         live {a:8.2f} s   sim {sim['makespan_s']:8.2f} s  ({100 * (sim['makespan_s'] / a - 1):+.1f}%)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--sim", action="store_true", help="also time the calls in the simulator")
    parser.add_argument("--fit-passes", type=int, default=2, help="held-out runs per fit (--sim)")
    parser.add_argument("--backend", choices=fid.BACKENDS, default="pearl")
    parser.add_argument("--out", default="results/live_overheads.json")
    args = parser.parse_args()
    ensure_ray(2)
    vocab = fid.CALIBRATION_MODEL["vocab_size"]
    with tempfile.TemporaryDirectory(prefix="pearl-overheads-") as folder:
        if args.backend == "vllm":  # vLLM loads a folder: the same random-weight model
            fid._save_random_model(fid.CALIBRATION_MODEL, folder)
            model = ModelSpec(folder=folder)
        else:
            model = ModelSpec(config=fid.CALIBRATION_MODEL, seed=0)
        rows = run_cases(args, model, vocab)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"backend": args.backend, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


def run_cases(args, model, vocab: int) -> list[dict]:
    rows = []
    for index in args.cases:
        case = fid.DEFAULT_CASES[index]
        live = []
        for rep in range(args.repeats):
            row = {
                "world": "live",
                "repeat": rep,
                **run_case(case, model, vocab, None, args.backend),
            }
            print_row(row)
            live.append(row)
        rows += live
        if args.sim:
            sim = {
                "world": "sim",
                "repeat": 0,
                **run_case(
                    case, model, vocab, fit_for(case, model, vocab, args.fit_passes, args.backend)
                ),
            }
            print_row(sim)
            print_side_by_side(live, sim)
            rows.append(sim)
    return rows


if __name__ == "__main__":
    main()
