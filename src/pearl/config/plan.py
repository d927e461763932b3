"""``pearl plan``'s configuration: an RL experiment over a grid of reserved pool sizes and
TP degrees, on recorded or generated spot traces, priced."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from pearl.config.loading import Section, check_ray_address
from pearl.config.simulate import RLExperimentConfig


class SpotSection(Section):
    """A spot market described by its size and churn instead of recorded traces."""

    max_available: int = Field(12, ge=1, description="preemptible GPUs the market offers at most")
    changes_per_hour: float = Field(
        8.0, gt=0, le=3600, description="availability changes per hour (churn)"
    )
    traces: int = Field(3, ge=1, le=100, description="random traces drawn (seeds 0..n-1)")
    duration_s: float = Field(7200.0, gt=0, le=1e8, description="each trace's length")


class PlanSection(Section):
    reserved_gpus: list[int] = Field(
        default_factory=lambda: [4, 8, 16], description="reserved rollout pool sizes to try"
    )
    tp: list[int] = Field(default_factory=lambda: [2], description="TP degrees to try")
    price_reserved: float = Field(
        2.0, gt=0, description="price of a reserved (on-demand) GPU, per GPU-hour"
    )
    price_preemptible: float = Field(
        0.8, gt=0, description="price of a preemptible (spot) GPU, per GPU-hour"
    )
    currency: str = Field("USD", description="the prices' currency, for the tables")
    spot: SpotSection | None = Field(
        None,
        description="draw availability from a spot-market model (max_available, "
        "changes_per_hour) instead of elastic.segments",
    )
    check_seeds: int = Field(
        2, ge=0, le=10, description="other workload seeds the best two configurations re-run on"
    )
    ray_address: str | None = Field(
        None,
        description="run the grid's runs as Ray tasks on this cluster ('auto', or the head's "
        "host:port; every node needs this PEARL installed); unset: `processes` local processes",
    )

    @field_validator("reserved_gpus", "tp")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if not value or min(value) < 1:
            raise ValueError(f"needs at least one value, each >= 1; got {value}")
        return sorted(set(value))

    @field_validator("ray_address")
    @classmethod
    def _ray_address(cls, value: str | None) -> str | None:
        return check_ray_address(value)


class PlanConfig(RLExperimentConfig):
    """``pearl plan``: the policies over a grid of reserved pool sizes and TP degrees, priced."""

    kind: Literal["plan"] = "plan"  # type: ignore[assignment]
    plan: PlanSection = Field(default_factory=PlanSection)
