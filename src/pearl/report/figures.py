"""Figures of a simulated RL experiment (matplotlib; each written as PNG and SVG).

Per availability segment:

- ``throughput_<k>_<segment>``: per-step throughput, one panel per policy (shared axes, so
  seven policies never collapse into one line), with the rollout-GPU budget behind each.
- ``roles_<k>_<segment>``: the workers PEARL runs over time, stacked by role, own GPUs
  and GPUs borrowed from training told apart.
- ``time_<k>_<segment>``: where each rollout worker's time went under PEARL, and the
  same shares per policy.
- ``decisions_<k>_<segment>``: the decision engine's predicted makespan for the topology
  it chose at each batch start against the rollout time the simulator then measured.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pearl.control.policies import display_name

# Worker states, in the order of the simulator's time breakdown, with what a reader calls them.
STATES = {
    "prefill": "prefill",
    "decode": "decode",
    "mixed": "prefill + decode in one pass",
    "idle_env": "idle: waiting for the environment",
    "idle_no_work": "idle: no turn to run",
    "kv_transfer": "moving KV (P to D)",
    "reconfiguring": "reconfiguring (load, switch)",
}
STATE_COLORS = {
    "prefill": "#d95f02",
    "decode": "#1b9e77",
    "mixed": "#7570b3",
    "idle_env": "#bdbdbd",
    "idle_no_work": "#e7e7e7",
    "kv_transfer": "#e6ab02",
    "reconfiguring": "#a6761d",
}
# Role timeline series: (key in the timeline, legend label, colour, hatch).
ROLES = (
    ("dedicated_colocated", "colocated (rollout GPUs)", "#4c72b0", ""),
    ("dedicated_prefill", "prefill (rollout GPUs)", "#dd8452", ""),
    ("dedicated_decode", "decode (rollout GPUs)", "#55a868", ""),
    ("overlap_colocated", "colocated, borrowed from training", "#4c72b0", "//"),
    ("overlap_prefill", "prefill, borrowed from training", "#dd8452", "//"),
    ("overlap_decode", "decode, borrowed from training", "#55a868", "//"),
)


def _pyplot():
    import matplotlib  # import time

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # import time

    return plt


def save(fig: Any, folder: Path, stem: str) -> list[Path]:
    """``<stem>.png`` and ``<stem>.svg`` in ``folder``; the figure is closed."""
    plt = _pyplot()
    paths = [folder / f"{stem}.png", folder / f"{stem}.svg"]
    fig.savefig(paths[0], dpi=110)
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


def slug(text: str) -> str:
    """A file-name-safe form of a segment name or CSV path."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(text).stem)[:40]


def _steps(points: Sequence[tuple[float, float]], end: float) -> tuple[list[float], list[float]]:
    """A step function's corners: each value holds until the next change, the last to ``end``."""
    xs: list[float] = []
    ys: list[float] = []
    for k, (t, v) in enumerate(points):
        nxt = points[k + 1][0] if k + 1 < len(points) else max(end, t)
        xs += [t, nxt]
        ys += [v, v]
    return xs, ys


def _end_time(runs: Iterable[dict]) -> float:
    return max(
        (row["time_s"] for r in runs for row in r["rows"]),
        default=1.0,
    )


def throughput_figure(runs: list[dict], segment: str) -> Any:
    """One panel per policy: tokens/s of each step at the step's end, budget shaded behind."""
    from matplotlib.ticker import MaxNLocator  # import time

    plt = _pyplot()
    end = _end_time(runs)
    fig, axes = plt.subplots(
        len(runs),
        1,
        figsize=(8.0, 1.15 * len(runs) + 1.0),
        sharex=True,
        sharey=True,
        layout="constrained",
        squeeze=False,
    )
    top = max((row["performance/tokens_per_sec"] for r in runs for row in r["rows"]), default=1.0)
    budget_top = max((g for r in runs for _, g in r["rollout_gpus"]), default=1)
    for ax, r in zip(axes[:, 0], runs, strict=True):
        gpus = ax.twinx()
        xs, ys = _steps([(t, float(g)) for t, g in r["rollout_gpus"]], end)
        gpus.fill_between(xs, ys, color="#d9d9d9", alpha=0.6, linewidth=0, step=None)
        gpus.set_ylim(0, budget_top * 1.1)
        gpus.yaxis.set_major_locator(MaxNLocator(nbins=3, integer=True))
        gpus.tick_params(labelsize=7, colors="#777777")
        ax.set_zorder(gpus.get_zorder() + 1)
        ax.patch.set_visible(False)
        rows = r["rows"]
        counted = [row for row in rows if row.get("counted", True)]
        ax.plot(
            [row["time_s"] for row in rows],
            [row["performance/tokens_per_sec"] for row in rows],
            color="#1f4e79",
            marker="o",
            markersize=2.5,
            linewidth=1.0,
        )
        ax.set_ylim(0, top * 1.1)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=3))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.set_title(
            f"{display_name(r['policy'])}: {r['throughput']:,.0f} tok/s over {len(counted)} steps",
            fontsize=8,
            loc="left",
        )
    axes[-1, 0].set_xlabel("time (s)")
    fig.supylabel("tokens/s of each RL step (dots)", fontsize=9)
    fig.suptitle(
        f"{segment}: throughput per step; grey: rollout GPUs available (right axis)", fontsize=10
    )
    return fig


def roles_figure(run: dict, segment: str, tp: int) -> Any:
    """Workers by role over time (stacked), with the trace's rollout-GPU budget in workers."""
    from matplotlib.patches import Patch  # import time
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    end = _end_time([run])
    timeline = run["timeline"] or [{"t": 0.0}]
    fig, ax = plt.subplots(figsize=(8.0, 3.4), layout="constrained")
    base_x, base = _steps([(e["t"], 0.0) for e in timeline], end)
    handles = []
    for key, label, color, hatch in ROLES:
        if not any(e.get(key) for e in timeline):
            continue
        xs, ys = _steps([(e["t"], float(e.get(key, 0))) for e in timeline], end)
        upper = [b + y for b, y in zip(base, ys, strict=True)]
        ax.fill_between(
            xs, base, upper, facecolor=color, alpha=0.85, hatch=hatch, edgecolor="white", lw=0
        )
        handles.append(Patch(facecolor=color, hatch=hatch, edgecolor="white", label=label))
        base = upper
    xs, ys = _steps([(t, g / tp) for t, g in run["rollout_gpus"]], end)
    (line,) = ax.plot(xs, ys, color="black", linestyle="--", linewidth=1.0)
    line.set_label(f"rollout GPUs available / {tp} per worker")
    handles.append(line)
    ax.set_xlim(0, end)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("rollout workers")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(
        f"{segment}: what {display_name(run['policy'])}'s rollout workers do "
        "(hatched: training GPUs lent between updates)",
        fontsize=9,
    )
    return fig


def time_figure(runs: list[dict], segment: str) -> Any:
    """Left: each worker of the last PEARL-family run, seconds per state. Right: the share of
    worker time per state, per policy (counted steps)."""
    plt = _pyplot()
    family = [r for r in runs if r["policy"].startswith("pearl")]
    focus = family[-1] if family else runs[-1]
    per_worker = focus["counters"].get("time_by_worker_s", {})
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(10.0, 0.28 * max(len(per_worker), len(runs)) + 2.4), layout="constrained"
    )
    ids = sorted(per_worker, key=_natural)  # w2 before w10
    _stacked(left, [_worker_label(w) for w in ids], [per_worker[w] for w in ids])
    left.set_xlabel("seconds")
    left.set_title(f"each worker under {display_name(focus['policy'])}", fontsize=9)
    shares = []
    for r in runs:
        rows = [row for row in r["rows"] if row.get("counted", True)]
        spent = {s: sum(row.get(f"time/{s}_s", 0.0) for row in rows) for s in STATES}
        total = sum(spent.values()) or 1.0
        shares.append({s: 100 * v / total for s, v in spent.items()})
    _stacked(right, [display_name(r["policy"]) for r in runs], shares)
    right.set_xlim(0, 100)
    right.set_xlabel("% of active worker time")
    right.set_title("per policy", fontsize=9)
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"{segment}: where rollout worker time goes", fontsize=10)
    return fig


def _worker_label(worker_id: str) -> str:
    """``w3`` -> ``worker 3``; ``o9`` (a training GPU's overlap worker) -> ``borrowed 9``."""
    if worker_id[:1] == "o":
        return f"borrowed {worker_id[1:]}"
    return f"worker {worker_id.lstrip('w')}"


def _natural(text: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _stacked(ax: Any, labels: list[str], values: list[dict]) -> None:
    left = [0.0] * len(labels)
    for state, name in STATES.items():
        widths = [v.get(state, 0.0) for v in values]
        ax.barh(labels, widths, left=left, color=STATE_COLORS[state], label=name)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.tick_params(labelsize=7)
    ax.grid(axis="x", alpha=0.3)


def decision_points(run: dict) -> list[tuple[float, float, bool]]:
    """``(predicted, simulated, steady)`` per batch whose start had a decision: the makespan
    the decision engine predicted for the topology it chose, the rollout time the simulator
    then took, and whether the batch ran on that many workers throughout (borrowed GPUs or
    an availability change during the batch make it faster or slower than predicted)."""
    decisions: dict[float, dict] = {}
    for e in run["events"]:
        if e.get("kind") == "decision" and e.get("target_makespan_s") is not None:
            decisions[round(e["t"], 3)] = e  # the last decision taken at that instant
    points = []
    for row in run["rows"]:
        start = row["rollout_started_s"]
        d = decisions.get(round(start, 3))
        if d is None:
            continue
        end = start + row["timing/rollout"]
        counts = {
            sum(v for k, v in e.items() if k not in ("t", "step"))
            for e in _entries_during(run["timeline"], start, end)
        }
        points.append((d["target_makespan_s"], row["timing/rollout"], counts == {d["workers"]}))
    return points


def _entries_during(timeline: list[dict], start: float, end: float) -> list[dict]:
    """The timeline entries in effect at some time in ``[start, end)``."""
    before = [e for e in timeline if e["t"] <= start]
    during = [e for e in timeline if start < e["t"] < end]
    return before[-1:] + during


def decisions_figure(runs: list[dict], segment: str) -> Any | None:
    """Predicted vs simulated rollout makespans of the adaptive policies; None if no run
    took a decision at a batch start. Filled: the batch kept the decided worker count;
    hollow: workers joined, left or were borrowed during it."""
    plt = _pyplot()
    series = [(r, decision_points(r)) for r in runs]
    series = [(r, pts) for r, pts in series if pts]
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(5.6, 4.6), layout="constrained")
    markers = "osD^v<>"
    colors = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
    hi = 0.0
    for k, (r, pts) in enumerate(series):
        color = colors[k % len(colors)]
        for steady in (True, False):
            chosen = [(p, s) for p, s, st in pts if st is steady]
            if not chosen:
                continue
            ax.scatter(
                [p for p, _ in chosen],
                [s for _, s in chosen],
                s=18,
                marker=markers[k % len(markers)],
                facecolors=color if steady else "none",
                edgecolors=color,
                alpha=0.8,
                label=f"{display_name(r['policy'])}: {len(chosen)} batches"
                + ("" if steady else ", workers changed"),
            )
        hi = max(hi, *(max(p, s) for p, s, _ in pts))
    ax.plot([0, hi * 1.05], [0, hi * 1.05], color="black", linewidth=0.8, label="prediction exact")
    ax.set_xlim(0, hi * 1.05)
    ax.set_ylim(0, hi * 1.05)
    ax.set_xlabel("predicted makespan of the chosen topology (s)")
    ax.set_ylabel("simulated rollout time of the batch (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"{segment}: decision engine's makespan model at each batch start", fontsize=9)
    return fig


def experiment_figures(runs: list[dict], segments: list[str], folder: Path, tp: int) -> list[Path]:
    """Every figure of an experiment, written into ``folder``; returns the PNG and SVG paths."""
    written: list[Path] = []
    for k, segment in enumerate(segments):
        here = [r for r in runs if r["segment"] == segment]
        if not here:
            continue
        tag = f"{k + 1}_{slug(segment)}"
        written += save(throughput_figure(here, segment), folder, f"throughput_{tag}")
        family = [r for r in here if r["policy"].startswith("pearl")]
        if family:
            written += save(roles_figure(family[-1], segment, tp), folder, f"roles_{tag}")
        written += save(time_figure(here, segment), folder, f"time_{tag}")
        fig = decisions_figure(here, segment)
        if fig is not None:
            written += save(fig, folder, f"decisions_{tag}")
    return written


def rollout_figure(rows: list[dict]) -> Any:
    """``pearl simulate`` (one batch on fixed deployments): each deployment's makespan, and
    where its workers' time went."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(10.0, 0.45 * len(rows) + 2.0), layout="constrained"
    )
    labels = [r["deployment"] for r in rows]
    left.barh(labels, [r["timing/rollout"] for r in rows], color="#1f4e79")
    for k, r in enumerate(rows):
        left.annotate(
            f" {r['timing/rollout']:,.1f} s",
            (r["timing/rollout"], k),
            va="center",
            fontsize=7,
        )
    left.invert_yaxis()
    left.set_xlim(0, 1.2 * max(r["timing/rollout"] for r in rows))
    left.set_xlabel("makespan of the rollout batch (s)")
    left.grid(axis="x", alpha=0.3)
    left.set_title("makespan per deployment (C colocated, P prefill, D decode)", fontsize=9)
    shares = []
    for r in rows:
        spent = {s: r.get(f"time/{s}_s", 0.0) for s in STATES}
        total = sum(spent.values()) or 1.0
        shares.append({s: 100 * v / total for s, v in spent.items()})
    _stacked(right, labels, shares)
    right.set_xlim(0, 100)
    right.set_xlabel("% of worker time")
    right.set_title("where the workers' time went", fontsize=9)
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def plan_figure(rows: list[dict], best: dict, policies: list[str], currency: str) -> Any:
    """``pearl plan``: cost per million trained tokens against trained tokens per second,
    one point per configuration (labelled reserved GPUs / TP), the frontier dashed and the
    recommended configuration starred."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    for policy in policies:
        mine = [r for r in rows if r["policy"] == policy]
        ax.scatter(
            [r["trained_tokens_per_s"] for r in mine],
            [r["cost_per_million_tokens"] for r in mine],
            label=display_name(policy),
            s=28,
        )
        for r in mine:
            ax.annotate(
                f"r{r['reserved_gpus']}/tp{r['tp']}",
                (r["trained_tokens_per_s"], r["cost_per_million_tokens"]),
                fontsize=6,
                xytext=(3, 2),
                textcoords="offset points",
            )
    front = sorted((r for r in rows if r["frontier"]), key=lambda r: r["trained_tokens_per_s"])
    ax.plot(
        [r["trained_tokens_per_s"] for r in front],
        [r["cost_per_million_tokens"] for r in front],
        color="#777777",
        linewidth=0.8,
        linestyle="--",
        label="frontier",
    )
    ax.scatter(
        [best["trained_tokens_per_s"]],
        [best["cost_per_million_tokens"]],
        marker="*",
        s=160,
        facecolors="none",
        edgecolors="black",
        label="recommended",
    )
    ax.set_xlabel("trained tokens per second (over the availability traces)")
    ax.set_ylabel(f"{currency} per million trained tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig
