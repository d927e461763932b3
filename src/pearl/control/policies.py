"""Rollout-resource policies: PEARL, its ablations and the baselines it is measured against.

A policy is three choices, each a switch in the Elastic Scheduler:

- ``pool``: which rollout GPUs exist. ``reserved`` is ROLL's fixed pool; ``fixed`` is a
  larger fixed pool (ROLL-Large: the segment's mean rollout GPUs, rounded up to whole
  workers); ``elastic`` follows the availability trace (reserved + preemptible).
- ``pd``: how prefill and decode are placed. ``colocated`` always; ``static`` a fixed P:D
  ratio applied to whatever workers exist; ``adaptive`` PEARL's decision engine, refitted
  from telemetry after every step; ``disaggregated`` the same engine restricted to P:D splits
  (forced disaggregation, the first rung of the paper's ablation ladder, Fig 7).
- ``borrowing``: intra-scale use of training GPUs between updates. ``off``; ``ungated``
  borrows after every update; ``gated`` only when ``(R/B)(T_ded - T_full) > T_toggle``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from pearl.errors import ConfigError


class Pool(enum.StrEnum):
    RESERVED = "reserved"
    FIXED = "fixed"
    ELASTIC = "elastic"


class PDMode(enum.StrEnum):
    COLOCATED = "colocated"
    STATIC = "static"
    ADAPTIVE = "adaptive"
    DISAGGREGATED = "disaggregated"


class Borrowing(enum.StrEnum):
    OFF = "off"
    UNGATED = "ungated"
    GATED = "gated"


class WeightUpdate(enum.StrEnum):
    """What happens to turns in flight when new weights reach the rollout workers.

    ``continue``: they keep decoding, under the new weights from the next iteration on
    (SGLang's update_weights between two iterations). ``abort_restart``: routing is
    suspended, every in-flight turn is aborted and re-issued from its start once the
    weights are in, its partial output dropped (ROLL's agentic rollout at every training
    step, alibaba/ROLL@8eb27cc ``rollout_scheduler.py:627-630``, ``traj_env_manager.py:125,
    241-242``; docs/baselines.md). ``abort_resume``: aborted the same way, but resumed from
    the tokens already generated (PEARL §5: interrupted requests keep their prefix)."""

    CONTINUE = "continue"
    ABORT_RESTART = "abort_restart"
    ABORT_RESUME = "abort_resume"


@dataclass(slots=True, frozen=True)
class Policy:
    name: str
    pool: Pool
    pd: PDMode
    borrowing: Borrowing
    static_split: tuple[int, int] = (1, 1)
    """``static`` only: the P:D ratio, scaled to the workers available (at least 1 of each)."""
    fixed_rollout_gpus: int | None = None
    """``fixed`` only: the pool size; None: the trace's mean rollout GPUs, rounded up to
    whole workers (ROLL-Large)."""
    weight_update: WeightUpdate = WeightUpdate.CONTINUE
    """In-flight turns at a weight update (``WeightUpdate``); the router resumes or restarts
    every interrupted turn (shrinks, role changes) the same way."""
    description: str = ""
    title: str = ""
    """The name tables and figures show (the paper's: ROLL, RLBoost+, PEARL ...)."""

    def __post_init__(self) -> None:
        p, d = self.static_split
        if p < 1 or d < 1:
            raise ConfigError(f"policy {self.name}: static_split must be >= 1:1, got {p}:{d}")
        if self.fixed_rollout_gpus is not None and self.fixed_rollout_gpus < 1:
            raise ConfigError(
                f"policy {self.name}: fixed_rollout_gpus must be >= 1, "
                f"got {self.fixed_rollout_gpus}"
            )

    @property
    def reads_trace(self) -> bool:
        """Whether a run depends on the availability trace: an elastic pool follows it, a
        fixed pool is sized from its mean; a reserved pool never looks at it, so its runs
        on different traces are one run."""
        return self.pool is not Pool.RESERVED

    def static_counts(self, workers: int) -> tuple[int, int]:
        """``(N_P, N_D)`` for ``workers`` >= 2 under the static ratio."""
        p, d = self.static_split
        n_p = min(workers - 1, max(1, round(workers * p / (p + d))))
        return n_p, workers - n_p

    def pool_workers(
        self, reserved_gpus: int, max_preemptible_gpus: int, mean_preemptible_gpus: float, tp: int
    ) -> int:
        """Workers of a non-elastic pool (``reserved`` or ``fixed``)."""
        if self.pool is Pool.RESERVED:
            return reserved_gpus // tp
        if self.fixed_rollout_gpus is not None:
            return self.fixed_rollout_gpus // tp
        gpus = reserved_gpus + min(mean_preemptible_gpus, max_preemptible_gpus)
        return math.ceil(gpus / tp - 1e-9)


POLICIES: Mapping[str, Policy] = MappingProxyType(
    {
        p.name: p
        for p in (
            Policy(
                "roll",
                Pool.RESERVED,
                PDMode.COLOCATED,
                Borrowing.OFF,
                description="ROLL: the reserved rollout GPUs only, colocated",
                title="ROLL",
            ),
            Policy(
                "roll-large",
                Pool.FIXED,
                PDMode.COLOCATED,
                Borrowing.OFF,
                description="ROLL-Large: a fixed pool of the trace's mean rollout GPUs, colocated",
                title="ROLL-Large",
            ),
            Policy(
                "rlboost",
                Pool.ELASTIC,
                PDMode.COLOCATED,
                Borrowing.OFF,
                description="RLBoost+: inter-scale elastic, colocated, no borrowing",
                title="RLBoost+",
            ),
            Policy(
                "static-pd",
                Pool.ELASTIC,
                PDMode.STATIC,
                Borrowing.OFF,
                description="inter-scale elastic with a fixed 1:1 P:D ratio, no borrowing",
                title="static PD",
            ),
            Policy(
                "pearl-pd",
                Pool.ELASTIC,
                PDMode.ADAPTIVE,
                Borrowing.OFF,
                description="PEARL ablation: adaptive PD only (no borrowing)",
                title="PEARL (adaptive PD only)",
            ),
            Policy(
                "pearl-ungated",
                Pool.ELASTIC,
                PDMode.ADAPTIVE,
                Borrowing.UNGATED,
                description="PEARL ablation: adaptive PD + borrowing after every update",
                title="PEARL (ungated borrowing)",
            ),
            Policy(
                "pearl",
                Pool.ELASTIC,
                PDMode.ADAPTIVE,
                Borrowing.GATED,
                description="PEARL: adaptive PD + gated borrowing of training GPUs",
                title="PEARL",
            ),
        )
    }
)


def get_policy(name: str, **overrides) -> Policy:
    """A named policy, optionally with fields replaced (e.g. ``static_split=(1, 2)``)."""
    try:
        policy = POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}") from None
    return replace(policy, **overrides) if overrides else policy


def display_name(name: str) -> str:
    """What tables and figures call a policy: the paper's name where it has one."""
    policy = POLICIES.get(name)
    return policy.title if policy is not None and policy.title else name
