"""Simulator A/B: one pearl step (``sim_scale.one_step``) of a base revision against the
working tree, run alternately, with the results' digests compared.

    .venv/bin/python benchmarks/sim_ab.py --base HEAD~1                 # 64 workers, 3 pairs
    .venv/bin/python benchmarks/sim_ab.py --base 5eb8b57 --workers 512 --pairs 1

The machines here are shared: the same run's wall time moves 10-20% within minutes and up
to 2x within a day, so a speed-up of a few percent shows only against a baseline run right
beside it. The base revision is checked out in a temporary git worktree; every run is a
fresh process (its own imports, peak memory and allocator state) on one tree's ``src/``,
in the order base, new, new, base, base, new, ... (ABBA: a steady drift of the host's
speed weighs on both sides alike). Reported per run: wall and CPU seconds, peak resident
MB and the result's digest (``sim_scale.result_digest``); then each side's median and the
median of the pairs' new/base ratios. Exits with status 1 if the digests differ (a
speed-up must not change the result). Both sides' processes start as ``pearl plan`` starts
its runs (``pearl.processes.huge_pages``; ``PEARL_HUGE_PAGES=0``: CPython's allocator), each
on its own tree's compiled modules (``pearl.native``, built first where missing; a run on
the other kind of modules than ``PEARL_NATIVE`` asks for stops the comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pearl.processes.env import simulation_env

ROOT = Path(__file__).resolve().parents[1]

# One step in a fresh interpreter on the tree whose src/ and benchmarks/ come first.
_ONE_RUN = """
import json, pathlib, sys, tempfile, time
sys.path[:0] = [sys.argv[1] + "/src", sys.argv[1] + "/benchmarks"]
import pearl, sim_scale
assert pearl.__file__.startswith(sys.argv[1]), f"pearl came from {pearl.__file__}"
with tempfile.TemporaryDirectory() as d:
    trace = pathlib.Path(d) / "none.csv"
    # No preemptible GPUs, as sim_scale's main writes it (inline: older trees run this too).
    trace.write_text("time_s,available\\n0,0\\n")
    r = sim_scale.one_step(sys.argv[3], int(sys.argv[2]), str(trace))
r["cpu_s"] = time.process_time()
r["compiled"] = sys.modules["pearl.sim.worker"].__file__.endswith(".so")
print(json.dumps({k: r[k] for k in ("wall_s", "cpu_s", "peak_mb", "digest", "compiled")}))
"""

# The tree's environment for a simulation process, as its `pearl plan` starts its runs,
# after building its compiled modules where it can (``pearl.native``; a no-op when built).
_TREE_ENV = """
import json, sys
sys.path[:0] = [sys.argv[1] + "/src"]
from pearl import native
from pearl.processes.env import simulation_env
if sys.argv[2] == "1":
    native.build()
print(json.dumps(simulation_env()))
"""


def _run_json(code: str, args: list[str], env: dict[str, str], what: str) -> dict:
    """Run ``code`` in a fresh interpreter with ``env``; its last line of output, as JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def one_run(tree: Path, workers: int, model: str, env: dict[str, str]) -> dict:
    out = _run_json(_ONE_RUN, [str(tree), str(workers), model], env, f"the run on {tree}")
    if out["compiled"] != (env.get("PEARL_NATIVE") == "1"):
        raise SystemExit(
            f"the run on {tree} ran {'compiled' if out['compiled'] else 'Python'} modules, "
            f"not what PEARL_NATIVE={env.get('PEARL_NATIVE')!r} asks for"
        )
    return out


def tree_env(tree: Path, native: bool) -> dict[str, str]:
    """The environment ``tree`` starts its simulation processes with, on its own compiled
    build when ``native`` (built here if missing: a worktree is not installed, and a base on
    its Python modules, ~1.5x slower, would look like a speed-up). Each side its own: a
    setting one tree adds may mean nothing to the other."""
    env = dict(os.environ)
    if not native:
        env["PEARL_NATIVE"] = "0"
    added = _run_json(_TREE_ENV, [str(tree), "1" if native else "0"], env, f"preparing {tree}")
    return {**env, **added}


def order(pairs: int) -> list[str]:
    """ABBA: base, new, new, base, base, new, ... (``pairs`` runs of each)."""
    return [
        side for i in range(pairs) for side in (("base", "new") if i % 2 == 0 else ("new", "base"))
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--model", default="Qwen3-8B")
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.workers < 1:
        parser.error("--pairs and --workers must be >= 1")

    # As `pearl plan` starts its runs: with the compiled modules where this tree's are built.
    native = simulation_env().get("PEARL_NATIVE") == "1"
    with tempfile.TemporaryDirectory(prefix="pearl-sim-ab-") as tmp:
        base = Path(tmp) / "base"
        git = ["git", "-C", str(ROOT), "worktree"]
        added = subprocess.run(
            [*git, "add", "--detach", "--quiet", str(base), args.base],
            capture_output=True,
            text=True,
            check=False,
        )
        if added.returncode != 0:
            sys.exit(f"--base {args.base!r}: git could not check it out: {added.stderr.strip()}")
        try:
            envs = {"base": tree_env(base, native), "new": tree_env(ROOT, native)}
            runs: dict[str, list[dict]] = {"base": [], "new": []}
            for side in order(args.pairs):
                tree = base if side == "base" else ROOT
                r = one_run(tree, args.workers, args.model, envs[side])
                runs[side].append(r)
                print(
                    f"{side:4s}  {r['wall_s']:7.1f} s wall  {r['cpu_s']:7.1f} s CPU  "
                    f"{r['peak_mb']:6.0f} MB  {r['digest']}",
                    flush=True,
                )
        finally:
            subprocess.run([*git, "remove", "--force", str(base)], check=False)

    wall = {side: [r["wall_s"] for r in rs] for side, rs in runs.items()}
    ratios = [n / b for n, b in zip(wall["new"], wall["base"], strict=True)]
    print(
        f"{args.workers} workers, {args.pairs} pairs: base median {statistics.median(wall['base']):.1f} s, "
        f"new median {statistics.median(wall['new']):.1f} s; new/base per pair "
        + ", ".join(f"{x:.3f}" for x in ratios)
        + f" (median {statistics.median(ratios):.3f})"
    )
    for side, env in envs.items():
        added = {k: v for k, v in env.items() if os.environ.get(k) != v}
        print(f"{side}'s runs' environment: {added or 'unchanged'}")
    same, message = digest_verdict(runs)
    print(message)
    if not same:
        sys.exit(1)


def digest_verdict(runs: dict[str, list[dict]]) -> tuple[bool, str]:
    """Whether every run of both sides gave one digest, and the line that says so (or
    which digests each side gave)."""
    digests = {r["digest"] for rs in runs.values() for r in rs}
    if len(digests) == 1:
        return True, f"digest {digests.pop()} on every run"
    by_side = {side: sorted({r["digest"] for r in rs}) for side, rs in runs.items()}
    return False, f"DIGESTS DIFFER: {by_side}"


if __name__ == "__main__":
    main()
