"""Plots of a training run (matplotlib, written as PNG and SVG files into the run folder)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pearl.report.figures import save


def plot_training(rows: Sequence[dict[str, Any]], folder: str | Path) -> list[Path]:
    """``reward`` (training reward and success per step) and ``throughput``
    (generated tokens per second of rollout, and rollout vs training seconds per step)."""
    import matplotlib  # import time

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # import time
    from matplotlib.ticker import MaxNLocator

    folder = Path(folder)
    steps = [r["step"] for r in rows]
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
    ax.plot(steps, [r["reward_mean"] for r in rows], marker="o", label="mean reward")
    ax.plot(steps, [r["success_rate"] for r in rows], marker="s", label="success rate")
    ax.set_xlabel("RL step")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Training batches (trajectories of training tasks)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    written += save(fig, folder, "reward")

    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.6), layout="constrained")
    left.plot(steps, [r["rollout_tokens_per_s"] for r in rows], marker="o")
    left.set_xlabel("RL step")
    left.set_ylabel("generated tokens / s")
    left.set_title("Rollout throughput")
    left.grid(alpha=0.3)
    right.bar([s - 0.2 for s in steps], [r["rollout_s"] for r in rows], width=0.4, label="rollout")
    right.bar([s + 0.2 for s in steps], [r["train_s"] for r in rows], width=0.4, label="training")
    right.set_xlabel("RL step")
    right.set_ylabel("seconds")
    right.set_title("Per step (they overlap: staleness 1)")
    right.legend()
    left.set_ylim(bottom=0)
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    written += save(fig, folder, "throughput")
    return written
