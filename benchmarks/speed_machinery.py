"""The simulator's speed machinery, one mechanism at a time: what each earns, same digests.

    .venv/bin/python benchmarks/speed_machinery.py                        # 64 workers, 4 rounds
    .venv/bin/python benchmarks/speed_machinery.py --workers 512 --rounds 2   # ~30 min

One ``pearl`` RL step (``sim_scale.one_step``: the paper regime, batch ``8 W`` on ``W`` TP2
workers), each run a fresh interpreter, with everything on (``all``: how ``pearl plan`` and
``pearl simulate`` start their simulation processes, ``pearl.processes.env``) and with one
mechanism off at a time:

- ``no-compiled``: the engine's and simulator's hot modules as Python (``PEARL_NATIVE=0``;
  objects then go to glibc's ``malloc`` on huge pages, as without a build);
- ``no-arenas``: CPython's arenas on ordinary pages (no ``PEARL_HUGE_ARENAS``; larger
  objects still in ``malloc`` on huge pages);
- ``no-huge-pages``: no huge pages at all (``PEARL_HUGE_PAGES=0``: CPython's allocator);
- ``default-gc``: CPython's collection thresholds (``pearl.sim.clock.sparse_gc`` off);
- ``asyncio-loop``: asyncio's own ``call_at`` and ``_run_once`` under the virtual clock
  (``VirtualTimeLoop``'s overrides removed).

The variants run in rounds, forward then backward (all, v1, ..., v5, then v5, ..., all), so a
steady drift of the shared host weighs on every variant alike. Reported per variant: each
run's wall seconds and digest, and the ratio of its mean wall time to ``all``'s over the
same rounds (the time with the mechanism off over the time with it on: 1.10 means the
mechanism saves 9% of the step). Exits with status 1 if any digest differs. Writes
``results/speed_machinery_<workers>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from pearl.processes.env import simulation_env

ROOT = Path(__file__).resolve().parents[1]

# One step in a fresh interpreter; argv: workers, model, then the switches in the child.
_ONE_RUN = """
import contextlib, json, pathlib, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
workers, model, off = int(sys.argv[2]), sys.argv[3], sys.argv[4]
from pearl.sim import clock
if off == "default-gc":
    clock.sparse_gc = contextlib.nullcontext
if off == "asyncio-loop":
    del clock.VirtualTimeLoop.call_at, clock.VirtualTimeLoop._run_once
import sim_scale
with tempfile.TemporaryDirectory() as d:
    trace = pathlib.Path(d) / "none.csv"
    trace.write_text("time_s,available\\n0,0\\n")
    r = sim_scale.one_step(model, workers, str(trace))
r["cpu_s"] = time.process_time()
import os
maps = open("/proc/self/maps").read()
r["on"] = {  # what this process ran with, as it ran
    "compiled": sys.modules["pearl.sim.worker"].__file__.endswith(".so"),
    "arenas": "huge_arenas.so" in maps,
    "huge-pages": "glibc.malloc.hugetlb=1" in os.environ.get("GLIBC_TUNABLES", ""),
    "sparse-gc": clock.sparse_gc is not contextlib.nullcontext,
    "own-loop": "_run_once" in clock.VirtualTimeLoop.__dict__,
}
print(json.dumps({k: r[k] for k in ("wall_s", "cpu_s", "peak_mb", "digest", "on")}))
"""

VARIANTS = ("all", "no-compiled", "no-arenas", "no-huge-pages", "default-gc", "asyncio-loop")
# What each variant turns off (``no-compiled`` takes the arena library with it: it comes
# with the build; ``no-huge-pages`` too: it asks for huge pages).
OFF = {
    "all": set(),
    "no-compiled": {"compiled", "arenas"},
    "no-arenas": {"arenas"},
    "no-huge-pages": {"huge-pages", "arenas"},
    "default-gc": {"sparse-gc"},
    "asyncio-loop": {"own-loop"},
}


def variant_env(variant: str, base: dict[str, str]) -> dict[str, str]:
    """The environment a run of ``variant`` starts with (``base``: this process's)."""
    env = {k: v for k, v in base.items() if k not in ("PEARL_NATIVE", "PEARL_HUGE_ARENAS")}
    if variant == "no-compiled":
        env["PEARL_NATIVE"] = "0"
    if variant == "no-huge-pages":
        env["PEARL_HUGE_PAGES"] = "0"
    env.update(simulation_env(env))
    if variant == "no-arenas":
        env.pop("PEARL_HUGE_ARENAS", None)
    return env


def one_run(variant: str, workers: int, model: str, base: dict[str, str]) -> dict:
    env = variant_env(variant, base)
    proc = subprocess.run(
        [sys.executable, "-c", _ONE_RUN, str(ROOT / "benchmarks"), str(workers), model, variant],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if proc.returncode != 0:
        raise SystemExit(f"the {variant} run failed:\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    off = {mechanism for mechanism, on in out["on"].items() if not on}
    if off != OFF[variant]:
        raise SystemExit(
            f"the {variant} run had {sorted(off) or 'nothing'} off, not {sorted(OFF[variant])}"
            " (no compiled build? python -m pearl.native; no huge pages on this host?)"
        )
    out["env"] = {k: v for k, v in env.items() if base.get(k) != v}
    return out


def order(rounds: int, variants: tuple[str, ...] = VARIANTS) -> list[str]:
    """Forward, backward, forward, ...: each variant's mean position is the same."""
    return [v for i in range(rounds) for v in (variants if i % 2 == 0 else variants[::-1])]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--model", default="Qwen3-8B")
    parser.add_argument("--rounds", type=int, default=4, help="even, so drift cancels")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS[1:],
        default=list(VARIANTS[1:]),
        help="the mechanisms to turn off (each beside all)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.rounds % 2 or args.workers < 1:
        parser.error("--rounds must be an even number >= 2, --workers >= 1")
    base = dict(os.environ)
    variants = ("all", *args.variants)
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for variant in order(args.rounds, variants):
        r = one_run(variant, args.workers, args.model, base)
        runs[variant].append(r)
        print(
            f"{variant:14s} {r['wall_s']:7.1f} s wall {r['cpu_s']:7.1f} s CPU "
            f"{r['peak_mb']:6.0f} MB  {r['digest']}",
            flush=True,
        )
    summary = {}
    on = [r["wall_s"] for r in runs["all"]]
    for variant in variants:
        walls = [r["wall_s"] for r in runs[variant]]
        summary[variant] = {
            "wall_s": walls,
            "median_s": statistics.median(walls),
            "off_over_on": statistics.fmean(walls) / statistics.fmean(on),
            "env": runs[variant][0]["env"],
        }
        print(
            f"{variant:14s} median {statistics.median(walls):7.1f} s  "
            f"off/on {summary[variant]['off_over_on']:.3f}  env {runs[variant][0]['env']}"
        )
    digests = {r["digest"] for rs in runs.values() for r in rs}
    verdict = f"digest {min(digests)} on every run" if len(digests) == 1 else "DIGESTS DIFFER"
    print(verdict)
    out = Path(args.out or ROOT / "results" / f"speed_machinery_{args.workers}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "workers": args.workers,
                "model": args.model,
                "rounds": args.rounds,
                "python": platform.python_version(),
                "digests": sorted(digests),
                "variants": summary,
                "runs": runs,
            },
            indent=1,
        )
    )
    if len(digests) != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
