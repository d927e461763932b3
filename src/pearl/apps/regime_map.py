"""Where disaggregation wins: the best P:D split's gain over colocation across workloads.

Each cell of a map is one workload: a base profile with two of its knobs moved. The cell's
batch 0 runs colocated and the runtime tracker refits from it (as online); the PD Decision
Engine picks the topology it would pick with no hysteresis; batch 1 is then replayed on
colocation and on every split with the same seeds (``select_and_replay``). A cell records
the best split's measured gain over colocation and the gain of the engine's pick (what
``pearl-pd`` would realize on that batch, switching costs aside).

The knobs, each a factor on (or a value for) the base profile:

- ``observation``: observation tokens per turn (factor), the prefill each turn adds;
- ``response``: tokens generated per turn (factor), the decode each turn does;
- ``env``: environment latency, per-action overhead, setup and reward (factor);
- ``trajectories``: trajectories per rollout worker (value; the batch is this x workers,
  rounded to whole groups);
- ``context``: the context cap in tokens (value);
- ``reuse``: the share of the context the prefix cache can serve each turn: ``window``
  (SWE-agent's collapse of old observations edits the context, so each turn re-prefills
  from the collapsed observation on) or ``append`` (append-only context: each turn
  prefills only what it adds).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pearl.apps.paper.ratio_selection import StepSelection, select_and_replay
from pearl.control.decision import DecisionConfig
from pearl.sim.costmodel import CostModel
from pearl.sim.worker import SimEngineConfig
from pearl.workloads.profiles import AgenticProfile

KNOBS = ("observation", "response", "env", "trajectories", "context", "reuse")


def apply_knob(profile: AgenticProfile, knob: str, value, workers: int) -> AgenticProfile:
    """``profile`` with one knob moved (see the module docstring)."""
    p = profile
    if knob == "observation":
        return dataclasses.replace(p, observation_tokens=p.observation_tokens.scaled(value))
    if knob == "response":
        return dataclasses.replace(p, response_tokens=p.response_tokens.scaled(value))
    if knob == "env":
        return dataclasses.replace(
            p,
            env_latency_s=p.env_latency_s.scaled(value),
            env_overhead_s=p.env_overhead_s * value,
            env_setup_s=p.env_setup_s.scaled(value),
            reward_latency_s=p.reward_latency_s.scaled(value),
        )
    if knob == "trajectories":
        tasks = max(1, round(value * workers / p.group_size))
        return dataclasses.replace(p, num_tasks=tasks)
    if knob == "context":
        return dataclasses.replace(p, max_context_tokens=int(value))
    if knob == "reuse":
        if value == "append":
            return dataclasses.replace(p, observation_window=None)
        if value == "window":
            return p
        raise ValueError(f"reuse must be 'window' or 'append', got {value!r}")
    raise ValueError(f"unknown knob {knob!r}; valid: {', '.join(KNOBS)}")


@dataclass(slots=True, frozen=True)
class Cell:
    """One workload of a map and what replaying its batch showed."""

    values: dict
    selection: StepSelection

    def _colocated_s(self) -> float:
        return next(c.simulated_s for c in self.selection.candidates if c.label.endswith("C"))

    def _best_split(self):
        splits = [c for c in self.selection.candidates if not c.label.endswith("C")]
        return min(splits, key=lambda c: c.simulated_s)

    @property
    def best_split(self) -> str:
        return self._best_split().label

    @property
    def best_split_gain(self) -> float:
        """The best split's makespan gain over colocation (negative: colocation wins)."""
        return 1 - self._best_split().simulated_s / self._colocated_s()

    @property
    def chosen_gain(self) -> float:
        """The engine's pick's gain over colocation (0 when it picks colocation)."""
        return 1 - self.selection.chosen_outcome.simulated_s / self._colocated_s()

    def to_dict(self) -> dict:
        return {
            "values": self.values,
            "best_split": self.best_split,
            "best_split_gain": self.best_split_gain,
            "chosen": self.selection.chosen,
            "chosen_gain": self.chosen_gain,
            "selection": self.selection.to_dict(),
        }


def evaluate_cell(
    cost: CostModel,
    profile: AgenticProfile,
    engine: SimEngineConfig,
    workers: int,
    values: dict,
    seed: int = 0,
    decision: DecisionConfig | None = None,
) -> Cell:
    """Move the knobs in ``values`` on ``profile`` and replay one batch on every topology."""
    for knob, value in values.items():
        profile = apply_knob(profile, knob, value, workers)
    need = profile.max_context_tokens
    if engine.max_model_len is not None and need > engine.max_model_len:
        raise ValueError(
            f"context {need} tokens exceeds the engine's max_model_len {engine.max_model_len}"
        )
    selection = select_and_replay(cost, profile, engine, workers, 1, seed, decision)
    return Cell(dict(values), selection)


def heatmap(
    cells: list[Cell],
    x: str,
    y: str,
    title: str,
    path_stem,
    log: Callable[[str], None] = lambda line: None,
) -> list[str]:
    """Draw the best split's gain over colocation as a heatmap (PNG and SVG); each square
    names the best split, its gain and the engine's pick's gain. Returns the files."""
    import matplotlib  # import time

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # import time

    xs = list(dict.fromkeys(c.values[x] for c in cells))
    ys = list(dict.fromkeys(c.values[y] for c in cells))
    grid = np.full((len(ys), len(xs)), math.nan)
    fig, ax = plt.subplots(figsize=(1.9 * len(xs) + 2, 1.2 * len(ys) + 1.6))
    for c in cells:
        i, j = ys.index(c.values[y]), xs.index(c.values[x])
        grid[i, j] = 100 * c.best_split_gain
        ax.text(
            j,
            i,
            f"{c.best_split} {100 * c.best_split_gain:+.1f}%\npick {c.selection.chosen} "
            f"{100 * c.chosen_gain:+.1f}%",
            ha="center",
            va="center",
            fontsize=8,
        )
    bound = max(10.0, float(np.nanmax(np.abs(grid))))
    im = ax.imshow(grid, cmap="RdBu", vmin=-bound, vmax=bound, origin="lower", aspect="auto")
    ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ax.set_yticks(range(len(ys)), [str(v) for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="best split's makespan gain over colocation (%)")
    fig.tight_layout()
    files = []
    for ext in ("png", "svg"):
        out = f"{path_stem}.{ext}"
        fig.savefig(out, dpi=110)
        files.append(out)
    plt.close(fig)
    log(f"wrote {', '.join(files)}")
    return files
