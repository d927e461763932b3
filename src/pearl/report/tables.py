"""Markdown tables of a simulated RL experiment's runs (plain data, as ``summary.json`` and
``runs/*.json`` keep them): throughput per policy and segment with the ratios to ROLL and
RLBoost+, where the rollout workers' time went, and the roles of every step."""

from __future__ import annotations

from pearl.control.policies import display_name


def throughput_table(runs: list[dict], policies: list[str], segments: list[str]) -> str:
    """Markdown: throughput per policy and segment (over the steps completed within the
    window, counted), and ratios to ROLL and RLBoost+."""
    by = {(r["policy"], r["segment"]): r["throughput"] for r in runs}
    steps = {(r["policy"], r["segment"]): r["steps"] for r in runs}
    head = "| policy | config name |"
    rule = "|---|---|"
    for s in segments:
        head += f" {s} tok/s | steps | x ROLL | vs RLBoost+ |"
        rule += "---:|---:|---:|---:|"
    lines = [head, rule]
    for p in policies:
        line = f"| {display_name(p)} | {p} |"
        for s in segments:
            t = by[(p, s)]
            roll, boost = by.get(("roll", s)), by.get(("rlboost", s))
            x_roll = f"{t / roll:.3f}x" if roll else "-"
            vs_boost = f"{100 * (t / boost - 1):+.2f}%" if boost else "-"
            line += f" {t:.1f} | {steps[(p, s)]} | {x_roll} | {vs_boost} |"
        lines.append(line)
    return "\n".join(lines)


TIME_COLUMNS = (
    "prefill",
    "decode",
    "mixed",
    "idle_env",
    "idle_no_work",
    "kv_transfer",
    "reconfiguring",
)


def time_table(runs: list[dict]) -> str:
    """Markdown: where the rollout workers' time went (share of active worker-seconds over
    the counted steps) per policy and segment."""
    head = "| policy | segment | " + " | ".join(TIME_COLUMNS) + " | worker-hours |"
    lines = [head, "|---|---|" + "---:|" * (len(TIME_COLUMNS) + 1)]
    for r in runs:
        rows = [row for row in r["rows"] if row.get("counted", True)]
        spent = {c: sum(row.get(f"time/{c}_s", 0.0) for row in rows) for c in TIME_COLUMNS}
        total = sum(spent.values())
        shares = " | ".join(
            f"{100 * spent[c] / total:.1f}%" if total else "-" for c in TIME_COLUMNS
        )
        lines.append(
            f"| {display_name(r['policy'])} | {r['segment']} | {shares} | {total / 3600:.2f} |"
        )
    return "\n".join(lines)


def topology_at(timeline: list[dict], t: float) -> str:
    """The roles in effect at time ``t`` as a label: ``8C``, ``3P5D``, ``+4o`` for borrowed."""
    entry: dict = {}
    for e in timeline:
        if e["t"] > t:
            break
        entry = e
    label = ""
    for zone, suffix in (("dedicated", ""), ("overlap", "o")):
        p, d, c = (entry.get(f"{zone}_{role}", 0) for role in ("prefill", "decode", "colocated"))
        part = (f"{p}P" if p else "") + (f"{d}D" if d else "") + (f"{c}C" if c else "")
        if part:
            label += (" +" if label else "") + part + suffix
    return label or "-"


def steps_table(runs: list[dict]) -> str:
    """Markdown: per step of the PEARL-family runs, the roles at the batch's start, the
    rollout time and the number of role switches so far."""
    lines = ["| policy | segment | step | roles at start | rollout s | step s | counted |"]
    lines.append("|---|---|---:|---|---:|---:|:---:|")
    for r in runs:
        if not (r["policy"].startswith("pearl") or r["policy"] == "static-pd"):
            continue
        for row in r["rows"]:
            label = topology_at(r["timeline"], row["rollout_started_s"])
            lines.append(
                f"| {r['policy']} | {r['segment']} | {row['step']} | {label} | "
                f"{row['timing/rollout']:.0f} | {row['timing/step']:.0f} | "
                f"{'yes' if row.get('counted', True) else 'no'} |"
            )
    return "\n".join(lines)
