"""An SWE-agent training run, read back: every step trained, the endpoint's errors, and the
held-out success before and after, per task tier, with 95% intervals.

    .venv/bin/pearl train -c configs/train_swe_agent.yaml run.run_name=swe   # mini-swe-agent
    .venv/bin/python benchmarks/swe_agent.py runs/swe

Works for ``env.name: agent`` runs of ``pearl.agents.examples.mini_swe_agent`` and for
``env.name: swe`` runs: the held-out task ``i`` is seed ``split_seed("heldout", i)`` and
its tier is the one ``pearl.envs.swe_tasks.make_task`` gives that seed under the run's
``tier`` option. The baseline is the same weights before the first step, on the same tasks
(``eval`` events: ``task_successes`` / ``task_rewards``). Writes ``results/swe_agent.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import yaml

from pearl.apps.train.metrics import wilson_interval
from pearl.envs.base import split_seed
from pearl.envs.swe_tasks import TIERS, make_task


def tier_option(config: dict) -> int | None:
    """The ``tier`` the run's environment was given (None: drawn from each seed)."""
    options = config["env"].get("options") or {}
    if config["env"]["name"] == "agent":
        return (options.get("kwargs") or {}).get("tier")
    return options.get("tier")


def by_tier(evaluation: dict, tier: int | None) -> dict[int, dict]:
    """Successes, tasks, interval and mean reward per tier of one ``eval`` event."""
    wins, rewards = evaluation["task_successes"], evaluation["task_rewards"]
    groups: dict[int, list[int]] = {}
    for i in range(len(wins)):
        groups.setdefault(make_task(split_seed("heldout", i), tier).tier, []).append(i)
    out = {}
    for t in TIERS:
        tasks = groups.get(t, [])
        if not tasks:
            continue
        solved = sum(bool(wins[i]) for i in tasks)
        out[t] = {
            "tasks": len(tasks),
            "solved": solved,
            "ci95": wilson_interval(solved, len(tasks)),
            "mean_reward": statistics.fmean(rewards[i] for i in tasks),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished pearl train run folder")
    parser.add_argument("--out", type=Path, default=Path("results/swe_agent.json"))
    args = parser.parse_args()
    config = yaml.safe_load((args.run / "config.yaml").read_text())
    summary = json.loads((args.run / "summary.json").read_text())
    steps = [json.loads(x) for x in (args.run / "metrics.jsonl").read_text().splitlines()]
    events = [json.loads(x) for x in (args.run / "events.jsonl").read_text().splitlines()]
    evals = {e["when"]: e for e in events if e["kind"] == "eval" and "task_successes" in e}
    if set(evals) != {"before", "after"}:
        sys.exit(f"{args.run}: no per-task held-out evaluation before and after (run.eval_tasks)")
    tier = tier_option(config)
    tiers = {when: by_tier(evals[when], tier) for when in ("before", "after")}

    print(f"run {args.run} ({config['env']['name']}, tier {tier if tier is not None else 'mix'})")
    # Every trajectory reaches the trainer unless its environment failed (env_failures);
    # its samples (one per segment) with no advantage (a group of equal rewards) score no
    # tokens: scored_tokens is what the update learned from.
    print("step  trajectories  env_failures  samples_no_advantage  scored_tokens  reward  success")
    for row in steps:
        print(
            f"{row['step']:>4}  {row['trajectories']:>12}  {row['env_failures']:>12}"
            f"  {row.get('skipped_trajectories', 0):>20}  {row['scored_tokens']:>13}"
            f"  {row['reward_mean']:>6.3f}  {100 * row['success_rate']:>6.1f}%  {row['stop_reasons']}"
        )
    endpoint = summary.get("agent_endpoint", {})
    print(f"endpoint: {endpoint.get('calls', 0)} calls, {endpoint.get('errors', 0)} errors")
    print("\nheld-out success per tier, before -> after (95% interval)")
    for t in TIERS:
        if t not in tiers["before"]:
            continue
        b, a = tiers["before"][t], tiers["after"][t]
        print(
            f"tier {t}: {b['solved']}/{b['tasks']} [{100 * b['ci95'][0]:.0f}-{100 * b['ci95'][1]:.0f}%]"
            f" -> {a['solved']}/{a['tasks']} [{100 * a['ci95'][0]:.0f}-{100 * a['ci95'][1]:.0f}%]"
            f"  mean reward {b['mean_reward']:.3f} -> {a['mean_reward']:.3f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "run": str(args.run),
        "env": config["env"],
        "rollout": config["rollout"],
        "steps": [
            {
                k: row[k]
                for k in ("step", "trajectories", "reward_mean", "success_rate", "env_failures")
            }
            | {"samples_no_advantage": row.get("skipped_trajectories", 0)}
            | {"scored_tokens": row["scored_tokens"]}
            | {"stop_reasons": row["stop_reasons"], "rollout_s": row["rollout_s"]}
            for row in steps
        ],
        "agent_endpoint": endpoint,
        "heldout_by_tier": tiers,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
