"""The decision model against hindsight: what the PD Decision Engine chose for a batch vs
the best of replaying that batch under colocation and under every P:D split.

Online, the engine decides step i's topology from what the tracker refitted on step i-1.
Here step i-1 runs colocated (the tracker observes its iterations and trajectories),
the engine predicts every candidate for N workers, and step i's batch is replayed on
every candidate with the same seeds. The gap between the chosen candidate's simulated
makespan and the best one's measures the decision model itself.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from pearl.control.decision import DecisionConfig, decide
from pearl.control.deployment import Deployment
from pearl.control.makespan import paper_makespan
from pearl.control.tracker import RuntimeTracker
from pearl.sim.costmodel import CostModel
from pearl.sim.fixed import deployments_for, simulate_fixed_rollout
from pearl.sim.worker import SimEngineConfig
from pearl.sim.world import iteration_observer, prior_params
from pearl.workloads.agentic import step_batch
from pearl.workloads.profiles import AgenticProfile


@dataclass(slots=True, frozen=True)
class CandidateOutcome:
    label: str
    predicted_s: float
    simulated_s: float | None  # None: infeasible for the model and not replayed
    feasible: bool
    paper_s: float = math.nan  # the paper's closed form (Eqs. 1-3) on the same parameters


@dataclass(slots=True, frozen=True)
class StepSelection:
    """One step: every candidate, the engine's choice and the hindsight best."""

    step: int
    workers: int
    candidates: tuple[CandidateOutcome, ...]
    chosen: str

    @property
    def best(self) -> CandidateOutcome:
        return min(
            (c for c in self.candidates if c.simulated_s is not None),
            key=lambda c: c.simulated_s,
        )

    @property
    def chosen_outcome(self) -> CandidateOutcome:
        return next(c for c in self.candidates if c.label == self.chosen)

    @property
    def gap(self) -> float:
        """Chosen simulated makespan over the best one, minus 1 (0: the engine was right)."""
        return self.chosen_outcome.simulated_s / self.best.simulated_s - 1

    @classmethod
    def from_dict(cls, data: dict) -> StepSelection:
        """A selection back from its ``to_dict`` form (e.g. a saved JSON row)."""
        candidates = tuple(
            CandidateOutcome(
                c["topology"],
                c["predicted_s"],
                c["simulated_s"],
                c["feasible"],
                c.get("paper_s", math.nan),
            )
            for c in data["candidates"]
        )
        return cls(data["step"], data["workers"], candidates, data["chosen"])

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "workers": self.workers,
            "chosen": self.chosen,
            "best": self.best.label,
            "gap": self.gap,
            "candidates": [
                {
                    "topology": c.label,
                    "predicted_s": c.predicted_s,
                    "simulated_s": c.simulated_s,
                    "feasible": c.feasible,
                    "paper_s": c.paper_s,
                }
                for c in self.candidates
            ],
        }


def model_accuracy(steps: list[StepSelection], paper: bool = False) -> dict[str, float]:
    """How well the makespan model (``paper``: the paper's closed forms) predicts the
    replay: the median predicted / replayed makespan over every replayed candidate,
    separately for colocated and disaggregated ones (a model whose error favours one mode
    picks it wrongly), its range, and the share of candidate pairs of a step the model
    orders as the replay does (1.0: ranking kept)."""
    ratios: dict[str, list[float]] = {"colocated": [], "disaggregated": []}
    agree = pairs = 0
    for sel in steps:
        replayed = [c for c in sel.candidates if c.simulated_s]
        predicted = {c.label: c.paper_s if paper else c.predicted_s for c in replayed}
        for c in replayed:
            mode = "colocated" if c.label.endswith("C") else "disaggregated"
            ratios[mode].append(predicted[c.label] / c.simulated_s)
        for i, a in enumerate(replayed):
            for b in replayed[i + 1 :]:
                pairs += 1
                agree += (predicted[a.label] < predicted[b.label]) == (
                    a.simulated_s < b.simulated_s
                )
    out: dict[str, float] = {}
    for m, r in ratios.items():
        out[f"median_ratio_{m}"] = statistics.median(r) if r else math.nan
        out[f"min_ratio_{m}"] = min(r, default=math.nan)
        out[f"max_ratio_{m}"] = max(r, default=math.nan)
    out["pairs_ordered_as_replayed"] = agree / pairs if pairs else math.nan
    return out


def select_and_replay(
    cost: CostModel,
    profile: AgenticProfile,
    engine: SimEngineConfig,
    workers: int,
    step: int,
    seed: int = 0,
    decision: DecisionConfig | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> StepSelection:
    """Fit on batch ``step - 1`` (colocated), decide for ``workers``, replay batch ``step``
    on every candidate (infeasible splits too, so the model's feasibility is checked)."""
    if step < 1:
        raise ValueError(f"step must be >= 1 (the decision uses step - 1), got {step}")
    bandwidth = cost.tp * cost.gpu.network_bandwidth_Bps
    tracker = RuntimeTracker(prior_params(cost, profile, engine, bandwidth))
    observe = iteration_observer(tracker)

    def batch(i: int):
        return step_batch(profile, seed, i)

    vocab = cost.model.vocab_size
    previous = simulate_fixed_rollout(
        batch(step - 1), cost, Deployment(colocated=workers), engine, vocab, on_iteration=observe
    )
    for traj in previous.result.trajectories:
        tracker.observe_result(traj)
    params = tracker.end_step(profile.batch_size, previous.result.makespan_s)
    choice = decide(params, workers, None, decision or DecisionConfig())
    predicted = {c.topology.label: c for c in choice.candidates}
    outcomes = []
    current = batch(step)
    for deployment in deployments_for(workers):
        label = deployment.label
        c = predicted[label]
        report = simulate_fixed_rollout(current, cost, deployment, engine, vocab)
        log(
            f"  step {step} {label:>6}: predicted {c.makespan_s:8.1f} s, simulated "
            f"{report.makespan_s:8.1f} s{'' if c.feasible else ' (infeasible for the model)'}"
        )
        outcomes.append(
            CandidateOutcome(
                label,
                c.makespan_s,
                report.makespan_s,
                c.feasible,
                paper_makespan(params, deployment.topology),
            )
        )
    return StepSelection(step, workers, tuple(outcomes), choice.target.label)
