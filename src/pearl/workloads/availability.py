"""Preemptible-GPU availability over time: file format, real Bamboo segments, synthetic traces.

An availability trace is a right-continuous step function: the number of preemptible
instances available from each change time until the next. **One instance is one
GPU** by default; a run config that deploys TP-degree groups may instead read an
instance as one TP group, or convert with :meth:`AvailabilityTrace.scale` (e.g.
``scale(1 / tp)`` turns GPUs into whole TP groups).

File format (CSV, also the Bamboo files unchanged): one ``time,available`` pair per
line; a value holds from its time until the next line's time; pairs with equal times
mark a jump (the last of them wins); the last line's time is the end of the data.
An optional first line ``time_s,available`` (or ``time_min``/``time_h``) declares the
time unit; a file without one is in seconds unless the caller passes ``time_unit``
(the Bamboo hours file: ``time_unit=TimeUnit.HOURS``). Blank lines and ``#`` comments
are skipped. Times are stored in seconds.

The real data shipped in ``data/availability`` are Bamboo's two g4dn traces (at most
12 instances); :func:`load_segment` returns the three named two-hour segments PEARL's
evaluation replays (see that folder's README).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path
from types import MappingProxyType

import numpy as np

from pearl.errors import ConfigError, TraceFormatError, WorkloadError
from pearl.workloads.text_files import read_trace_text

__all__ = [
    "SEGMENTS",
    "AvailabilityTrace",
    "ChangeModel",
    "Segment",
    "SyntheticAvailability",
    "TimeUnit",
    "dumps_availability",
    "load_availability",
    "load_segment",
    "load_shipped",
    "parse_availability",
    "save_availability",
    "shipped_files",
    "synthetic_availability",
]


class TimeUnit(StrEnum):
    """Unit of the time column of an availability file."""

    SECONDS = "s"
    MINUTES = "min"
    HOURS = "h"

    @property
    def seconds(self) -> float:
        """Seconds per unit."""
        return {"s": 1.0, "min": 60.0, "h": 3600.0}[self.value]


@dataclass(slots=True, frozen=True)
class AvailabilityTrace:
    """Available instances as a step function on [times_s[0], end_s]; the last value holds after.

    ``values[i]`` holds from ``times_s[i]`` until ``times_s[i + 1]``. Invariants: times
    strictly increasing, consecutive values different (only real changes are stored),
    values >= 0, ``end_s >= times_s[-1]``. Build from raw points with :meth:`from_points`.
    """

    times_s: tuple[float, ...]
    values: tuple[int, ...]
    end_s: float
    source: str = ""

    def __post_init__(self) -> None:
        where = f"AvailabilityTrace({self.source or 'unnamed'})"
        if not self.times_s or len(self.times_s) != len(self.values):
            raise WorkloadError(
                f"{where}: needs as many times as values (>= 1), got {len(self.times_s)} times "
                f"and {len(self.values)} values"
            )
        for i, (t, v) in enumerate(zip(self.times_s, self.values, strict=True)):
            if not math.isfinite(t):
                raise WorkloadError(f"{where}: times_s[{i}] must be finite, got {t!r}")
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise WorkloadError(f"{where}: values[{i}] must be an int >= 0, got {v!r}")
            if i and t <= self.times_s[i - 1]:
                raise WorkloadError(
                    f"{where}: times_s must increase strictly; times_s[{i}]={t} after "
                    f"{self.times_s[i - 1]}"
                )
            if i and v == self.values[i - 1]:
                raise WorkloadError(
                    f"{where}: values[{i}]={v} repeats values[{i - 1}]; store changes only "
                    "(use AvailabilityTrace.from_points)"
                )
        if not (math.isfinite(self.end_s) and self.end_s >= self.times_s[-1]):
            raise WorkloadError(
                f"{where}: end_s must be finite and >= the last change time "
                f"{self.times_s[-1]}, got {self.end_s!r}"
            )

    @classmethod
    def from_points(
        cls, points: Iterable[tuple[float, int]], end_s: float | None = None, source: str = ""
    ) -> AvailabilityTrace:
        """A trace from (time_s, value) points in non-decreasing time; equal times: the last wins.

        ``end_s`` defaults to the last point's time.
        """
        times: list[float] = []
        values: list[int] = []
        last_time: float | None = None
        for t, v in points:
            t = float(t)
            if last_time is not None and t < last_time:
                raise WorkloadError(
                    f"AvailabilityTrace({source or 'unnamed'}): point times must not decrease; "
                    f"{t} after {last_time}"
                )
            last_time = t
            if times and times[-1] == t:
                # Same instant: this point replaces the previous one (Bamboo marks jumps so).
                times.pop()
                values.pop()
            if values and values[-1] == v:
                continue
            times.append(t)
            values.append(v)
        if last_time is None:
            raise WorkloadError(f"AvailabilityTrace({source or 'unnamed'}): no points")
        return cls(tuple(times), tuple(values), last_time if end_s is None else end_s, source)

    @classmethod
    def constant(cls, value: int, duration_s: float, source: str = "") -> AvailabilityTrace:
        """``value`` instances throughout [0, duration_s] (a fixed-size baseline)."""
        return cls((0.0,), (value,), float(duration_s), source or f"constant {value}")

    @property
    def start_s(self) -> float:
        """Time of the first value."""
        return self.times_s[0]

    @property
    def duration_s(self) -> float:
        """Length of the data, ``end_s - start_s``."""
        return self.end_s - self.start_s

    @property
    def max_value(self) -> int:
        """Largest number of instances ever available."""
        return max(self.values)

    @property
    def min_value(self) -> int:
        """Smallest number of instances ever available."""
        return min(self.values)

    def value_at(self, t: float) -> int:
        """Instances available at time ``t``; at a change time, the new value. Holds after end_s."""
        if t < self.start_s:
            raise WorkloadError(
                f"AvailabilityTrace({self.source or 'unnamed'}): time {t} is before the trace "
                f"starts at {self.start_s}"
            )
        return self.values[bisect.bisect_right(self.times_s, t) - 1]

    def changes(self) -> tuple[tuple[float, int], ...]:
        """(time, new value) for every change after the start (the start value is ``values[0]``)."""
        return tuple(zip(self.times_s[1:], self.values[1:], strict=True))

    def window(self, start_s: float, duration_s: float) -> AvailabilityTrace:
        """The part [start_s, start_s + duration_s), re-based to start at 0; must lie in the data."""
        end = start_s + duration_s
        if duration_s <= 0 or start_s < self.start_s or end > self.end_s:
            raise WorkloadError(
                f"AvailabilityTrace({self.source or 'unnamed'}): window [{start_s}, {end}] "
                f"must have positive length and lie within the data [{self.start_s}, {self.end_s}]"
            )
        lo = bisect.bisect_right(self.times_s, start_s)
        # Changes in (start, end): one exactly at the end belongs to the next window, so
        # consecutive windows tile the data without counting a change twice.
        hi = bisect.bisect_left(self.times_s, end)
        points = [(0.0, self.value_at(start_s))]
        points += [
            (t - start_s, v) for t, v in zip(self.times_s[lo:hi], self.values[lo:hi], strict=True)
        ]
        name = f"{self.source or 'trace'}[{start_s:g}+{duration_s:g}]"
        return AvailabilityTrace.from_points(points, end_s=float(duration_s), source=name)

    def mean(self, start_s: float | None = None, end_s: float | None = None) -> float:
        """Time-weighted mean over [start_s, end_s] (default: the whole data); a point gives value_at."""
        start = self.start_s if start_s is None else start_s
        end = self.end_s if end_s is None else end_s
        if end < start:
            raise WorkloadError(f"mean(): end_s {end} is before start_s {start}")
        if end == start:
            return float(self.value_at(start))
        area = 0.0
        t = start
        value = self.value_at(start)
        for change_t, change_v in self.changes():
            if change_t <= start:
                continue
            if change_t >= end:
                break
            area += value * (change_t - t)
            t, value = change_t, change_v
        area += value * (end - t)
        return area / (end - start)

    def scale(self, factor: float) -> AvailabilityTrace:
        """Every value times ``factor``, rounded down to whole instances (e.g. 1/TP: GPUs -> TP groups)."""
        if not (factor >= 0 and math.isfinite(factor)):
            raise WorkloadError(f"scale() factor must be a finite number >= 0, got {factor!r}")
        # The epsilon keeps exact products (3 * (1/3)) from flooring one below.
        points = [
            (t, math.floor(v * factor + 1e-9))
            for t, v in zip(self.times_s, self.values, strict=True)
        ]
        return AvailabilityTrace.from_points(points, self.end_s, self.source)

    def cap(self, max_value: int) -> AvailabilityTrace:
        """Every value clipped to at most ``max_value`` (the preemptible GPUs a run may use)."""
        if not isinstance(max_value, int) or max_value < 0:
            raise WorkloadError(f"cap() max_value must be an int >= 0, got {max_value!r}")
        points = [(t, min(v, max_value)) for t, v in zip(self.times_s, self.values, strict=True)]
        return AvailabilityTrace.from_points(points, self.end_s, self.source)


# ---------------------------------------------------------------------------
# File format
# ---------------------------------------------------------------------------


_HEADER_UNITS = {
    "time": None,
    "time_s": TimeUnit.SECONDS,
    "time_min": TimeUnit.MINUTES,
    "time_h": TimeUnit.HOURS,
}


def _fail(source: str, line: int, field: str, message: str) -> TraceFormatError:
    return TraceFormatError(f"{source}:{line}: field {field}: {message}")


def _header_unit(
    fields: list[str], line: str, unit: TimeUnit | None, source: str, number: int
) -> TimeUnit | None:
    """The time unit a header line declares (checked against the caller's ``unit``)."""
    if len(fields) != 2 or fields[1] != "available":
        raise _fail(
            source,
            number,
            "header",
            f"expected 'time_s,available' (or time_min/time_h), got {line!r}",
        )
    declared = _HEADER_UNITS[fields[0]]
    if declared is not None and unit is not None and declared is not unit:
        raise _fail(
            source,
            number,
            "header",
            f"declares unit {declared.value!r} but the caller passed {unit.value!r}",
        )
    return declared or unit


def _data_point(fields: list[str], last_time: float, source: str, number: int) -> tuple[float, int]:
    """A data line's (time, available), checked: two fields, a finite time >= 0 that does
    not decrease, a whole number of instances >= 0."""
    if len(fields) != 2:
        raise _fail(
            source,
            number,
            "(line)",
            f"expected 2 comma-separated fields 'time,available', got {len(fields)}",
        )
    try:
        t = float(fields[0])
    except ValueError:
        raise _fail(source, number, "time", f"not a number: {fields[0]!r}") from None
    if not math.isfinite(t) or t < 0:
        raise _fail(source, number, "time", f"must be a finite number >= 0, got {fields[0]!r}")
    if t < last_time:
        raise _fail(
            source, number, "time", f"times must not decrease: {fields[0]} after {last_time:g}"
        )
    try:
        v = int(fields[1])
    except ValueError:
        raise _fail(
            source,
            number,
            "available",
            f"must be a whole number of instances, got {fields[1]!r}",
        ) from None
    if v < 0:
        raise _fail(source, number, "available", f"must be >= 0, got {v}")
    return t, v


def parse_availability(
    text: str, source: str = "<string>", time_unit: TimeUnit | str | None = None
) -> AvailabilityTrace:
    """Parse availability CSV text; errors raise TraceFormatError with source:line: field."""
    try:
        unit = None if time_unit is None else TimeUnit(time_unit)
    except ValueError:
        raise ConfigError(
            f"time_unit {time_unit!r} is not one of {', '.join(u.value for u in TimeUnit)}"
        ) from None
    points: list[tuple[float, int]] = []
    seen_data = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if not seen_data and fields[0] in _HEADER_UNITS:
            unit = _header_unit(fields, line, unit, source, number)
        else:
            points.append(
                _data_point(fields, points[-1][0] if points else -math.inf, source, number)
            )
        seen_data = True  # a header may only come first
    if not points:
        raise _fail(source, 1, "(file)", "no 'time,available' lines")
    factor = (unit or TimeUnit.SECONDS).seconds
    return AvailabilityTrace.from_points(((t * factor, v) for t, v in points), source=source)


def load_availability(
    source: str | Path, time_unit: TimeUnit | str | None = None
) -> AvailabilityTrace:
    """A shipped segment by name (:data:`SEGMENTS`), else an availability CSV file (PEARL or
    Bamboo format; see :func:`parse_availability`)."""
    if str(source) in SEGMENTS and not Path(source).is_file():
        return load_segment(str(source))
    path = Path(source)
    text = read_trace_text(
        path, f"expected a shipped segment ({', '.join(SEGMENTS)}) or a CSV file"
    )
    return parse_availability(text, str(path), time_unit)


def dumps_availability(trace: AvailabilityTrace) -> str:
    """CSV text with a ``time_s,available`` header; the last line marks end_s. Parses back equal."""
    lines = ["time_s,available"]
    lines += [f"{t!r},{v}" for t, v in zip(trace.times_s, trace.values, strict=True)]
    if trace.end_s > trace.times_s[-1]:
        lines.append(f"{trace.end_s!r},{trace.values[-1]}")
    return "\n".join(lines) + "\n"


def save_availability(trace: AvailabilityTrace, path: str | Path) -> None:
    """Write ``trace`` as CSV (see :func:`dumps_availability`)."""
    Path(path).write_text(dumps_availability(trace), encoding="utf-8")


# ---------------------------------------------------------------------------
# Shipped real data and PEARL's named segments
# ---------------------------------------------------------------------------

_DATA = "data/availability"


def shipped_files() -> tuple[str, ...]:
    """Names of the availability CSVs shipped in the package."""
    folder = resources.files("pearl.workloads").joinpath(_DATA)
    return tuple(sorted(p.name for p in folder.iterdir() if p.name.endswith(".csv")))


def load_shipped(file_name: str) -> AvailabilityTrace:
    """A shipped availability CSV by file name (see :func:`shipped_files`)."""
    if file_name not in shipped_files():
        raise ConfigError(
            f"no shipped availability file {file_name!r}; valid: {', '.join(shipped_files())}"
        )
    text = resources.files("pearl.workloads").joinpath(_DATA, file_name).read_text("utf-8")
    return parse_availability(text, f"pearl/workloads/{_DATA}/{file_name}")


@dataclass(slots=True, frozen=True)
class Segment:
    """A named window of a shipped trace, with the reference statistics it was chosen by."""

    name: str
    file: str
    start_s: float
    duration_s: float
    description: str
    reference_mean_with_reserved: float  # mean rollout GPUs with reserved_gpus added (README)
    reference_changes: int  # value changes strictly after the window's start (README)
    reserved_gpus: int = 4  # PEARL's reserved rollout GPUs (docs/paper.md "How it was evaluated")


_G4DN_1C = "aws-g4dn-xlarge-us-east-1c-2020-11-20.csv"
_G4DN_1D = "aws-g4dn-xlarge-us-east-1d-2020-11-23.csv"

# Segments as described in data/availability/README.md (shipped with the traces).
SEGMENTS: Mapping[str, Segment] = MappingProxyType(
    {
        "segment1": Segment(
            "segment1",
            _G4DN_1D,
            37_800,
            7_200,
            "frequent changes, abundant (PEARL: mean 13.6)",
            13.59,
            16,
        ),
        "segment2": Segment(
            "segment2",
            _G4DN_1C,
            18_900,
            7_200,
            "frequent changes, scarce (PEARL: mean 9.0)",
            8.94,
            15,
        ),
        "segment3": Segment(
            "segment3",
            _G4DN_1D,
            35_400,
            7_200,
            "moderate (PEARL: mean 11.8, fewer changes)",
            11.56,
            14,
        ),
    }
)


def load_segment(name: str) -> AvailabilityTrace:
    """The named two-hour segment (segment1..3) of the shipped Bamboo data, re-based to start at 0."""
    try:
        seg = SEGMENTS[name]
    except KeyError:
        raise ConfigError(
            f"unknown availability segment {name!r}; valid: {', '.join(SEGMENTS)}"
        ) from None
    trace = load_shipped(seg.file).window(seg.start_s, seg.duration_s)
    return AvailabilityTrace(trace.times_s, trace.values, trace.end_s, source=name)


# ---------------------------------------------------------------------------
# Synthetic traces
# ---------------------------------------------------------------------------


class ChangeModel(StrEnum):
    """How the available count moves at each change event."""

    JUMP = "jump"  # to any other level in [0, max], uniformly (Bamboo's traces jump by several)
    RANDOM_WALK = "random_walk"  # up or down by 1..max_step, reflected at 0 and max
    TWO_LEVEL = "two_level"  # alternate between low_level and high_level (a two-state Markov chain)


@dataclass(slots=True, frozen=True)
class SyntheticAvailability:
    """Poisson change events at rate 1/mean_change_interval_s; each moves the count per ``model``.

    Every event changes the value, so the expected number of changes is
    ``duration_s / mean_change_interval_s``. Defaults mimic a Bamboo segment: two hours,
    up to 12 instances, ~16 changes (segment1).
    """

    duration_s: float = 7_200.0
    max_available: int = 12
    mean_change_interval_s: float = 450.0
    model: ChangeModel = ChangeModel.JUMP
    initial: int | None = None  # None: drawn uniformly from [0, max_available] (two_level: a level)
    max_step: int = 3  # RANDOM_WALK only
    low_level: int = 2  # TWO_LEVEL only
    high_level: int = 10  # TWO_LEVEL only

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(f"SyntheticAvailability.{message}")

        check(
            self.duration_s > 0 and math.isfinite(self.duration_s),
            f"duration_s must be > 0, got {self.duration_s!r}",
        )
        check(
            isinstance(self.max_available, int) and self.max_available >= 1,
            f"max_available must be an int >= 1, got {self.max_available!r}",
        )
        check(
            self.mean_change_interval_s > 0,
            f"mean_change_interval_s must be > 0, got {self.mean_change_interval_s!r}",
        )
        check(
            self.initial is None or 0 <= self.initial <= self.max_available,
            f"initial must be None or in [0, {self.max_available}], got {self.initial!r}",
        )
        check(self.max_step >= 1, f"max_step must be >= 1, got {self.max_step!r}")
        if not isinstance(self.model, ChangeModel):
            object.__setattr__(self, "model", ChangeModel(self.model))
        check(
            self.model is not ChangeModel.TWO_LEVEL
            or 0 <= self.low_level < self.high_level <= self.max_available,
            f"needs 0 <= low_level < high_level <= max_available ({self.max_available}) "
            f"for the two_level model, got {self.low_level!r} and {self.high_level!r}",
        )


def synthetic_availability(config: SyntheticAvailability, seed: int = 0) -> AvailabilityTrace:
    """A random trace on [0, duration_s] within [0, max_available]; the same seed gives the same trace."""
    rng = np.random.default_rng(seed)
    top = config.max_available
    if config.model is ChangeModel.TWO_LEVEL:
        levels = (config.low_level, config.high_level)
        value = config.initial if config.initial is not None else levels[int(rng.integers(2))]
    else:
        value = config.initial if config.initial is not None else int(rng.integers(top + 1))
    points = [(0.0, value)]
    t = 0.0
    while True:
        t += float(rng.exponential(config.mean_change_interval_s))
        if t >= config.duration_s:
            break
        if config.model is ChangeModel.JUMP:
            # Uniform over the other top levels: draw from top values and skip the current one.
            new = int(rng.integers(top))
            value = new if new < value else new + 1
        elif config.model is ChangeModel.RANDOM_WALK:
            step = int(rng.integers(1, config.max_step + 1)) * (1 if rng.random() < 0.5 else -1)
            new = value + step
            if new < 0 or new > top:
                new = value - step  # reflect at the bounds
            value = min(top, max(0, new))
            if value == points[-1][1]:
                continue  # max_step wider than the range: no move this time
        else:
            value = config.high_level if value != config.high_level else config.low_level
        points.append((t, value))
    return AvailabilityTrace.from_points(
        points, end_s=config.duration_s, source=f"synthetic {config.model.value} seed {seed}"
    )
