"""The paper's ablation ladder (Fig 7) on fixed dedicated rollout pools.

Every rung runs on the same fixed pool of dedicated rollout GPUs (no availability trace),
beside the same training GPUs, and is compared with ROLL on that pool (colocated, no
borrowing):

- ``A``: forced disaggregation, the decision engine's best P:D split (``disaggregated``);
- ``B``: A plus borrowing the training GPUs after every update (ungated toggle);
- ``C``: A plus the benefit gate (the paper's PEARL at this point of the ladder);
- ``pearl``: our PEARL as it runs in the headline (the engine may also keep colocation).
"""

from __future__ import annotations

from collections.abc import Callable

from pearl.apps.experiment import run_summary
from pearl.apps.sim_build import build_setting
from pearl.config.simulate import RLExperimentConfig
from pearl.control.policies import Borrowing, PDMode, Policy, Pool
from pearl.errors import RunsLost
from pearl.processes.env import simulation_env
from pearl.processes.pool import run_in_processes
from pearl.sim.policy_run import run_policy

RUNGS: dict[str, tuple[PDMode, Borrowing, str]] = {
    "roll": (PDMode.COLOCATED, Borrowing.OFF, "ROLL: colocated, no borrowing (the baseline)"),
    "A": (PDMode.DISAGGREGATED, Borrowing.OFF, "forced disaggregation, best P:D split"),
    "B": (PDMode.DISAGGREGATED, Borrowing.UNGATED, "A + borrowing after every update"),
    "C": (PDMode.DISAGGREGATED, Borrowing.GATED, "A + the benefit gate"),
    "pearl": (PDMode.ADAPTIVE, Borrowing.GATED, "adaptive PD + the benefit gate"),
}

# The paper's Fig 7 (throughput relative to ROLL on the same pool, %), for comparison only:
# nothing in the simulator is chosen from these. 8-16 GPUs are given as [low, high].
PAPER_FIG7_PCT: dict[str, dict[str, dict[str, float | list[float]]]] = {
    "Qwen3-8B": {
        "4": {"A": -20.6, "B": 93.6, "C": 92.3},
        "8-16": {"A": [12.8, 15.3], "B": [16.2, 26.5], "C": [17.9, 26.5]},
    },
    "Qwen3-30B-A3B": {
        "4": {"A": -30.9, "B": 118.3, "C": 129.5},
        "8-16": {"A": [7.8, 8.9], "B": [9.4, 26.2], "C": [9.2, 27.5]},
    },
}


def rung_policy(rung: str, gpus: int) -> Policy:
    """The ladder's policy ``rung`` on a fixed pool of ``gpus`` dedicated rollout GPUs."""
    if rung not in RUNGS:
        raise ValueError(f"unknown rung {rung!r}; valid: {', '.join(RUNGS)}")
    pd, borrowing, description = RUNGS[rung]
    return Policy(rung, Pool.FIXED, pd, borrowing, fixed_rollout_gpus=gpus, description=description)


def run_rung(cfg_json: dict, rung: str, gpus: int) -> dict:
    """One rung on one pool size; plain data so it crosses process boundaries."""
    cfg = RLExperimentConfig.model_validate(cfg_json)
    result = run_policy(build_setting(cfg), rung_policy(rung, gpus))
    return run_summary(rung, f"{gpus} GPUs", result, float(gpus))


def run_ladder(
    cfg: RLExperimentConfig,
    pools: list[int],
    rungs: list[str],
    processes: int = 2,
    log: Callable[[str], None] = print,
) -> list[dict]:
    """Every rung on every pool size, ``processes`` at a time; results in (pool, rung) order."""
    tp = cfg.cluster.tp
    for gpus in pools:
        if gpus < 2 * tp or gpus % tp:
            raise ValueError(
                f"a rollout pool of {gpus} GPUs: needs a multiple of TP={tp} and at least "
                f"2 workers ({2 * tp} GPUs) for a P:D split"
            )
    cfg_json = cfg.model_dump(mode="json")
    jobs = [((rung, gpus), (cfg_json, rung, gpus)) for gpus in pools for rung in rungs]
    done: dict[tuple[str, str], dict] = {}
    lost: dict[tuple[str, int], str] = {}

    def finished(key, r: dict) -> None:
        done[(r["policy"], r["segment"])] = r
        log(
            f"{r['segment']:>8} {r['policy']:<6} {r['throughput']:9.1f} tok/s "
            f"({r['steps']} steps, {r['wall_s']:.0f} s wall)"
        )

    run_in_processes(
        run_rung,
        jobs,
        processes,
        finished,
        lambda key, why: lost.__setitem__(key, why),
        env=simulation_env(),
    )
    if lost:
        which = "; ".join(f"{rung} on {gpus} GPUs: {why}" for (rung, gpus), why in lost.items())
        raise RunsLost(f"{len(lost)} of {len(jobs)} ladder runs lost ({which})")
    return [done[(rung, f"{gpus} GPUs")] for gpus in pools for rung in rungs]


def relative_to_roll(runs: list[dict]) -> dict[str, dict[str, float]]:
    """``{pool: {rung: throughput / ROLL's on that pool - 1 (%)}}``."""
    out: dict[str, dict[str, float]] = {}
    for r in runs:
        roll = next(x for x in runs if x["segment"] == r["segment"] and x["policy"] == "roll")
        if roll["throughput"] > 0:
            out.setdefault(r["segment"], {})[r["policy"]] = 100 * (
                r["throughput"] / roll["throughput"] - 1
            )
    return out
