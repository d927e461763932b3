"""The live SWE trace against the simulator's workload: per turn, what a live agent run
appended, generated and waited, next to the same quantities drawn from a profile.

    .venv/bin/pearl train -c configs/train_swe_agent.yaml run.run_name=swe   # mini-swe-agent
    .venv/bin/python benchmarks/swe_trace.py runs/swe [--profile swe]

The run folder's ``rollouts.jsonl`` holds every step's rollout (per trajectory and turn:
``[appended tokens, generated tokens, kept tokens, environment seconds]``, written by
``pearl.apps.train.metrics.rollout_shapes``). The profile's trajectories are drawn by the
simulator's own sampler (``pearl.workloads.agentic.generate_batch``). Compared, over every
step of the run and every trajectory drawn:

- turns per trajectory (model calls);
- first-turn prompt tokens (the whole prompt: shared prefix + task);
- new prompt tokens of each later turn (the observation the agent appended);
- generated tokens per turn;
- environment seconds per turn, over the turns another call follows: the profile's last
  turn waits nothing (its evaluation is ``reward_latency_s``), and a live episode's last
  ``env_s`` is the agent's time after its final answer, reported apart.

A later turn whose new tokens are at least its trajectory's first prompt is counted as a
re-prompt: the agent's call did not extend the conversation PEARL returned (an edited
history starts a new segment, ``pearl.agents.conversation``), so the whole prompt is new.
Prints one table (median, p10, p90, mean; live/profile ratio of the medians), writes
``results/swe_trace.json`` and draws live vs profile ECDFs in ``docs/figures/swe_trace.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pearl.workloads.agentic import generate_batch
from pearl.workloads.batch import RolloutBatch
from pearl.workloads.profiles import get_profile

ROOT = Path(__file__).resolve().parents[1]
QUANTITIES = {
    "turns": "turns per trajectory",
    "first_prompt_tokens": "first-turn prompt tokens",
    "observation_tokens": "new prompt tokens, later turns",
    "generated_tokens": "generated tokens per turn",
    "env_s": "environment s per turn",
}


def load_steps(folder: Path) -> list[dict]:
    """The run's ``rollouts.jsonl`` rows, one per step."""
    path = folder / "rollouts.jsonl"
    if not path.is_file():
        sys.exit(f"{path} not found: not a `pearl train` run folder (or no step finished yet)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def live_samples(steps: list[dict]) -> dict[str, list[float]]:
    """Every quantity of QUANTITIES over the run's trajectories, plus ``final_env_s`` (the
    agent's time after its last answer) and ``reprompts`` (later turns that resent it all);
    a trajectory without turns (its reset failed) is left out."""
    out: dict[str, list[float]] = {k: [] for k in (*QUANTITIES, "final_env_s", "reprompts")}
    for step in steps:
        for trajectory in step["trajectories"]:
            turns = trajectory["turns"]
            if not turns:
                continue
            first = turns[0][0]
            out["turns"].append(len(turns))
            out["first_prompt_tokens"].append(first)
            out["observation_tokens"] += [t[0] for t in turns[1:]]
            out["reprompts"] += [t[0] for t in turns[1:] if t[0] >= first]
            out["generated_tokens"] += [t[1] for t in turns]
            out["env_s"] += [t[3] for t in turns[:-1]]
            out["final_env_s"].append(turns[-1][3])
    return out


def profile_samples(batch: RolloutBatch) -> dict[str, list[float]]:
    """The same quantities over a batch the simulator's sampler drew from a profile."""
    out: dict[str, list[float]] = {k: [] for k in QUANTITIES}
    for group in batch.groups:
        for trajectory in group.trajectories:
            turns = trajectory.turns
            out["turns"].append(len(turns))
            out["first_prompt_tokens"].append(turns[0].observation_tokens)
            out["observation_tokens"] += [t.observation_tokens for t in turns[1:]]
            out["generated_tokens"] += [t.response_tokens for t in turns]
            out["env_s"] += [t.env_latency_s for t in turns[:-1]]
    return out


def summary(values: list[float]) -> dict[str, float | int | None]:
    """Count, median, p10, p90 and mean (None when there are no values)."""
    if not values:
        return {"count": 0, "median": None, "p10": None, "p90": None, "mean": None}
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    return {
        "count": len(values),
        "median": float(median),
        "p10": float(p10),
        "p90": float(p90),
        "mean": float(np.mean(values)),
    }


def compare(live: dict[str, list[float]], profile: dict[str, list[float]]) -> list[dict]:
    """One row per quantity: live and profile summaries and live/profile of the medians."""
    rows = []
    for key in QUANTITIES:
        a, b = summary(live[key]), summary(profile[key])
        ratio = a["median"] / b["median"] if a["median"] is not None and b["median"] else None
        rows.append({"quantity": key, "live": a, "profile": b, "median_ratio": ratio})
    return rows


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def print_table(rows: list[dict], profile: str) -> None:
    """The comparison as one table: a live and a profile line per quantity."""
    print(
        f"{'quantity':32} {'side':8} {'count':>6} {'median':>7} {'p10':>7} {'p90':>7} {'mean':>7}"
        f" {'live/profile':>12}"
    )
    for row in rows:
        for side, name in (("live", "live"), ("profile", profile)):
            s = row[side]
            ratio = _fmt(row["median_ratio"]) if side == "live" else ""
            label = QUANTITIES[row["quantity"]] if side == "live" else ""
            print(
                f"{label:32} {name:8} {s['count']:>6} {_fmt(s['median']):>7} {_fmt(s['p10']):>7}"
                f" {_fmt(s['p90']):>7} {_fmt(s['mean']):>7} {ratio:>12}"
            )


def draw(live: dict, profile: dict, profile_name: str, title: str, path: Path) -> None:
    """A row of panels, one per quantity: live and profile ECDFs on a log x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, len(QUANTITIES), figsize=(3.2 * len(QUANTITIES), 3.0))
    for ax, (key, label) in zip(axes, QUANTITIES.items(), strict=True):
        for values, name, color in ((live[key], "live", "C0"), (profile[key], profile_name, "C1")):
            x = np.sort([v for v in values if v > 0])  # log axis: zeros cannot be drawn
            if len(x):
                ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", color=color, label=name)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # narrow ranges: minor labels collide
        ax.set_title(label, fontsize=9)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction <= x")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a `pearl train` run folder")
    parser.add_argument("--profile", default="swe")
    parser.add_argument("--tasks", type=int, default=64, help="tasks drawn from the profile")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/swe_trace.json")
    parser.add_argument("--figure", default=str(ROOT / "docs" / "figures" / "swe_trace.png"))
    args = parser.parse_args()
    steps = load_steps(args.run)
    live = live_samples(steps)
    batch = generate_batch(get_profile(args.profile), num_tasks=args.tasks, seed=args.seed)
    profile = profile_samples(batch)
    rows = compare(live, profile)
    n_profile = len(profile["turns"])
    print(
        f"{args.run}: {len(steps)} steps, {len(live['turns'])} trajectories; profile "
        f"{args.profile}: {n_profile} trajectories (seed {args.seed})\n"
    )
    print_table(rows, args.profile)
    final = summary(live["final_env_s"])
    print(
        f"\nlive re-prompts (later turns resending the whole prompt): {len(live['reprompts'])}"
        f" of {len(live['observation_tokens'])}; seconds after the last answer: median "
        f"{_fmt(final['median'])}, p90 {_fmt(final['p90'])}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "run": str(args.run),
        "steps": len(steps),
        "profile": args.profile,
        "seed": args.seed,
        "profile_trajectories": n_profile,
        "rows": rows,
        "reprompts": len(live["reprompts"]),
        "final_env_s": final,
    }
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    title = f"{args.run.name} ({len(live['turns'])} trajectories) vs profile {args.profile}"
    draw(live, profile, args.profile, title, Path(args.figure))
    print(f"wrote {args.figure}")


if __name__ == "__main__":
    main()
