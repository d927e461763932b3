"""``pearl simulate`` with ``kind: rl``: every policy on every availability segment.

Each (policy, segment) pair is one simulated RL run of ``rl.duration_s`` on the same
cluster, workload seed and trace; runs go to worker processes. The run folder gets
``metrics.jsonl`` (one line per RL step and run), ``events.jsonl`` (every elastic event,
decision, reconfiguration, gate evaluation and role-timeline change), ``summary.json``
and ``table.md`` (throughput per policy and segment, ratios to ROLL and to RLBoost+).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pearl.apps.sim_build import build_setting
from pearl.config.loading import dump_config, load_config
from pearl.config.simulate import RLExperimentConfig
from pearl.control.policies import PDMode, WeightUpdate, get_policy
from pearl.errors import ConfigError, RunsLost, RunStopped
from pearl.processes.env import simulation_env
from pearl.processes.pool import run_in_processes, sigterm_as_interrupt
from pearl.report.figures import experiment_figures
from pearl.report.html import Section, write_report
from pearl.report.progress import Progress
from pearl.report.run_folder import RunFolder
from pearl.report.tables import steps_table, throughput_table, time_table
from pearl.report.tensorboard import ScalarLog
from pearl.sim.policy_run import RLRunResult, RLSetting, run_policy
from pearl.workloads.availability import (
    SEGMENTS,
    AvailabilityTrace,
    load_availability,
)

logger = logging.getLogger(__name__)


def load_segment_or_csv(name: str, scale: int = 1) -> AvailabilityTrace:
    """``elastic.segments``' entry ``name``: a shipped segment, else an availability CSV;
    every value times ``scale`` (``elastic.scale``: GPUs per instance of the trace)."""
    if name not in SEGMENTS and not Path(name).is_file():
        raise ConfigError(
            f"elastic.segments: {name!r} is neither a shipped segment "
            f"({', '.join(SEGMENTS)}) nor an availability CSV file"
        )
    trace = load_availability(name)
    if scale == 1:
        return trace
    return dataclasses.replace(
        trace, values=tuple(v * scale for v in trace.values), source=f"{trace.source} x{scale}"
    )


def trace_warnings(name: str, trace: AvailabilityTrace, duration_s: float) -> list[str]:
    """What a run should know about an availability trace it replays: one that does not
    start at 0 (its times are seconds from the run's start, so its first value holds until
    its first change) or ends before the run (its last value then holds to the end)."""
    out = []
    first = trace.times_s[0]
    if first != 0:
        out.append(
            f"availability trace {name!r} starts at {first:g} s, not 0: its times count from "
            f"the run's start, so its first value ({trace.values[0]}) holds until "
            f"{trace.times_s[1] if len(trace.times_s) > 1 else trace.end_s:g} s"
        )
    if trace.end_s < duration_s:
        out.append(
            f"availability trace {name!r} ends at {trace.end_s:g} s, before rl.duration_s "
            f"{duration_s:g} s; its last value ({trace.values[-1]}) holds for the rest"
        )
    return out


def segment_warnings(cfg: RLExperimentConfig) -> list[str]:
    """Every configured availability trace loaded (a bad one raises) and its warnings."""
    return [
        w
        for name in cfg.elastic.segments
        for w in trace_warnings(
            name, load_segment_or_csv(name, cfg.elastic.scale), cfg.rl.duration_s
        )
    ]


def run_one(cfg_json: dict, policy_name: str, segment: str) -> dict:
    """One (policy, segment) run; plain data so it crosses process boundaries."""
    cfg = RLExperimentConfig.model_validate(cfg_json)
    setting = build_setting(cfg)
    overrides: dict = {"static_split": tuple(cfg.pd.static_split)}
    if cfg.rl.weight_update != "policy":
        overrides["weight_update"] = WeightUpdate(cfg.rl.weight_update)
    policy = get_policy(policy_name, **overrides)
    trace = load_segment_or_csv(segment, cfg.elastic.scale)
    return run_summary(policy_name, segment, run_policy(setting, policy, trace), trace.mean())


def run_summary(policy: str, segment: str, result: RLRunResult, trace_mean: float) -> dict:
    """One run's results as plain data (what tables, charts and the run folder read)."""
    return {
        "policy": policy,
        "segment": segment,
        "throughput": result.throughput,
        "steps": len(result.counted),
        "steps_run": len(result.records),
        "finished_at": result.finished_at,
        "rows": result.step_rows(),
        "events": result.events,
        "timeline": result.timeline,
        "rollout_gpus": result.rollout_gpus,
        "counters": result.counters,
        "wall_s": result.wall_s,
        "trace_mean_gpus": trace_mean,
    }


@dataclass(slots=True)
class ExperimentOutcome:
    run_dir: str
    runs: list[dict]
    table: str
    wall_s: float
    time_table: str = ""


def _kept_name(policy: str, segment: str) -> str:
    """A finished run's file in ``runs/`` (a segment may be a CSV path: kept flat)."""
    flat = re.sub(r"[^A-Za-z0-9._-]+", "_", segment).strip("_")
    return f"{policy}@{flat}.json"


def _run_jobs(
    cfg: RLExperimentConfig,
    jobs: list[tuple[str, str]],
    finished: Callable[[dict], None],
    died: Callable[[tuple[str, str], str], None],
) -> None:
    """Run every (policy, segment) job, in this process or in worker processes;
    ``finished`` gets each run's results the moment it ends, ``died`` each job whose
    process died (killed, out of memory) with why; the other jobs go on."""
    cfg_json = cfg.model_dump(mode="json")
    if cfg.processes == 1:
        for p, s in jobs:
            finished(run_one(cfg_json, p, s))
        return
    # Longest runs first so the last process is not left alone with one: a fixed
    # P:D split keeps every turn on the PD path (~2x the simulated events per turn).
    order = sorted(jobs, key=lambda j: get_policy(j[0]).pd is not PDMode.STATIC)
    run_in_processes(
        run_one,
        [((p, s), (cfg_json, p, s)) for p, s in order],
        cfg.processes,
        on_result=lambda key, result: finished(result),
        on_died=died,  # type: ignore[arg-type]
        env=simulation_env(),
    )


def _record_runs(run: RunFolder, runs: list[dict]) -> None:
    """Every run's steps to ``metrics.jsonl`` (and TensorBoard), its events, role timeline
    and GPU budget to ``events.jsonl``, each tagged with its policy and segment."""
    board = ScalarLog(run.path)
    for r in runs:
        tag = {"policy": r["policy"], "segment": r["segment"]}
        for row in r["rows"]:
            run.metric({**tag, **row})
            board.scalars(f"{r['segment']}/{r['policy']}", row, row["step"])
        for event in r["events"]:
            run.event({**tag, **event})
        for entry in r["timeline"]:
            run.event({**tag, "kind": "roles", **entry})
        for t, gpus in r["rollout_gpus"]:
            run.event({**tag, "kind": "budget", "t": t, "rollout_gpus": gpus})
    board.close()


def run_experiment(
    cfg: RLExperimentConfig, log: Callable[[str], None] = logger.info
) -> ExperimentOutcome:
    """Every policy on every segment, each run kept in the run folder as it finishes; then
    the summary, tables and report. Raises ``RunsLost`` (the finished runs kept and
    reported) if a run's process died, ``RunStopped`` on Ctrl-C or SIGTERM."""
    start = time.perf_counter()
    warnings = segment_warnings(cfg)  # fails fast on a bad trace, before any run starts
    setting = build_setting(cfg)
    run = RunFolder(cfg.logger.run_dir, cfg.logger.run_name)
    run.write_config(dump_config(cfg))
    for warning in warnings:
        log(f"warning: {warning}")
        run.event({"kind": "warning", "message": warning})
    log(_describe(cfg, setting))
    jobs = [(p, s) for s in cfg.elastic.segments for p in cfg.policies]
    results, lost = _run_all(cfg, run, jobs, log)
    if lost:
        _report_lost(cfg, run, jobs, results, lost, setting.cost.tp, warnings)
    runs = [results[j] for j in jobs]  # config order, whatever order they finished in
    _record_runs(run, runs)
    wall = time.perf_counter() - start
    run.summary(_summary(setting, cfg.elastic.segments, runs, warnings, wall))
    run.close()
    table, report = write_tables_and_report(cfg, runs, run.path, setting.cost.tp, warnings)
    log(f"{len(runs)} runs in {wall:.1f} s wall ({cfg.processes} processes); report: {report}")
    return ExperimentOutcome(str(run.path), runs, table, wall, time_table(runs))


def _describe(cfg: RLExperimentConfig, setting: RLSetting) -> str:
    """The experiment in one line: model, cluster, workload, engine, policies x segments."""
    return (
        f"{setting.cost.model.name} TP{setting.cost.tp} {setting.cost.gpu.name}; "
        f"{setting.training_gpus} training + {setting.reserved_gpus} reserved + up to "
        f"{setting.max_preemptible_gpus} preemptible GPUs; workload {setting.profile.name} "
        f"(batch {setting.profile.batch_size}); engine scheduling {cfg.sim.scheduling}"
        f"{' (cache flushed on weight update)' if cfg.sim.flush_cache_on_weight_update else ''}"
        f"{' (no cross-turn reuse)' if cfg.sim.cross_turn_reuse == 'none' else ''}"
        f"{' (PD decode keeps no KV between turns)' if cfg.sim.pd_decode_reuse == 'none' else ''}; "
        f"{len(cfg.policies)} policies x "
        f"{len(cfg.elastic.segments)} segments of {cfg.rl.duration_s:.0f} s"
    )


def _run_all(
    cfg: RLExperimentConfig,
    run: RunFolder,
    jobs: list[tuple[str, str]],
    log: Callable[[str], None],
) -> tuple[dict[tuple[str, str], dict], dict[str, str]]:
    """Run ``jobs`` in processes, keeping each finished run at once; the finished runs by
    (policy, segment) and the lost ones with why. Raises ``RunStopped`` if interrupted."""
    results: dict[tuple[str, str], dict] = {}
    lost: dict[str, str] = {}

    def finished(result: dict) -> None:
        """Keep a finished run at once (``runs/<policy>@<segment>.json``, written whole
        before it counts as finished): an interrupted experiment loses only the runs still
        going, and its summary lists exactly the runs kept."""
        done = run.path / "runs"
        done.mkdir(exist_ok=True)
        path = done / _kept_name(result["policy"], result["segment"])
        partial = path.with_suffix(".part")
        partial.write_text(json.dumps(result, sort_keys=True) + "\n")
        partial.replace(path)
        results[(result["policy"], result["segment"])] = result
        bar.advance(_one_line(result))

    def died(job: tuple[str, str], reason: str) -> None:
        key = f"{job[0]}@{job[1]}"
        lost[key] = reason
        log(f"error: run {key} lost: {reason}; the other runs go on")
        bar.advance(f"{key} lost")

    log(f"{len(jobs)} runs in {min(cfg.processes, len(jobs))} processes; results in {run.path}")
    try:
        with sigterm_as_interrupt(), Progress(len(jobs), "simulated RL runs") as bar:
            _run_jobs(cfg, jobs, finished, died)
    except KeyboardInterrupt:
        keys = _close_partial(run, jobs, {})
        raise RunStopped(
            f"interrupted: {len(keys)} of {len(jobs)} runs finished; their results are in "
            f"{run.path / 'runs'}"
        ) from None
    return results, lost


def _report_lost(
    cfg: RLExperimentConfig,
    run: RunFolder,
    jobs: list[tuple[str, str]],
    results: dict[tuple[str, str], dict],
    lost: dict[str, str],
    tp: int,
    warnings: list[str],
) -> None:
    """Close the folder of an experiment that lost runs (the finished ones kept, tabled and
    reported) and raise ``RunsLost`` saying how to run the lost ones again."""
    keys = _close_partial(run, jobs, lost)
    finished_runs = [results[j] for j in jobs if j in results]
    if finished_runs:
        write_tables_and_report(cfg, finished_runs, run.path, tp, warnings)
    which = "; ".join(f"{k}: {why}" for k, why in lost.items())
    raise RunsLost(
        f"{len(lost)} of {len(jobs)} runs lost ({which}). The {len(keys)} finished runs "
        f"are kept in {run.path / 'runs'}"
        + (" and shown in report.html" if finished_runs else "")
        + "; run the lost ones again with policies=[...] elastic.segments=[...]"
    )


def _summary(
    setting: RLSetting, segments: list[str], runs: list[dict], warnings: list[str], wall: float
) -> dict:
    """``summary.json`` of a complete experiment."""
    return {
        "complete": True,
        "warnings": warnings,
        "model": setting.cost.model.name,
        "workload": setting.profile.name,
        "throughput_tokens_per_s": {
            s: {r["policy"]: r["throughput"] for r in runs if r["segment"] == s} for s in segments
        },
        "steps": {f"{r['policy']}@{r['segment']}": r["steps"] for r in runs},
        "counters": {f"{r['policy']}@{r['segment']}": r["counters"] for r in runs},
        "wall_s": wall,
        "run_wall_s": {f"{r['policy']}@{r['segment']}": r["wall_s"] for r in runs},
    }


def _close_partial(run: RunFolder, jobs: list[tuple[str, str]], lost: dict[str, str]) -> list[str]:
    """The summary of an experiment that did not finish every run (interrupted, or runs
    lost with their process): which runs finished and are kept, which were lost and why."""
    kept = run.path / "runs"
    for partial in kept.glob("*.part"):  # cut mid-write: not a finished run
        partial.unlink()
    keys = [f"{p}@{s}" for p, s in jobs if (kept / _kept_name(p, s)).is_file()]
    run.summary({"complete": False, "finished": keys, "runs": len(jobs), "lost": lost})
    run.close()
    return keys


def write_tables_and_report(
    cfg: RLExperimentConfig, runs: list[dict], folder: Path, tp: int, warnings: list[str]
) -> tuple[str, Path]:
    """``table.md``, the figures and ``report.html`` of finished runs; the throughput table
    and the report's path."""
    policies = [p for p in cfg.policies if any(r["policy"] == p for r in runs)]
    segments = [s for s in cfg.elastic.segments if any(r["segment"] == s for r in runs)]
    table = throughput_table(runs, policies, segments)
    details = time_table(runs) + "\n\n" + steps_table(runs)
    (folder / "table.md").write_text(table + "\n\n" + details + "\n")
    figures = experiment_figures(runs, segments, folder, tp)
    complete = len(runs) == len(cfg.policies) * len(cfg.elastic.segments)
    report = write_report(
        folder,
        f"PEARL simulated RL: {cfg.model.name}, workload {cfg.workload.profile}",
        f"{len(runs)} runs ({len(policies)} policies x {len(segments)} availability segments "
        f"of {cfg.rl.duration_s:g} s)"
        + (
            "."
            if complete
            else f"; {len(cfg.policies) * len(cfg.elastic.segments)} configured "
            "(the others were interrupted or lost: summary.json says which)."
        ),
        report_sections(runs, segments, table, figures),
        warnings,
    )
    return table, report


def rebuild_report(folder: str | Path) -> Path:
    """Figures, ``table.md`` and ``report.html`` again from a run folder's ``config.yaml`` and
    kept runs (``runs/*.json``): after an interrupted experiment, or a newer PEARL."""

    folder = Path(folder)
    kept = sorted((folder / "runs").glob("*@*.json")) if (folder / "runs").is_dir() else []
    if not (folder / "config.yaml").is_file() or not kept:
        raise ConfigError(
            f"{folder}: not a simulated RL run folder with finished runs (needs config.yaml "
            f"and runs/<policy>@<segment>.json)"
        )
    cfg = load_config(RLExperimentConfig, folder / "config.yaml")
    loaded = {}
    for path in kept:
        r = json.loads(path.read_text())
        loaded[(r["policy"], r["segment"])] = r
    order = [(p, s) for s in cfg.elastic.segments for p in cfg.policies]
    runs = [loaded[j] for j in order if j in loaded]
    return write_tables_and_report(cfg, runs, folder, cfg.cluster.tp, segment_warnings(cfg))[1]


def _one_line(r: dict) -> str:
    c = r["counters"]
    return (
        f"{r['policy']:>14} @ {r['segment']:<9} {r['throughput']:9.1f} tok/s  "
        f"{r['steps']:3d} steps counted  borrow {c['borrow_rounds']:>2}  role switches "
        f"{c['role_switches']:>3}  ({r['wall_s']:.1f} s)"
    )


def report_sections(
    runs: list[dict], segments: list[str], table: str, figures: list[Path]
) -> list[Section]:
    """The report's sections: the throughput table, then each segment's figures."""
    pngs = {p.stem: p for p in figures if p.suffix == ".png"}
    sections = [
        Section(
            "Throughput",
            "(rollout + training tokens) / time over the RL steps completed in the window; "
            "ratios to ROLL and RLBoost+ on the same segment.",
            [table],
        ),
        Section("Where rollout worker time went", tables=[time_table(runs)]),
    ]
    captions = {
        "throughput": "per-step throughput of each policy; grey: rollout GPUs available",
        "roles": "PEARL's rollout workers by role over time; hatched: training GPUs lent "
        "between updates; dashed: the GPUs the availability trace offers",
        "time": "seconds per state of each worker under PEARL, and shares per policy",
        "decisions": "makespan the decision engine predicted for its chosen topology vs the "
        "rollout time the simulator measured, per batch",
    }
    for k, segment in enumerate(segments):
        shown = [
            (pngs[stem], caption)
            for kind, caption in captions.items()
            for stem in pngs
            if stem.startswith(f"{kind}_{k + 1}_")
        ]
        sections.append(Section(f"Availability trace: {segment}", figures=shown))
    sections.append(Section("Per step (PEARL family)", tables=[steps_table(runs)]))
    return sections
