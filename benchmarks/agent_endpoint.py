"""An unmodified OpenAI-SDK agent beside the built-in environment, same task, same seeds.

    .venv/bin/python benchmarks/agent_endpoint.py                      # the default job, twice
    .venv/bin/python benchmarks/agent_endpoint.py run.steps=3 run.eval_tasks=16   # a quick look
    .venv/bin/python benchmarks/agent_endpoint.py --tool-format tag    # <calc> in text, no tools
    .venv/bin/python benchmarks/agent_endpoint.py --chaos 20 --sides agent   # worker kills

Runs ``pearl train`` twice in one invocation: the built-in calculator environment, then the
calculator agent on the official ``openai`` SDK (``pearl.agents.examples.calculator:solve``)
through the OpenAI-compatible endpoint, the same task, prompts, tool and rewards (token for
token, ``tests/agents``), with the same config and seeds. ``--tool-format json`` (default)
offers the calculator as a JSON-schema tool; ``tag`` has the model write ``<calc>`` in its
reply (the built-in environment's default, and the variant SmolLM2-135M learns). Reports for each: held-out success before and after with 95% Wilson
intervals, and rollout throughput in trajectories per second (the steps' trajectories
over their rollout seconds; evaluation excluded). Targets (issue 34): the agent trains in
the default job's budget; its throughput within 15% of the built-in environment's; under
``--chaos S`` (``run.chaos_kill_every_s``, agent run only) no environment failure and
every step's trajectories all there. Writes ``results/agent_endpoint_<format>.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pearl.apps.train.run import TrainRun
from pearl.config.train import load_train_config

SIDES = ("built-in", "agent")


def side_overrides(name: str, tool_format: str) -> list[str]:
    if name == "built-in":
        return ["env.name=calculator", f"env.options.tool_format={tool_format}"]
    return [
        "env.name=agent",
        "env.options.agent=pearl.agents.examples.calculator:solve",
        f"env.options.kwargs.tool_format={tool_format}",
    ]


def run_side(name: str, tool_format: str, overrides: list[str], chaos: float | None) -> dict:
    extra = side_overrides(name, tool_format)
    extra.append(f"run.run_name=agent-endpoint-{name}-{tool_format}-{int(time.time())}")
    if chaos and name == "agent":
        extra.append(f"run.chaos_kill_every_s={chaos}")
    cfg = load_train_config(None, overrides + extra)
    t0 = time.monotonic()
    out = TrainRun(cfg).run()
    wall = time.monotonic() - t0
    run_dir = Path(out["run_dir"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rollout_s = sum(r["rollout_s"] for r in rows)
    trajectories = sum(r["trajectories"] for r in rows)
    expected = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    return {
        "run_dir": str(run_dir),
        "before": out["before"],
        "after": out["after"],
        "wall_s": wall,
        "trajectories": trajectories,
        "rollout_s": rollout_s,
        "trajectories_per_s": trajectories / rollout_s if rollout_s else 0.0,
        "env_failures": sum(r["env_failures"] for r in rows),
        "steps_with_every_trajectory": sum(r["trajectories"] == expected for r in rows),
        "steps": len(rows),
        "tool_calls": sum(r["tool_calls"] for r in rows),
        # the errors agents were answered with (none expected, chaos or not)
        "endpoint": out.get("agent_endpoint"),
    }


def pct(row: dict) -> str:
    lo, hi = row["ci95"]
    return f"{100 * row['success_rate']:5.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] (n={row['tasks']})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chaos", type=float, default=None, help="kill a worker every S s")
    parser.add_argument("--tool-format", choices=("json", "tag"), default="json")
    parser.add_argument(
        "--sides", default=",".join(SIDES), help="which runs, of " + ",".join(SIDES)
    )
    parser.add_argument("--out", default=None, help="default results/agent_endpoint_<format>.json")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (both runs)")
    args = parser.parse_args()
    sides = [s for s in args.sides.split(",") if s]
    if not sides or set(sides) - set(SIDES):
        parser.error(f"--sides takes a comma-separated subset of {','.join(SIDES)}")
    out = args.out or f"results/agent_endpoint_{args.tool_format}.json"
    results = {n: run_side(n, args.tool_format, args.overrides, args.chaos) for n in sides}
    print()
    for name, r in results.items():
        print(f"{name:9s} held-out before {pct(r['before'])}  after {pct(r['after'])}")
        print(
            f"{'':9s} {r['trajectories']} trajectories in {r['rollout_s']:.1f} s of rollout: "
            f"{r['trajectories_per_s']:.3f}/s; tool calls {r['tool_calls']}; env failures "
            f"{r['env_failures']}; steps with every trajectory {r['steps_with_every_trajectory']}"
            f"/{r['steps']}; wall {r['wall_s'] / 60:.1f} min"
        )
        if r["endpoint"] is not None:
            e = r["endpoint"]
            print(f"{'':9s} endpoint: {e['calls']} calls answered, {e['errors']} errors")
    ratio = None
    if len(results) == 2:
        ratio = results["agent"]["trajectories_per_s"] / results["built-in"]["trajectories_per_s"]
        print(f"agent / built-in throughput: {ratio:.3f} (goal >= 0.85)")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps(
            {
                "overrides": args.overrides,
                "tool_format": args.tool_format,
                "chaos_kill_every_s": args.chaos,
                "throughput_ratio": ratio,
                **results,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
