"""Does live training work? Held-out success before and after a ``pearl train`` run.

    .venv/bin/python benchmarks/train_reward.py                       # configs/train_smollm.yaml
    .venv/bin/python benchmarks/train_reward.py run.steps=20 run.eval_tasks=64   # shorter
    .venv/bin/python benchmarks/train_reward.py --config "" run.eval_tasks=64    # the default job

Runs ``pearl train`` (SmolLM2-135M-Instruct, calculator task, asynchronous GRPO, Ray
actors) and reports the success rate on held-out task seeds (never trained on) before the
first step and after the last, each with its 95% Wilson interval, plus the reward curve
(per-step training reward and success) and where the time went. The baseline is the same
model before training, measured in the same run on the same held-out tasks. Target (issue
11): after - before >= 15 points, intervals not overlapping, within 45 minutes. Writes
``results/train_reward.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from pearl.apps.train.run import TrainRun
from pearl.config.train import load_train_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", default="configs/train_smollm.yaml", help='"" for the embedded default job'
    )
    parser.add_argument("--out", default="results/train_reward.json")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args()
    cfg = load_train_config(args.config or None, args.overrides)
    t0 = time.monotonic()
    out = TrainRun(cfg).run()
    wall = time.monotonic() - t0
    run_dir = Path(out["run_dir"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    before, after = out["before"], out["after"]
    gain = after["success_rate"] - before["success_rate"]
    separated = after["ci95"][0] > before["ci95"][1]
    print()
    print(
        f"held-out success  before {100 * before['success_rate']:5.1f}%  "
        f"[{100 * before['ci95'][0]:.1f}, {100 * before['ci95'][1]:.1f}]  (n={before['tasks']})"
    )
    print(
        f"                  after  {100 * after['success_rate']:5.1f}%  "
        f"[{100 * after['ci95'][0]:.1f}, {100 * after['ci95'][1]:.1f}]  (n={after['tasks']})"
    )
    print(
        f"gain {100 * gain:+.1f} points (target +15), intervals "
        f"{'do not overlap' if separated else 'overlap'}; wall {wall / 60:.1f} min (target 45)"
    )
    print("reward curve (step: train reward / success):")
    for r in rows:
        print(
            f"  {r['step']:3d}: {r['reward_mean']:.3f} / {100 * r['success_rate']:5.1f}%  "
            f"(rollout {r['rollout_s']:.1f}s, train {r['train_s']:.1f}s)"
        )
    # What the control plane did (borrow / give_back / expand / shrink / decision ...).
    kinds = [json.loads(line)["kind"] for line in (run_dir / "events.jsonl").open()]
    control = dict(Counter(k for k in kinds if k not in ("eval", "placed", "start")))
    print("control-plane events:", ", ".join(f"{k} {n}" for k, n in sorted(control.items())))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "config": cfg.model_dump(mode="json"),
                "run_dir": str(run_dir),
                "before": before,
                "after": after,
                "gain": gain,
                "intervals_separated": separated,
                "wall_s": wall,
                "steps": rows,
                "events": control,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
