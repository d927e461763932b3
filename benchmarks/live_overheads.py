"""Where a live turn's time goes outside the engine's iterations (issue: simulator fidelity).

    .venv/bin/python benchmarks/live_overheads.py                 # swe-cpu 8 traj on 1C, 2C, 1P1D
    .venv/bin/python benchmarks/live_overheads.py --cases 2 --repeats 3

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
``rpc_overhead_s``, both measured by ``pearl calibrate`` on an idle worker). Writes
``results/live_overheads.json``. The machine is shared: run it when nothing else runs,
and repeat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from pearl.live.server import ModelSpec
from pearl.live.worker import ensure_ray
from pearl.sim import fidelity as fid

TIMED = ("generate", "prefill", "decode", "match_session", "session_length", "release_session")


class TimedWorker:
    """A worker handle that records the driver-side duration of every call the router makes."""

    def __init__(self, inner, calls: list) -> None:
        self._inner, self._calls = inner, calls

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in TIMED:
            return attr

        async def timed(*args, **kwargs):
            t0 = time.monotonic()
            out = await attr(*args, **kwargs)
            t1 = time.monotonic()
            engine_s = None
            if name in ("generate", "prefill", "decode"):
                engine_s = out.telemetry.finished_at - out.telemetry.submitted_at
            self._calls.append((name, t1 - t0, engine_s))
            return out

        return timed


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


def run_case(case, model, vocab: int) -> dict:
    calls: list = []

    def wrap(worker):
        return TimedWorker(worker, calls)

    t0 = time.monotonic()
    result, iterations = fid.run_live_case(case, model, fid.CALIBRATION_ENGINE, vocab, wrap)
    wall = time.monotonic() - t0
    by_method = {m: stats([d for name, d, _ in calls if name == m]) for m in TIMED}
    gaps = [d - e for name, d, e in calls if e is not None]
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
        "non_turn_calls_per_turn": sum(1 for name, _, e in calls if e is None) / max(1, turns),
        "non_turn_call_s_per_turn": sum(d for name, d, e in calls if e is None) / max(1, turns),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default="results/live_overheads.json")
    args = parser.parse_args()
    ensure_ray(2)
    model = ModelSpec(config=fid.CALIBRATION_MODEL, seed=0)
    vocab = fid.CALIBRATION_MODEL["vocab_size"]
    rows = []
    for index in args.cases:
        case = fid.DEFAULT_CASES[index]
        for rep in range(args.repeats):
            row = run_case(case, model, vocab)
            row["repeat"] = rep
            rows.append(row)
            c = row["calls"]
            print(
                f"{case.name} (repeat {rep}): makespan {row['makespan_s']:.2f} s, "
                f"{row['turns']} turns, iteration median {row['iteration']['median_ms']:.1f} ms"
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
                print(
                    f"  KV moves: n={k['n']} median {k['median_ms']:.2f} ms p90 {k['p90_ms']:.2f} ms"
                )
            print(
                f"  other calls per turn: {row['non_turn_calls_per_turn']:.1f}, "
                f"{1e3 * row['non_turn_call_s_per_turn']:.2f} ms"
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
