"""``pearl plan``: which rollout pool to reserve, which policy to run, and what a step costs.

Every policy of the config runs on every availability trace (``elastic.segments``, or
traces drawn from a spot-market model, ``plan.spot``) for every reserved pool size and TP
degree of ``plan``; each run is a simulated RL run (``pearl.apps.experiment.run_one``).
A configuration (policy, reserved GPUs, TP) is priced from its runs: the reserved pool and
the training GPUs at ``plan.price_reserved`` for the whole run, the preemptible GPUs it
held at ``plan.price_preemptible`` (a fixed larger pool, as ROLL-Large keeps, at the
reserved price), against the tokens it trained. The frontier is the configurations no
other beats on both trained tokens per second and cost per million trained tokens; the
recommendation is the cheapest per trained token, with its margin to the runner-up, and
the two are re-run on ``plan.check_seeds`` other workload seeds to show whether the
ranking holds. A policy that never reads the trace (a reserved pool: ``roll``) is
simulated once per configuration and seed, its run standing for every trace. Each finished
run is kept in ``runs/`` at once; ``--resume`` runs only what is missing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from pearl.apps.experiment import load_segment_or_csv, run_one
from pearl.config.loading import dump_config, load_config
from pearl.config.plan import PlanConfig
from pearl.control.policies import Borrowing, PDMode, Pool, get_policy
from pearl.errors import ConfigError, RunsLost, RunStopped
from pearl.live.ray_pool import connect, run_on_ray
from pearl.processes.env import simulation_env
from pearl.processes.pool import run_in_processes, sigterm_as_interrupt
from pearl.report.figures import plan_figure, save
from pearl.report.html import Section, write_report
from pearl.report.progress import Progress
from pearl.report.run_folder import default_run_name
from pearl.workloads.availability import SyntheticAvailability, synthetic_availability

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class Point:
    """One configuration of the grid."""

    policy: str
    reserved: int
    tp: int

    @property
    def label(self) -> str:
        return f"{self.policy} r{self.reserved} tp{self.tp}"


@dataclass(slots=True)
class PlanOutcome:
    run_dir: str
    rows: list[dict]
    table: str
    recommendation: str


def grid(cfg: PlanConfig) -> tuple[list[Point], list[str]]:
    """The configurations to run, and a note for each (reserved, TP) pair left out."""
    points, skipped = [], []
    for tp in cfg.plan.tp:
        for reserved in cfg.plan.reserved_gpus:
            if reserved % tp or cfg.cluster.training_gpus % tp:
                skipped.append(
                    f"reserved {reserved} at TP{tp}: the reserved pool and the "
                    f"{cfg.cluster.training_gpus} training GPUs must be multiples of the TP"
                )
                continue
            points += [Point(p, reserved, tp) for p in cfg.policies]
    if not points:
        raise ConfigError("plan: no (reserved_gpus, tp) pair is valid; " + "; ".join(skipped))
    return points, skipped


def availability_traces(cfg: PlanConfig, folder: Path) -> list[str]:
    """The traces every configuration runs on: ``elastic.segments``, or ``plan.spot``'s
    random traces written as CSV files in the run folder."""
    spot = cfg.plan.spot
    if spot is None:
        return list(cfg.elastic.segments)

    market = SyntheticAvailability(
        duration_s=spot.duration_s,
        max_available=spot.max_available,
        mean_change_interval_s=3600.0 / spot.changes_per_hour,
    )
    out = []
    (folder / "spot").mkdir(parents=True, exist_ok=True)
    for seed in range(spot.traces):
        trace = synthetic_availability(market, seed)
        path = folder / "spot" / f"spot{seed}.csv"
        lines = ["time_s,available"] + [
            f"{t:g},{v}" for t, v in zip(trace.times_s, trace.values, strict=True)
        ]
        if trace.end_s > trace.times_s[-1]:
            lines.append(f"{trace.end_s:g},{trace.values[-1]}")
        path.write_text("\n".join(lines) + "\n")
        out.append(str(path))
    return out


def _job_config(cfg: PlanConfig, point: Point, seed: int) -> dict:
    data = cfg.model_dump(mode="json")
    data["kind"] = "rl"
    data.pop("plan")
    data["cluster"].update(reserved_gpus=point.reserved, tp=point.tp)
    data["workload"]["seed"] = seed
    data["policies"] = [point.policy]
    return data


def _key(point: Point, segment: str, seed: int) -> str:
    name = Path(segment).stem if segment.endswith(".csv") else segment
    return f"{point.policy}@r{point.reserved}-tp{point.tp}@{name}@seed{seed}"


def same_run(result: dict, source: str, segment: str, scale: int = 1) -> dict:
    """The run of a policy that never reads the trace (``Policy.reads_trace``) on
    ``segment``: ``result``, its run on another trace, with that trace's name and mean;
    ``same_run_as`` names the run, and ``wall_s`` is 0 (nothing was simulated)."""
    return {
        **result,
        "segment": segment,
        "trace_mean_gpus": load_segment_or_csv(segment, scale).mean(),
        "wall_s": 0.0,
        "same_run_as": source,
    }


def price(run: dict, point: Point, cfg: PlanConfig) -> dict:
    """A run's trained tokens, GPU-hours and cost (whole counted window)."""
    counted = [row for row in run["rows"] if row.get("counted", True)]
    elapsed = max((row["time_s"] for row in counted), default=0.0)
    trained = sum(row["performance/train_tokens"] for row in counted)
    extra = 0.0  # GPU-seconds beyond the reserved pool the policy held
    levels = run["rollout_gpus"]
    for k, (t, gpus) in enumerate(levels):
        end = levels[k + 1][0] if k + 1 < len(levels) else elapsed
        lo, hi = min(t, elapsed), min(end, elapsed)
        extra += max(0, gpus - point.reserved) * max(0.0, hi - lo)
    fixed_pool = get_policy(point.policy).pool is Pool.FIXED
    extra_price = cfg.plan.price_reserved if fixed_pool else cfg.plan.price_preemptible
    hours = elapsed / 3600
    owned = point.reserved + cfg.cluster.training_gpus
    cost = owned * hours * cfg.plan.price_reserved + extra / 3600 * extra_price
    c = run["counters"]
    return {
        "elapsed_s": elapsed,
        "trained_tokens": trained,
        "cost": cost,
        "extra_gpu_s": extra,
        "turns_cut": c.get("turns_cut_by_shrinks", 0),
        "tokens_discarded": c.get("tokens_discarded", 0),
    }


def summarize(point: Point, priced: list[dict]) -> dict:
    """One configuration over its traces: tokens per second, cost per million trained
    tokens (total cost over total tokens) and preemption losses per hour."""
    seconds = sum(p["elapsed_s"] for p in priced)
    tokens = sum(p["trained_tokens"] for p in priced)
    cost = sum(p["cost"] for p in priced)
    hours = seconds / 3600 if seconds else float("nan")
    return {
        "policy": point.policy,
        "reserved_gpus": point.reserved,
        "tp": point.tp,
        "runs": len(priced),
        "trained_tokens_per_s": tokens / seconds if seconds else 0.0,
        "cost_per_hour": cost / hours if seconds else float("nan"),
        "cost_per_million_tokens": cost / tokens * 1e6 if tokens else float("inf"),
        "preemptible_gpus_held": sum(p["extra_gpu_s"] for p in priced) / seconds
        if seconds
        else 0.0,
        "turns_cut_per_hour": sum(p["turns_cut"] for p in priced) / hours if seconds else 0.0,
        "tokens_discarded_per_hour": sum(p["tokens_discarded"] for p in priced) / hours
        if seconds
        else 0.0,
    }


def mark_frontier(rows: list[dict]) -> None:
    """``frontier``: no other configuration trains faster at no higher cost per token."""
    for r in rows:
        r["frontier"] = not any(
            o is not r
            and o["trained_tokens_per_s"] >= r["trained_tokens_per_s"]
            and o["cost_per_million_tokens"] <= r["cost_per_million_tokens"]
            and (
                o["trained_tokens_per_s"] > r["trained_tokens_per_s"]
                or o["cost_per_million_tokens"] < r["cost_per_million_tokens"]
            )
            for o in rows
        )


def ranked(rows: list[dict]) -> list[dict]:
    """Cheapest per trained token first; ties to the faster."""
    return sorted(rows, key=lambda r: (r["cost_per_million_tokens"], -r["trained_tokens_per_s"]))


def plan_table(rows: list[dict], currency: str) -> str:
    lines = [
        f"| policy | reserved GPUs | TP | trained tok/s | {currency}/h | {currency} per M trained "
        "tokens | preemptible GPUs held | turns cut by preemption /h | tokens discarded /h "
        "| frontier |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in ranked(rows):
        lines.append(
            f"| {r['policy']} | {r['reserved_gpus']} | {r['tp']} | "
            f"{r['trained_tokens_per_s']:,.0f} | {r['cost_per_hour']:,.2f} | "
            f"{r['cost_per_million_tokens']:,.3f} | {r['preemptible_gpus_held']:.1f} | "
            f"{r['turns_cut_per_hour']:.1f} | {r['tokens_discarded_per_hour']:,.0f} | "
            f"{'yes' if r['frontier'] else ''} |"
        )
    return "\n".join(lines)


def _open_folder(cfg: PlanConfig, resume: str | None) -> tuple[PlanConfig, Path]:
    if resume is not None:
        folder = Path(resume)
        if not (folder / "config.yaml").is_file():
            raise ConfigError(f"--resume {resume}: not a pearl plan folder (no config.yaml)")
        return load_config(PlanConfig, folder / "config.yaml"), folder
    folder = Path(cfg.logger.run_dir) / (cfg.logger.run_name or default_run_name("plan-"))
    if (folder / "config.yaml").exists():
        raise ConfigError(
            f"{folder} already holds a plan; continue it with --resume {folder}, or choose "
            "another logger.run_name"
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(dump_config(cfg))
    return cfg, folder


def expected_work(point: Point) -> tuple[int, int]:
    """A sort key putting the longer simulated runs first: a policy that follows the
    preemptible GPUs, splits prefill from decode and borrows training GPUs simulates more
    events (the 30B plan: `roll` ~8 s a run, `rlboost` ~32, `pearl` ~60), and a larger
    pool more tokens."""
    p = get_policy(point.policy)
    mechanisms = (
        (p.pool is Pool.ELASTIC)
        + (p.pd is not PDMode.COLOCATED)
        + (p.borrowing is not Borrowing.OFF)
    )
    return -mechanisms, -point.reserved


class GridRunner:
    """Runs a plan's jobs (configuration, trace, seed) and keeps each finished run in
    ``runs/`` at once; what is there already is read, not run again. The runs go to local
    processes (``processes``) or, with ``plan.ray_address``, to Ray tasks on that cluster."""

    def __init__(self, cfg: PlanConfig, folder: Path, traces: list[str], log) -> None:
        self.cfg, self.folder, self.traces, self.log = cfg, folder, traces, log
        self.kept = folder / "runs"
        self.kept.mkdir(exist_ok=True)
        self.kept_before = len(list(self.kept.glob("*.json")))
        self.runs: dict[str, dict] = {}
        self.lost: dict[str, str] = {}
        self._copies: dict[str, list[tuple[str, str]]] = {}

    def keep(self, key: str, result: dict) -> None:
        partial = self.kept / f"{key}.part"
        partial.write_text(json.dumps(result, sort_keys=True) + "\n")
        partial.replace(self.kept / f"{key}.json")
        self.runs[key] = result

    def _to_run(self, jobs: list[tuple[Point, str, int]]) -> list[tuple[str, tuple]]:
        """The jobs not kept yet, longest first (so the last process is not left alone
        with a long one). A policy that never reads the trace (a reserved pool) runs once,
        on the first trace; its run on every other trace is a copy (``_copies``)."""
        todo = []
        for point, segment, s in sorted(jobs, key=lambda job: expected_work(job[0])):
            key = _key(point, segment, s)
            path = self.kept / f"{key}.json"
            reads = get_policy(point.policy).reads_trace
            source = key if reads else _key(point, self.traces[0], s)
            if path.is_file():
                self.runs[key] = json.loads(path.read_text())
            elif source != key:
                self._copies.setdefault(source, []).append((key, segment))
            else:
                todo.append((key, (_job_config(self.cfg, point, s), point.policy, segment)))
        for source in [k for k in self._copies if k in self.runs]:  # kept before
            self._copy_runs(source)
        return todo

    def _copy_runs(self, source: str) -> None:
        for key, segment in self._copies.pop(source, []):
            scale = self.cfg.elastic.scale
            self.keep(key, same_run(self.runs[source], source, segment, scale))

    def run_all(self, jobs: list[tuple[Point, str, int]], what: str) -> None:
        """Run every job of ``jobs`` not kept yet; raises ``RunsLost`` (the others kept) if
        a run's process or node died, ``RunStopped`` on Ctrl-C or SIGTERM."""
        todo = self._to_run(jobs)
        if not todo:
            return
        address = self.cfg.plan.ray_address
        where = f"Ray tasks on {address}" if address else f"{self.cfg.processes} processes"
        self.log(
            f"{what}: {len(todo)} runs ({len(jobs) - len(todo)} kept or the same run on "
            f"another trace) in {where}"
        )
        with Progress(len(todo), what) as bar:

            def finished(key, result: dict) -> None:
                self.keep(key, result)
                self._copy_runs(key)
                bar.advance(f"{key}: {result['throughput']:,.0f} tok/s")

            def died(key, why: str) -> None:
                self.lost[key] = why
                bar.advance(f"{key} lost: {why}")

            try:
                with sigterm_as_interrupt():
                    self._launch(todo, finished, died)
            except KeyboardInterrupt:
                for partial in self.kept.glob("*.part"):  # cut mid-write: not a finished run
                    partial.unlink()
                raise RunStopped(
                    f"interrupted: {len(list(self.kept.glob('*.json')))} runs are kept in "
                    f"{self.kept}; pearl plan --resume {self.folder} runs the rest"
                ) from None
        if self.lost:
            raise RunsLost(
                f"{what}: {len(self.lost)} runs lost "
                f"({'; '.join(f'{k}: {w}' for k, w in self.lost.items())}); the finished "
                f"ones are kept: pearl plan --resume {self.folder} runs the rest"
            )

    def _launch(self, todo, finished, died) -> None:
        address = self.cfg.plan.ray_address
        env = simulation_env()
        if address is None:
            run_in_processes(run_one, todo, self.cfg.processes, finished, died, env=env)
            return

        connect(address)
        run_on_ray(run_one, todo, finished, died, env=env)

    def rows(self, points: list[Point], seed: int) -> list[dict]:
        """Each configuration priced over its traces' runs for workload ``seed``."""
        return [
            summarize(p, [price(self.runs[_key(p, t, seed)], p, self.cfg) for t in self.traces])
            for p in points
        ]


def run_plan(
    cfg: PlanConfig, resume: str | None = None, log: Callable[[str], None] = logger.info
) -> PlanOutcome:
    """Run (or finish) the grid, then write ``plan.json``, ``plan.md``, the figure and
    ``report.html``; returns the table and the recommendation."""
    started = time.perf_counter()
    cfg, folder = _open_folder(cfg, resume)
    points, skipped = grid(cfg)
    for note in skipped:
        log(f"skipped: {note}")
    traces = availability_traces(cfg, folder)
    runner = GridRunner(cfg, folder, traces, log)
    seed = cfg.workload.seed
    runner.run_all([(p, t, seed) for p in points for t in traces], "plan grid")
    rows = runner.rows(points, seed)
    mark_frontier(rows)
    order = ranked(rows)
    best, second = order[0], order[1] if len(order) > 1 else None
    checks = _check_ranking(cfg, points, best, second, runner)
    recommendation = _recommendation(best, second, checks, cfg.plan.currency)
    table = plan_table(rows, cfg.plan.currency)
    wall_s = time.perf_counter() - started  # this invocation's (a resumed plan: what it ran)
    (folder / "plan.md").write_text(f"{table}\n\n{recommendation}\n")
    summary = {
        "rows": rows,
        "recommended": best,
        "runner_up": second,
        "seed_checks": checks,
        "traces": traces,
        "skipped": skipped,
        "wall_s": wall_s,
        "runs_kept_before": runner.kept_before,
    }
    (folder / "plan.json").write_text(json.dumps(summary, indent=2) + "\n")
    _write_report(cfg, folder, rows, best, table, recommendation)
    log(recommendation)
    log(
        f"plan: {len(points)} configurations x {len(traces)} traces in "
        f"{wall_s / 60:.1f} min ({runner.kept_before} runs kept from before)"
    )
    return PlanOutcome(str(folder), rows, table, recommendation)


def _check_ranking(cfg, points, best, runner_up, runner: GridRunner) -> list[dict]:
    """The best two configurations again on other workload seeds: cost per million trained
    tokens of each, and whether the recommended one stays ahead."""
    if runner_up is None or not cfg.plan.check_seeds:
        return []
    pair = [
        next(p for p in points if (p.policy, p.reserved, p.tp) == key)
        for key in (
            (best["policy"], best["reserved_gpus"], best["tp"]),
            (runner_up["policy"], runner_up["reserved_gpus"], runner_up["tp"]),
        )
    ]
    seeds = [cfg.workload.seed + k for k in range(1, cfg.plan.check_seeds + 1)]
    jobs = [(p, t, s) for s in seeds for p in pair for t in runner.traces]
    runner.run_all(jobs, "ranking check")
    out = []
    for s in seeds:
        costs = [row["cost_per_million_tokens"] for row in runner.rows(pair, s)]
        out.append(
            {
                "seed": s,
                "recommended": costs[0],
                "runner_up": costs[1],
                "holds": costs[0] <= costs[1],
            }
        )
    return out


def _recommendation(best: dict, runner: dict | None, checks: list[dict], currency: str) -> str:
    text = (
        f"Recommended: {best['policy']} with {best['reserved_gpus']} reserved GPUs at "
        f"TP{best['tp']}: {best['cost_per_million_tokens']:,.3f} {currency} per million trained "
        f"tokens, {best['trained_tokens_per_s']:,.0f} trained tokens/s."
    )
    if runner is not None:
        margin = runner["cost_per_million_tokens"] / best["cost_per_million_tokens"] - 1
        text += (
            f" Runner-up: {runner['policy']} with {runner['reserved_gpus']} reserved at "
            f"TP{runner['tp']}, {100 * margin:.1f}% dearer per trained token."
        )
    if checks:
        held = sum(c["holds"] for c in checks)
        text += (
            f" On {len(checks)} other workload seeds the ranking held {held} of {len(checks)} "
            "times ("
            + ", ".join(
                f"seed {c['seed']}: {c['recommended']:,.3f} vs {c['runner_up']:,.3f}"
                for c in checks
            )
            + ")."
        )
    return text


def _write_report(cfg, folder: Path, rows, best, table: str, recommendation: str) -> None:

    fig = plan_figure(rows, best, cfg.policies, cfg.plan.currency)
    png = save(fig, folder, "plan")[0]
    write_report(
        folder,
        f"PEARL plan: {cfg.model.name}, workload {cfg.workload.trace or cfg.workload.profile}",
        f"{len(rows)} configurations ({len(cfg.policies)} policies x reserved "
        f"{cfg.plan.reserved_gpus} x TP {cfg.plan.tp}); reserved GPU "
        f"{cfg.plan.price_reserved} and preemptible {cfg.plan.price_preemptible} "
        f"{cfg.plan.currency} per GPU-hour.",
        [
            Section("Recommendation", text=recommendation),
            Section("Frontier", tables=[table], figures=[(png, "cost against speed")]),
        ],
    )


def load_plan_config(path: str | None, overrides: list[str]) -> PlanConfig:
    """``pearl plan``'s config: the YAML file (``kind: plan``, or an RL config, whose other
    sections it shares) with overrides."""
    raw_kind = None
    if path is not None and Path(path).is_file():
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
            raw_kind = raw.get("kind") if isinstance(raw, dict) else None
        except yaml.YAMLError:
            raw_kind = None
    extra = ["kind=plan"] if raw_kind in ("rl", None) else []
    return load_config(PlanConfig, path, extra + overrides)
