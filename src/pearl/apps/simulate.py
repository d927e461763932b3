"""``pearl simulate``: one rollout batch of a workload on fixed deployments, in virtual time."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from pearl.apps.sim_build import build_batch, build_cost_model, check_fits, engine_config
from pearl.config.loading import dump_config
from pearl.config.simulate import SimulateConfig
from pearl.control.deployment import Deployment
from pearl.report.figures import rollout_figure, save
from pearl.report.html import Section, write_report
from pearl.report.run_folder import RunFolder
from pearl.sim.fixed import FixedRolloutReport, simulate_fixed_rollout

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class SimulateOutcome:
    run_dir: str
    reports: list[FixedRolloutReport]


def _deployment_row(report: FixedRolloutReport, deployment: Deployment, tp: int) -> dict:
    """One ``metrics.jsonl`` row: a deployment's makespan, tokens, turns and worker time."""
    return {
        "deployment": report.deployment,
        "timing/rollout": report.makespan_s,
        "performance/rollout_tokens": report.generated_tokens,
        "performance/tokens_per_sec": report.generated_tokens / report.makespan_s,
        "rollout/turns": report.turns,
        "rollout/mean_turn_latency_s": report.mean_turn_latency_s,
        "rollout/kv_bytes_moved": report.kv_bytes_moved,
        "rollout/prefill_tokens_computed": report.prefill_tokens_computed,
        "rollout/prefill_tokens_cached": report.prefill_tokens_cached,
        "cluster/rollout_gpus": deployment.num_workers * tp,
        "cluster/prefill_workers": deployment.prefill,
        "cluster/decode_workers": deployment.decode,
        "cluster/colocated_workers": deployment.colocated,
        "sim/iterations": report.iterations,
        "sim/fast_forwarded_iterations": report.fast_forwarded_iterations,
        "sim/timer_events": report.timer_events,
        **{
            f"time/{use}_s": sum(w[use] for w in report.time_breakdown)
            for use in (report.time_breakdown[0] if report.time_breakdown else {})
        },
    }


def _turn_events(run: RunFolder, report: FixedRolloutReport) -> None:
    """Every turn of the batch on one deployment, as an ``events.jsonl`` line."""
    for traj in report.result.trajectories:
        for k, turn in enumerate(traj.turns):
            t = turn.telemetry
            run.event(
                {
                    "deployment": report.deployment,
                    "kind": "turn",
                    "session": traj.session_id,
                    "turn": k,
                    "submitted_at": round(t.submitted_at, 9),
                    "first_token_at": round(t.first_token_at or 0.0, 9),
                    "finished_at": round(t.finished_at, 9),
                    "generated": len(turn.token_ids),
                    "prefill_computed": t.prefill_tokens_computed,
                    "prefill_cached": t.prefill_tokens_cached,
                    "kv_bytes": t.kv_bytes_moved,
                    "prefill_worker": t.prefill_worker,
                    "decode_worker": t.decode_worker,
                }
            )


def workload_label(cfg: SimulateConfig) -> str:
    """What the batch is, for logs and the run folder: the trace file a replay reads, or
    the profile a batch is generated from."""
    w = cfg.workload
    return f"trace {Path(w.trace).name}" if w.trace else w.profile


def run_simulate(cfg: SimulateConfig, log=logger.info) -> SimulateOutcome:
    """Run every configured deployment on the same batch; write the run folder."""
    cost = build_cost_model(cfg)
    batch = build_batch(cfg)
    engine = engine_config(cfg.sim)
    longest = max(t.peak_context_tokens for t in batch.trajectories)
    workload = workload_label(cfg)
    check_fits(cost, engine, longest, f"workload {workload}")
    run = RunFolder(cfg.logger.run_dir, cfg.logger.run_name)
    run.write_config(dump_config(cfg))
    reports = []
    rows = []
    log(
        f"{cost.model.name} on TP{cost.tp} {cost.gpu.name}; workload {workload}: "
        f"{batch.num_trajectories} trajectories, {sum(t.num_turns for t in batch.trajectories)} turns"
    )
    for label in cfg.cluster.deployments:
        deployment = Deployment.parse(label)
        report = simulate_fixed_rollout(
            batch, cost, deployment, engine, vocab_size=cost.model.vocab_size
        )
        reports.append(report)
        rows.append(_deployment_row(report, deployment, cost.tp))
        run.metric(rows[-1])
        _turn_events(run, report)
        log(
            f"  {report.deployment:>6}: makespan {report.makespan_s:9.2f} s  "
            f"{report.generated_tokens / report.makespan_s:9.1f} tok/s  "
            f"({report.iterations} iterations, {report.wall_s:.2f} s wall)"
        )
    best = min(reports, key=lambda r: r.makespan_s)
    run.summary(
        {
            "model": cost.model.name,
            "gpu": cost.gpu.name,
            "tp": cost.tp,
            "workload": workload,
            "trajectories": batch.num_trajectories,
            "makespan_s": {r.deployment: r.makespan_s for r in reports},
            "best_deployment": best.deployment,
            "wall_s": {r.deployment: r.wall_s for r in reports},
        }
    )
    run.close()
    write_rollout_report(
        run.path, rows, f"{cost.model.name} on TP{cost.tp} {cost.gpu.name}, workload {workload}"
    )
    return SimulateOutcome(str(run.path), reports)


def write_rollout_report(folder: Path, rows: list[dict], setting: str) -> Path:
    """``rollout.png``/``.svg`` and ``report.html``: each deployment's makespan and time."""

    png = save(rollout_figure(rows), folder, "rollout")[0]
    table = ["| deployment | makespan s | tok/s | turns | mean turn s | KV moved MiB |"]
    table.append("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        table.append(
            f"| {r['deployment']} | {r['timing/rollout']:.2f} | "
            f"{r['performance/tokens_per_sec']:.1f} | {r['rollout/turns']} | "
            f"{r['rollout/mean_turn_latency_s']:.3f} | {r['rollout/kv_bytes_moved'] / 2**20:.1f} |"
        )
    best = min(rows, key=lambda r: r["timing/rollout"])
    return write_report(
        folder,
        f"PEARL simulated rollout batch: {setting}",
        f"{len(rows)} deployments on the same batch; fastest {best['deployment']} "
        f"({best['timing/rollout']:.2f} s).",
        [Section("Deployments", tables=["\n".join(table)], figures=[(png, "makespan and time")])],
    )
