"""Length and latency distributions of workload profiles (fixed, uniform, log-normal,
choice, mixture), validated, and written in YAML/JSON as ``{kind: ..., ...}``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
import pydantic

from pearl.errors import ConfigError
from pearl.workloads.batch import _is_int


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


@dataclass(slots=True, frozen=True)
class Fixed:
    """Always ``value``."""

    value: float
    kind: Literal["fixed"] = "fixed"

    def __post_init__(self) -> None:
        _check(math.isfinite(self.value), f"Fixed.value must be finite, got {self.value!r}")

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value."""
        return float(self.value)

    def scaled(self, factor: float) -> Fixed:
        """The distribution of ``factor * X``."""
        return Fixed(self.value * factor)


@dataclass(slots=True, frozen=True)
class Uniform:
    """Continuous uniform on [low, high]."""

    low: float
    high: float
    kind: Literal["uniform"] = "uniform"

    def __post_init__(self) -> None:
        _check(
            math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high,
            f"Uniform needs finite low <= high, got low={self.low!r} high={self.high!r}",
        )

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value."""
        return float(rng.uniform(self.low, self.high))

    def scaled(self, factor: float) -> Uniform:
        """The distribution of ``factor * X``."""
        return Uniform(self.low * factor, self.high * factor)


@dataclass(slots=True, frozen=True)
class UniformInt:
    """Integer uniform on [low, high], both inclusive."""

    low: int
    high: int
    kind: Literal["uniform_int"] = "uniform_int"

    def __post_init__(self) -> None:
        _check(
            _is_int(self.low) and _is_int(self.high) and self.low <= self.high,
            f"UniformInt needs int low <= high, got low={self.low!r} high={self.high!r}",
        )

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value."""
        return float(rng.integers(self.low, self.high + 1))

    def scaled(self, factor: float) -> UniformInt:
        """Approximately ``factor * X`` (bounds rounded to ints, high kept >= low)."""
        low = max(0, round(self.low * factor))
        return UniformInt(low, max(low, round(self.high * factor)))


@dataclass(slots=True, frozen=True)
class LogNormal:
    """LogNormal with the given median and log-space sigma, clipped to [low, high] (high None = open)."""

    median: float
    sigma: float
    low: float = 0.0
    high: float | None = None
    kind: Literal["lognormal"] = "lognormal"

    def __post_init__(self) -> None:
        _check(
            self.median > 0 and math.isfinite(self.median),
            f"LogNormal.median must be > 0, got {self.median!r}",
        )
        _check(
            self.sigma >= 0 and math.isfinite(self.sigma),
            f"LogNormal.sigma must be >= 0, got {self.sigma!r}",
        )
        _check(
            self.high is None or self.low <= self.high,
            f"LogNormal needs low <= high, got low={self.low!r} high={self.high!r}",
        )

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value."""
        value = self.median * math.exp(self.sigma * float(rng.standard_normal()))
        value = max(self.low, value)
        return value if self.high is None else min(self.high, value)

    def scaled(self, factor: float) -> LogNormal:
        """The distribution of ``factor * X`` (clip bounds scaled too)."""
        high = None if self.high is None else self.high * factor
        return LogNormal(self.median * factor, self.sigma, self.low * factor, high)


@dataclass(slots=True, frozen=True)
class Choice:
    """One of ``values`` with probabilities proportional to ``weights``."""

    values: tuple[float, ...]
    weights: tuple[float, ...]
    kind: Literal["choice"] = "choice"

    def __post_init__(self) -> None:
        _check(
            len(self.values) == len(self.weights) and len(self.values) > 0,
            f"Choice needs as many weights as values (>0), got {len(self.values)} values "
            f"and {len(self.weights)} weights",
        )
        _check(
            all(w >= 0 for w in self.weights) and sum(self.weights) > 0,
            f"Choice.weights must be >= 0 with a positive sum, got {self.weights!r}",
        )

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value."""
        return float(self.values[_pick(rng, self.weights)])

    def scaled(self, factor: float) -> Choice:
        """The distribution of ``factor * X``."""
        return Choice(tuple(v * factor for v in self.values), self.weights)


SimpleDist = Annotated[
    Fixed | Uniform | UniformInt | LogNormal | Choice, pydantic.Field(discriminator="kind")
]


@dataclass(slots=True, frozen=True)
class Mixture:
    """Draw from ``components[i]`` with probability proportional to ``weights[i]``."""

    components: tuple[SimpleDist, ...]
    weights: tuple[float, ...]
    kind: Literal["mixture"] = "mixture"

    def __post_init__(self) -> None:
        _check(
            len(self.components) == len(self.weights) and len(self.components) > 0,
            f"Mixture needs as many weights as components (>0), got {len(self.components)} "
            f"components and {len(self.weights)} weights",
        )
        _check(
            all(w >= 0 for w in self.weights) and sum(self.weights) > 0,
            f"Mixture.weights must be >= 0 with a positive sum, got {self.weights!r}",
        )

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value."""
        return self.components[_pick(rng, self.weights)].sample(rng)

    def scaled(self, factor: float) -> Mixture:
        """The distribution of ``factor * X``."""
        return Mixture(tuple(c.scaled(factor) for c in self.components), self.weights)


Dist = Annotated[
    Fixed | Uniform | UniformInt | LogNormal | Choice | Mixture,
    pydantic.Field(discriminator="kind"),
]


def _pick(rng: np.random.Generator, weights: Sequence[float]) -> int:
    u = float(rng.random()) * sum(weights)
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w
        if u < acc:
            return i
    return len(weights) - 1


def _tokens(dist: Any, rng: np.random.Generator, low: int, high: int | None = None) -> int:
    value = max(low, round(dist.sample(rng)))
    return value if high is None else min(high, value)


# ---------------------------------------------------------------------------
# Profiles
# ---------------------------------------------------------------------------
