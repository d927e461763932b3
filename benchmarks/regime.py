"""The simulator in the paper's workload regime: REGIME rows C2-C8, target vs simulated.

    .venv/bin/python benchmarks/regime.py                                  # configs/headline_paper.yaml
    .venv/bin/python benchmarks/regime.py --config configs/headline.yaml   # any rl config
    .venv/bin/python benchmarks/regime.py workload.profile=swe_thinking    # with overrides
    .venv/bin/python benchmarks/regime.py sim.cross_turn_reuse=none        # a switch
    .venv/bin/python benchmarks/regime.py sim.pd_decode_reuse=none         # SGLang's PD
    .venv/bin/python benchmarks/regime.py --constant allreduce_latency_s=2.5e-5  # a price
    .venv/bin/python benchmarks/regime.py sim.cross_turn_reuse=none --refit 40 55 70 85

Reads the workload profile, engine (``sim``) and cost profile (``cluster.profile``) of an
``kind: rl`` config, measures every characterization row of docs/regime.md with the
single-batch simulator (see ``pearl.apps.paper.regime``), prints target, simulated value and
ratio, and writes ``regime.json``: ``{"rows": [{"id": "C4", "target": ..., "sim": ...,
"ok": bool}, ...]}``. A row holds within 15% of its target (C8 is a bound). About a minute.

``--constant NAME=VALUE`` overrides one of the cost profile's constants (``CostConstants``);
``--turns-median`` / ``--env-scale`` set ``swe_paper``'s two fitted values; ``--refit
MEDIAN ...`` refits them under the setting first (C5 -> environment scale by bisection at
each median, C4 -> the median whose 16 -> 32 GPU change is nearest -19.2%; a few minutes
per median) and measures every row at the fit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from pearl.apps.paper.regime import RegimeSetting, fit_c4_c5, measure
from pearl.apps.sim_build import build_cost_model, engine_config
from pearl.config.simulate import load_simulate_config
from pearl.errors import ConfigError
from pearl.sim.costmodel import CostConstants
from pearl.workloads.profiles import (
    SWE_PAPER_ENV_SCALE,
    SWE_PAPER_TURNS_MEDIAN,
    get_profile,
    swe_paper_profile,
)

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "headline_paper.yaml"))
    parser.add_argument("--out", default="results/regime.json")
    parser.add_argument("--seed", type=int, default=None, help="workload seed (config's)")
    parser.add_argument(
        "--constant",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a cost constant (CostConstants field), repeatable",
    )
    parser.add_argument("--turns-median", type=float, default=None, help="swe_paper's (C4)")
    parser.add_argument("--env-scale", type=float, default=None, help="swe_paper's (C5)")
    parser.add_argument(
        "--refit",
        type=float,
        nargs="+",
        default=None,
        metavar="MEDIAN",
        help="refit swe_paper's turns median (among these) and environment scale first",
    )
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args()
    cfg = load_simulate_config(args.config, args.overrides)
    cost = build_cost_model(cfg)
    constants = with_constants(cost.constants, args.constant)
    fitted = args.turns_median, args.env_scale, args.refit
    if any(v is not None for v in fitted) and cfg.workload.profile != "swe_paper":
        parser.error("--turns-median, --env-scale and --refit apply to workload swe_paper only")
    median = SWE_PAPER_TURNS_MEDIAN if args.turns_median is None else args.turns_median
    scale = SWE_PAPER_ENV_SCALE if args.env_scale is None else args.env_scale
    profile = get_profile(cfg.workload.profile)
    if cfg.workload.profile == "swe_paper":
        profile = swe_paper_profile(median, scale)
    setting = RegimeSetting(
        profile=profile,
        engine=engine_config(cfg.sim),
        constants=constants,
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
    fit = None
    if args.refit:
        print(f"refitting swe_paper's turns median (C4) and environment scale (C5): {args.refit}")
        fit = fit_c4_c5(setting, swe_paper_profile, tuple(args.refit), log=print)
        median, scale = fit.turns_median, fit.env_scale
        constants = dataclasses.replace(constants, train_mfu=fit.train_mfu)
        setting = dataclasses.replace(
            setting, profile=swe_paper_profile(median, scale), constants=constants
        )
        print(
            f"fit: turns median {median:g}, env scale {scale:.4f}, trainer MFU {fit.train_mfu:.4f}"
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
                "constants": args.constant,
                "turns_median": median if cfg.workload.profile == "swe_paper" else None,
                "env_scale": scale if cfg.workload.profile == "swe_paper" else None,
                "train_mfu": setting.constants.train_mfu,
                "refit": None
                if fit is None
                else [
                    {"turns_median": m, "env_scale": e, "change_16_32": c} for m, e, c in fit.tried
                ],
                "rows": [r.to_dict() for r in rows],
                "wall_s": wall,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


def with_constants(constants: CostConstants, assignments: list[str]) -> CostConstants:
    """``constants`` with ``NAME=VALUE`` overrides (a clear error for a bad one)."""
    names = {f.name for f in dataclasses.fields(CostConstants)}
    changes = {}
    for item in assignments:
        name, sep, value = item.partition("=")
        if not sep or name not in names:
            raise ConfigError(
                f"--constant {item!r}: expected NAME=VALUE with NAME one of {sorted(names)}"
            )
        try:
            changes[name] = float(value)
        except ValueError:
            raise ConfigError(f"--constant {item!r}: {value!r} is not a number") from None
    return dataclasses.replace(constants, **changes)


if __name__ == "__main__":
    main()
