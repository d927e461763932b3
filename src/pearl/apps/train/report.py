"""``pearl train``'s ``report.html``: held-out success before and after, the per-step
table, the training plots."""

from __future__ import annotations

from pathlib import Path

from pearl.report.html import Section, write_report


def write_train_report(
    folder: Path, rows: list[dict], before: dict, after: dict, summary: dict
) -> Path:
    """``report.html``: held-out success before and after, the per-step table, the plots."""

    lines = [
        "| step | reward | success | rollout s | train s | gen tok/s | staleness | roles |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['step']} | {r['reward_mean']:.3f} | {100 * r['success_rate']:.1f}% | "
            f"{r['rollout_s']:.2f} | {r['train_s']:.2f} | {r['rollout_tokens_per_s']:.1f} | "
            f"{r['staleness']} | {r['roles']} |"
        )
    evals = [
        "| when | weights | success | 95% interval | mean reward |",
        "|---|---:|---:|---|---:|",
    ]
    for e in (before, after):
        if e:
            evals.append(
                f"| {e['when']} | v{e['weight_version']} | {e['successes']}/{e['tasks']} = "
                f"{100 * e['success_rate']:.1f}% | {100 * e['ci95'][0]:.1f}-"
                f"{100 * e['ci95'][1]:.1f}% | {e['mean_reward']:.3f} |"
            )
    figures = [
        (folder / f"{name}.png", caption)
        for name, caption in (
            ("reward", "training reward and success per step"),
            ("throughput", "rollout throughput; rollout and training seconds per step"),
        )
        if (folder / f"{name}.png").exists()
    ]
    return write_report(
        folder,
        f"PEARL live training: {folder.name}",
        f"{len(rows)} steps in {summary['train_seconds']:.0f} s under policy "
        f"{summary['policy']}; weights v{summary['weight_version']}.",
        [
            Section("Held-out evaluation", tables=[evals[0] + "\n" + "\n".join(evals[1:])])
            if len(evals) > 2
            else Section("Held-out evaluation", "none (run.eval_tasks=0)"),
            Section("Steps", figures=figures, tables=["\n".join(lines)]),
        ],
    )
