"""The simulator in the paper's workload regime: REGIME rows C2-C8, target vs simulated.

    .venv/bin/python benchmarks/regime.py                                  # configs/headline_paper.yaml
    .venv/bin/python benchmarks/regime.py --config configs/headline.yaml   # any rl config
    .venv/bin/python benchmarks/regime.py workload.profile=swe_thinking    # with overrides
    .venv/bin/python benchmarks/regime.py sim.cross_turn_reuse=none        # a switch
    .venv/bin/python benchmarks/regime.py sim.pd_decode_reuse=none         # SGLang's PD

Reads the workload profile, engine (``sim``) and cost profile (``cluster.profile``) of an
``kind: rl`` config, measures every characterization row of docs/regime.md with the
single-batch simulator (see ``pearl.apps.paper.regime``), prints target, simulated value and
ratio, and writes ``regime.json``: ``{"rows": [{"id": "C4", "target": ..., "sim": ...,
"ok": bool}, ...]}``. A row holds within 15% of its target (C8 is a bound). About a minute.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pearl.apps.paper.regime import RegimeSetting, measure
from pearl.config import load_simulate_config
from pearl.sim.build import build_cost_model, engine_config
from pearl.workloads.profiles import get_profile

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "headline_paper.yaml"))
    parser.add_argument("--out", default="results/regime.json")
    parser.add_argument("--seed", type=int, default=None, help="workload seed (config's)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args()
    cfg = load_simulate_config(args.config, args.overrides)
    cost = build_cost_model(cfg)
    setting = RegimeSetting(
        profile=get_profile(cfg.workload.profile),
        engine=engine_config(cfg.sim),
        constants=cost.constants,
        gpu=cfg.cluster.gpu,
        tp=cfg.cluster.tp,
        seed=cfg.workload.seed if args.seed is None else args.seed,
    )
    start = time.perf_counter()
    print(
        f"regime check: workload {setting.profile.name}, engine {cfg.sim.scheduling} "
        f"(cross-turn reuse {cfg.sim.cross_turn_reuse}, "
        f"PD decode reuse {cfg.sim.pd_decode_reuse}), "
        f"{cfg.cluster.gpu} TP{cfg.cluster.tp}, cost profile {cfg.cluster.profile or 'default'}"
    )
    rows = measure(setting, log=print)
    wall = time.perf_counter() - start
    print()
    print("| row | fact | target | sim | sim/target | within 15% |")
    print("|---|---|---:|---:|---:|:---:|")
    for r in rows:
        bound = "< " if r.upper_bound else ""
        print(
            f"| {r.id} | {r.fact} | {bound}{r.target:.4g} | {r.sim:.4g} | {r.ratio:.2f} | "
            f"{'yes' if r.ok else 'NO'} |"
        )
    held = sum(r.ok for r in rows)
    print(f"\n{held} of {len(rows)} rows hold; {wall:.0f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "config": args.config,
                "overrides": args.overrides,
                "workload": setting.profile.name,
                "scheduling": cfg.sim.scheduling,
                "cross_turn_reuse": cfg.sim.cross_turn_reuse,
                "pd_decode_reuse": cfg.sim.pd_decode_reuse,
                "rows": [r.to_dict() for r in rows],
                "wall_s": wall,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
