"""Calibration: time real engine iterations on this machine and fit the cost model to them.

1. :func:`profile_engine` runs a grid of batch shapes (pure prefill chunks, pure decode
   batches, decodes plus a prefill chunk) through a live :class:`LLMEngine`, driving its
   own scheduler so each timed ``engine.step()`` runs exactly the batch asked for, and
   records the shape that ran with its measured seconds.
2. :func:`fit_profile` fits a ``cpu`` :class:`GPUSpec` and :class:`CostConstants` so that
   :meth:`CostModel.iteration_time` predicts those seconds, minimizing log-ratio error:

       t = max(F_lin / R_lin, W / B_w) + max(F_pf / R_attn, K_pf / B_kv)
           + max(F_dec / R_attn, K_dec / B_kv) + o_iter + o_seq * decodes + o_chunk * chunks

   with the work terms (FLOPs F, weight bytes W, KV bytes K) from
   :meth:`CostModel.iteration_work` and seven free parameters: linear and attention FLOP/s
   (R), weight and KV bandwidth (B), and the three overheads (o).
3. :func:`calibrate` does both and saves the profile; :func:`run_calibrate` is what the
   ``pearl calibrate`` command runs.

Profiling needs torch (the ``live`` extra); fitting needs scipy (also in ``live``) but no
torch, so saved samples can be refitted anywhere.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import os
import platform
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from pearl.engine.sequence import Request, SamplingParams
from pearl.errors import ConfigError, EngineStateError
from pearl.sim.costmodel import CostConstants, CostModel, IterationWork
from pearl.sim.hardware import CPU_PLACEHOLDER, GPUSpec
from pearl.sim.models import ModelShape
from pearl.sim.profiles import Profile, save_profile

if TYPE_CHECKING:
    from pearl.engine.engine import LLMEngine
    from pearl.models.config import ModelConfig

PROFILE_DTYPE_BYTES = 4
"""The CPU engine computes and caches in float32."""
DEFAULT_REPEATS = 5
"""Timed repeats per shape; the median one is kept (noise from neighbours on shared cores)."""


Clock = Literal["wall", "cpu"]
"""Which time profiling and fitting use: wall time, or the process's CPU time, i.e. wall
time minus the time other processes held the core. On a dedicated core the two agree; on
a shared machine CPU time is the better estimate of the dedicated wall time (measured
here: neighbours doubled the wall time of whole stretches of shapes, which no cost model
can fit). CPU time assumes one torch thread (more threads add up)."""


CLOCKS: tuple[Clock, ...] = ("wall", "cpu")


def _check_clock(clock: object) -> None:
    if clock not in CLOCKS:
        raise ConfigError(f"clock must be one of {', '.join(CLOCKS)}; got {clock!r}")


class BatchKind(enum.StrEnum):
    """What an iteration holds: prefill chunks only, decodes only, or both."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"


# --- the grid ------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class BatchShape:
    """One iteration to time: ``decodes`` sequences each attending to ``decode_context``
    tokens (the decoded one included), plus ``prefill_chunks`` chunks of ``prefill_tokens``
    new tokens each after ``prefill_prior`` already-cached tokens."""

    decodes: int = 0
    decode_context: int = 0
    prefill_chunks: int = 0
    prefill_tokens: int = 0
    prefill_prior: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"BatchShape.{f.name} must be an integer >= 0, got {value!r}")
        if not self.decodes and not self.prefill_chunks:
            raise ConfigError("BatchShape needs decodes >= 1 or prefill_chunks >= 1, got neither")
        # A decode needs one computed token before it (the first admission step runs at
        # context - 1); a 1-token "chunk" would be scheduled as a decode.
        if self.decodes and self.decode_context < 2:
            raise ConfigError(
                f"BatchShape.decode_context must be >= 2 with decodes, got {self.decode_context}"
            )
        if self.prefill_chunks and self.prefill_tokens < 2:
            raise ConfigError(
                f"BatchShape.prefill_tokens must be >= 2 with prefill chunks, "
                f"got {self.prefill_tokens}"
            )

    @property
    def kind(self) -> BatchKind:
        """Prefill, decode or mixed."""
        if self.decodes and self.prefill_chunks:
            return BatchKind.MIXED
        return BatchKind.DECODE if self.decodes else BatchKind.PREFILL

    @property
    def num_tokens(self) -> int:
        """Tokens through the model in this iteration."""
        return self.decodes + self.prefill_chunks * self.prefill_tokens

    @property
    def num_sequences(self) -> int:
        """Sequences running in this iteration."""
        return self.decodes + self.prefill_chunks

    def max_len(self, repeats: int) -> int:
        """Longest sequence (tokens, the one sampled included) over ``repeats`` timed steps."""
        decode = self.decode_context + repeats if self.decodes else 0
        prefill = self.prefill_prior + self.prefill_tokens + 1 if self.prefill_chunks else 0
        return max(decode, prefill)

    def kv_blocks(self, block_size: int, repeats: int) -> int:
        """KV blocks held at once while this shape is timed ``repeats`` times."""
        decode = -(-(self.decode_context + repeats) // block_size)
        prefill = -(-(self.prefill_prior + self.prefill_tokens) // block_size)
        return self.decodes * decode + self.prefill_chunks * prefill

    def describe(self) -> str:
        """Short human-readable form, e.g. ``16 dec @512 + 1x64 pf @1024``."""
        parts = []
        if self.decodes:
            parts.append(f"{self.decodes} dec @{self.decode_context}")
        if self.prefill_chunks:
            parts.append(f"{self.prefill_chunks}x{self.prefill_tokens} pf @{self.prefill_prior}")
        return " + ".join(parts)


def _prefill(tokens: int, prior: int = 0, chunks: int = 1) -> BatchShape:
    return BatchShape(prefill_chunks=chunks, prefill_tokens=tokens, prefill_prior=prior)


def _decode(batch: int, context: int) -> BatchShape:
    return BatchShape(decodes=batch, decode_context=context)


def _mixed(batch: int, context: int, tokens: int, prior: int) -> BatchShape:
    return BatchShape(batch, context, 1, tokens, prior)


@dataclass(slots=True, frozen=True)
class CalibrationGrid:
    """A named list of batch shapes to time."""

    name: str
    shapes: tuple[BatchShape, ...]

    def __post_init__(self) -> None:
        if not self.shapes:
            raise ConfigError(f"calibration grid {self.name!r} has no shapes")

    @classmethod
    def default(cls) -> CalibrationGrid:
        """53 shapes covering agentic rollouts: chunks up to 512 tokens after priors up to
        2048, decode batches up to 64 at contexts up to 2048, and mixes. With a 16M-parameter
        model and 5 repeats: ~50 s of CPU time (~90 s wall with a busy neighbour core)."""
        prefills = [_prefill(n, p) for p in (0, 256, 1024, 2048) for n in (16, 48, 128, 256, 512)]
        multi = [
            _prefill(128, 0, 2),
            _prefill(96, 0, 4),
            _prefill(64, 512, 4),
            _prefill(256, 1024, 2),
            _prefill(32, 2048, 3),
        ]
        decodes = [_decode(b, c) for b in (1, 2, 4, 8, 16, 32, 64) for c in (64, 512, 2048)]
        mixed = [
            _mixed(4, 512, 64, 0),
            _mixed(4, 512, 256, 1024),
            _mixed(8, 1024, 512, 0),
            _mixed(16, 2048, 128, 0),
            _mixed(32, 512, 64, 0),
            _mixed(32, 512, 256, 1024),
            _mixed(64, 256, 32, 512),
        ]
        return cls("default", tuple(prefills + multi + decodes + mixed))

    @classmethod
    def quick(cls) -> CalibrationGrid:
        """A few seconds on a tiny model (tests, smoke runs); needs max_model_len > 512."""
        prefills = [_prefill(n, p) for p in (0, 256) for n in (16, 64, 256)]
        multi = [_prefill(32, 0, 2), _prefill(32, 128, 3)]
        decodes = [_decode(b, c) for b in (1, 8, 32) for c in (32, 256)]
        mixed = [_mixed(8, 128, 64, 0), _mixed(16, 256, 32, 128)]
        return cls("quick", tuple(prefills + multi + decodes + mixed))

    def max_len(self, repeats: int) -> int:
        """Longest sequence any shape needs."""
        return max(s.max_len(repeats) for s in self.shapes)

    def kv_blocks(self, block_size: int, repeats: int) -> int:
        """KV blocks the largest shape holds at once."""
        return max(s.kv_blocks(block_size, repeats) for s in self.shapes)

    def max_num_tokens(self) -> int:
        """Largest token count of one iteration."""
        return max(s.num_tokens for s in self.shapes)

    def max_num_sequences(self) -> int:
        """Largest sequence count of one iteration."""
        return max(s.num_sequences for s in self.shapes)


GRIDS: dict[str, Callable[[], CalibrationGrid]] = {
    "default": CalibrationGrid.default,
    "quick": CalibrationGrid.quick,
}
"""Built-in grids by name."""


def get_grid(grid: str | CalibrationGrid) -> CalibrationGrid:
    """The built-in grid called ``grid`` (or ``grid`` itself)."""
    if isinstance(grid, CalibrationGrid):
        return grid
    try:
        return GRIDS[grid]()
    except KeyError:
        raise ConfigError(f"unknown calibration grid {grid!r}; known: {', '.join(GRIDS)}") from None


# --- profiling ---------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Sample:
    """One timed iteration: the exact batch the engine ran and its seconds.

    Of the repeats, the median one on the profiling clock (the lower median for an even
    count) is kept: ``seconds`` is its wall time, ``cpu_seconds`` its process CPU time,
    and ``prefills``/``decode_contexts`` its batch, in the cost model's terms.
    """

    prefills: tuple[tuple[int, int], ...]
    """One ``(num_tokens, prior_context)`` per prefill chunk."""
    decode_contexts: tuple[int, ...]
    """Per decoding sequence, the tokens it attends to (itself included)."""
    seconds: float
    repeat_seconds: tuple[float, ...] = ()
    """Every repeat's time, in run order."""
    shape: BatchShape | None = None
    """The grid shape asked for (None for samples made elsewhere)."""
    cpu_seconds: float | None = None
    """CPU time of the process in that repeat: excludes time other processes held the core."""
    repeat_cpu_seconds: tuple[float, ...] = ()

    def time(self, clock: Clock) -> float:
        """``seconds`` for the wall clock, ``cpu_seconds`` for the CPU clock."""
        if clock == "wall":
            return self.seconds
        if clock == "cpu" and self.cpu_seconds is not None:
            return self.cpu_seconds
        raise ConfigError(
            f"sample has no {clock!r} time; clocks are {', '.join(CLOCKS)} (cpu only for "
            f"samples profiled with CPU times)"
        )

    @property
    def kind(self) -> BatchKind:
        """Prefill, decode or mixed."""
        if self.prefills and self.decode_contexts:
            return BatchKind.MIXED
        return BatchKind.DECODE if self.decode_contexts else BatchKind.PREFILL

    def to_dict(self) -> dict[str, Any]:
        """Plain data; decode contexts run-length encoded as ``[context, count]`` pairs."""
        runs: list[list[int]] = []
        for context in self.decode_contexts:
            if runs and runs[-1][0] == context:
                runs[-1][1] += 1
            else:
                runs.append([context, 1])
        out: dict[str, Any] = {
            "kind": self.kind.value,
            "prefills": [list(c) for c in self.prefills],
            "decodes": runs,
            "seconds": self.seconds,
            "repeat_seconds": list(self.repeat_seconds),
        }
        if self.cpu_seconds is not None:
            out["cpu_seconds"] = self.cpu_seconds
            out["repeat_cpu_seconds"] = list(self.repeat_cpu_seconds)
        if self.shape is not None:
            out["shape"] = dataclasses.asdict(self.shape)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "sample") -> Sample:
        """Inverse of :meth:`to_dict`; errors name ``where`` and the field."""
        try:
            prefills = tuple((int(n), int(p)) for n, p in raw["prefills"])
            decodes = tuple(int(c) for c, k in raw["decodes"] for _ in range(int(k)))
            seconds = float(raw["seconds"])
            repeats = tuple(float(s) for s in raw.get("repeat_seconds", ()))
            shape = BatchShape(**raw["shape"]) if raw.get("shape") is not None else None
            cpu = float(raw["cpu_seconds"]) if raw.get("cpu_seconds") is not None else None
            cpu_repeats = tuple(float(s) for s in raw.get("repeat_cpu_seconds", ()))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"{where}: expected prefills [[tokens, prior], ...], decodes "
                f"[[context, count], ...] and seconds ({type(exc).__name__}: {exc})"
            ) from exc
        return cls(prefills, decodes, seconds, repeats, shape, cpu, cpu_repeats)


@contextmanager
def _recording_batches(engine: LLMEngine) -> Iterator[list[tuple[tuple, tuple]]]:
    """Record each iteration's ``(prefills, decode_contexts)`` as ``engine.step`` schedules it.

    Wraps the scheduler instance's ``schedule`` so the timed unit stays ``engine.step()``
    itself; contexts are read right after scheduling, before postprocess appends tokens.
    """
    scheduler = engine.scheduler
    schedule = scheduler.schedule
    batches: list[tuple[tuple, tuple]] = []

    def recording_schedule(*args: Any, **kwargs: Any) -> Any:
        out = schedule(*args, **kwargs)
        batches.append(
            (
                tuple((c.num_tokens, c.start) for c in out.prefills),
                tuple(s.num_tokens for s in out.decodes),
            )
        )
        return out

    scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    try:
        yield batches
    finally:
        del scheduler.schedule  # the class's method shows through again


class _Prober:
    """Puts sequences into an idle engine with a chosen amount of already-computed KV."""

    def __init__(self, engine: LLMEngine, sampling: SamplingParams, seed: int) -> None:
        self.engine = engine
        self.sampling = sampling
        self.rng = np.random.default_rng(seed)
        self.vocab = engine.model_config.vocab_size
        self.counter = 0
        self.request_ids: list[str] = []

    def tokens(self, n: int) -> list[int]:
        # Fresh random tokens, so the prefix cache never serves a probe from another one.
        return self.rng.integers(0, self.vocab, size=n).tolist()

    def add(self, computed: int, uncomputed: int) -> str:
        """Queue a request whose first ``computed`` tokens are already in the KV cache.

        The computed part is registered as an imported session (blocks reserved, no
        model run): the KV values do not change timings, and computing long contexts
        for real would cost minutes.
        """
        self.counter += 1
        rid = f"calibration-{self.counter}"
        prior = self.tokens(computed)
        if computed:
            self.engine.scheduler.import_session(rid, 0, prior, [])
        self.request_ids.append(rid)  # before add_request, so cleanup also frees the session
        session = rid if computed else None
        self.engine.add_request(
            Request(rid, prior + self.tokens(uncomputed), self.sampling, session)
        )
        return rid

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.engine.abort(rid)
            self.engine.release_session(rid)
            self.request_ids.remove(rid)

    def abort_all(self) -> None:
        self.abort(list(self.request_ids))


def _time_shape(prober: _Prober, shape: BatchShape, repeats: int, clock: Clock) -> Sample:
    engine = prober.engine
    decode_ids = [prober.add(shape.decode_context - 2, 1) for _ in range(shape.decodes)]
    with _recording_batches(engine) as batches:
        if decode_ids:
            # Untimed admission step (context - 1): the timed steps are then steady-state
            # decodes, as in a running engine, not first steps of new requests.
            engine.step()
        times: list[float] = []
        cpu_times: list[float] = []
        for _ in range(repeats):
            chunk_ids = [
                prober.add(shape.prefill_prior, shape.prefill_tokens)
                for _ in range(shape.prefill_chunks)
            ]
            cpu_start = time.process_time()
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
            prober.abort(chunk_ids)
    prober.abort(decode_ids)
    timed = batches[1:] if decode_ids else batches
    for r, (prefills, contexts) in enumerate(timed):
        want_prefills = [(shape.prefill_tokens, shape.prefill_prior)] * shape.prefill_chunks
        want_contexts = [shape.decode_context + r] * shape.decodes
        if sorted(prefills) != want_prefills or sorted(contexts) != want_contexts:
            raise EngineStateError(
                f"calibration shape {shape.describe()!r}, repeat {r}: the scheduler ran "
                f"prefills {list(prefills)} and {len(contexts)} decodes at contexts "
                f"{sorted(set(contexts))}, not the batch asked for; is the engine's KV cache "
                f"or max_model_len too small for it?"
            )
    ranked = times if clock == "wall" else cpu_times
    middle = sorted(range(repeats), key=ranked.__getitem__)[(repeats - 1) // 2]
    prefills, contexts = timed[middle]
    return Sample(
        prefills,
        contexts,
        times[middle],
        tuple(times),
        shape,
        cpu_times[middle],
        tuple(cpu_times),
    )


def profile_engine(
    engine: LLMEngine,
    grid: CalibrationGrid,
    repeats: int = DEFAULT_REPEATS,
    *,
    clock: Clock = "cpu",
    seed: int = 0,
    sampling: SamplingParams | None = None,
    log: Callable[[str], None] | None = None,
) -> list[Sample]:
    """Time ``repeats`` engine iterations of every shape in ``grid``; one sample per shape,
    its median repeat on ``clock`` (both clocks are recorded).

    The engine must be idle (no requests, no pinned sessions): profiling overwrites its KV
    cache and clears its prefix cache. Its scheduler limits are raised for the run and
    restored. ``sampling`` defaults to temperature 1, as RL rollouts sample.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be an integer >= 1, got {repeats!r}")
    _check_clock(clock)
    scheduler = engine.scheduler
    if scheduler.has_work() or scheduler.sessions:
        raise EngineStateError(
            f"profile_engine needs an idle engine; it has {scheduler.num_requests()} requests "
            f"in flight and {len(scheduler.sessions)} pinned sessions (abort or release them)"
        )
    block_size = engine.blocks.block_size
    for shape in grid.shapes:
        need = shape.kv_blocks(block_size, repeats)
        if need > engine.blocks.num_blocks:
            raise ConfigError(
                f"calibration shape {shape.describe()!r} needs {need} KV blocks of "
                f"{block_size} tokens; the engine has num_kv_blocks={engine.blocks.num_blocks}"
            )
        if shape.max_len(repeats) >= scheduler.config.max_model_len:
            raise ConfigError(
                f"calibration shape {shape.describe()!r} needs sequences of "
                f"{shape.max_len(repeats)} tokens; the engine's max_model_len is "
                f"{scheduler.config.max_model_len} (must be larger)"
            )
    max_new = 2 * repeats + 2  # the decodes' admission step plus every repeat, with room
    sampling = sampling or SamplingParams(temperature=1.0, max_new_tokens=max_new, ignore_eos=True)
    sampling = dataclasses.replace(sampling, max_new_tokens=max_new, ignore_eos=True)
    cfg = scheduler.config
    saved = (cfg.max_num_batched_tokens, cfg.max_num_seqs)
    prober = _Prober(engine, sampling, seed)
    samples: list[Sample] = []
    try:
        # Touch every KV page once: reads of never-written pages would all hit the kernel's
        # shared zero page and look faster than real memory.
        if engine.runner.kv_cache is not None:
            engine.runner.kv_cache.uniform_(-1.0, 1.0)
        engine.blocks.reset_prefix_cache()  # its cached KV was just overwritten
        cfg.max_num_batched_tokens = max(saved[0], grid.max_num_tokens())
        cfg.max_num_seqs = max(saved[1], grid.max_num_sequences())
        # Warm-up: first iterations pay one-time allocations and kernel selection.
        for shape in (_prefill(min(64, cfg.max_model_len // 2)), _decode(4, 32)):
            _time_shape(prober, shape, 2, clock)
        for i, shape in enumerate(grid.shapes):
            sample = _time_shape(prober, shape, repeats, clock)
            samples.append(sample)
            if log is not None:
                log(
                    f"[{i + 1}/{len(grid.shapes)}] {shape.describe():<30} "
                    f"{1e3 * sample.seconds:8.2f} ms wall {1e3 * sample.cpu_seconds:8.2f} ms cpu"
                )
    finally:
        prober.abort_all()
        cfg.max_num_batched_tokens, cfg.max_num_seqs = saved
        engine.blocks.reset_prefix_cache()  # probe blocks hold random KV
    return samples


# --- fitting -----------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class FittedRates:
    """The seven fitted numbers, in the cost model's units (FLOP/s, bytes/s, seconds)."""

    linear_flops_per_s: float
    attention_flops_per_s: float
    weight_bytes_per_s: float
    kv_bytes_per_s: float
    iteration_overhead_s: float
    per_sequence_overhead_s: float
    per_prefill_chunk_overhead_s: float

    @classmethod
    def from_log(cls, x: np.ndarray) -> FittedRates:
        """From the natural logs of the fields, in field order."""
        return cls(*(float(v) for v in np.exp(x)))

    def to_log(self) -> np.ndarray:
        """Natural logs of the fields, in field order."""
        return np.log([getattr(self, f.name) for f in dataclasses.fields(self)])

    def slower(self, factor: float) -> FittedRates:
        """These rates with every predicted time ``factor`` times longer: rates divided by it,
        overheads multiplied (exact: each roofline term and overhead scales alike)."""
        return FittedRates(
            self.linear_flops_per_s / factor,
            self.attention_flops_per_s / factor,
            self.weight_bytes_per_s / factor,
            self.kv_bytes_per_s / factor,
            self.iteration_overhead_s * factor,
            self.per_sequence_overhead_s * factor,
            self.per_prefill_chunk_overhead_s * factor,
        )

    def gpu(self, memory_bytes: float) -> GPUSpec:
        """A ``cpu`` spec whose peak is the linear FLOP/s and whose bandwidth is the weights'."""
        return dataclasses.replace(
            CPU_PLACEHOLDER,
            peak_flops=self.linear_flops_per_s,
            hbm_bandwidth_Bps=self.weight_bytes_per_s,
            hbm_bytes=memory_bytes,
        )

    def constants(self, base: CostConstants | None = None) -> CostConstants:
        """``base`` with efficiencies and overheads set so that, on :meth:`gpu`, each roofline
        term runs at its fitted rate (attention and KV efficiencies are ratios, may be > 1)."""
        return dataclasses.replace(
            base or CostConstants(),
            linear_compute_efficiency=1.0,
            linear_roofline_exponent=math.inf,  # the fit is a sharp roofline per rate
            linear_kernel_overhead_s=0.0,  # folded into the fitted overheads
            attention_compute_efficiency=self.attention_flops_per_s / self.linear_flops_per_s,
            weight_memory_efficiency=1.0,
            kv_memory_efficiency=self.kv_bytes_per_s / self.weight_bytes_per_s,
            iteration_overhead_s=self.iteration_overhead_s,
            per_sequence_overhead_s=self.per_sequence_overhead_s,
            per_prefill_chunk_overhead_s=self.per_prefill_chunk_overhead_s,
        )


@dataclass(slots=True, frozen=True)
class ErrorStats:
    """Absolute relative errors |predicted - measured| / measured over some samples."""

    count: int
    median: float
    p90: float
    max: float

    @classmethod
    def of(cls, errors: list[float]) -> ErrorStats:
        """Stats of signed relative errors (their absolute values are summarized)."""
        if not errors:
            return cls(0, math.nan, math.nan, math.nan)
        a = np.abs(np.asarray(errors, dtype=np.float64))
        return cls(len(a), float(np.median(a)), float(np.quantile(a, 0.9)), float(a.max()))


@dataclass(slots=True, frozen=True)
class FitReport:
    """How well the fitted profile predicts the measured iterations."""

    rates: FittedRates
    errors: dict[str, ErrorStats]
    """By batch kind (prefill, decode, mixed) and ``all``."""
    relative_errors: tuple[float, ...]
    """Per sample, signed (predicted - measured) / measured, in sample order."""
    fit_seconds: float
    lower_bounds: tuple[str, ...] = ()
    """Rates whose roofline term never binds on any sample: the data only say they are at
    least this fast, and the fit reports the slowest value consistent with them."""
    clock: Clock = "cpu"
    busy_fraction: float | None = None
    """Median share of a timed iteration's wall time that other processes held the core
    (1 - CPU time / wall time); near 0 on a quiet machine. None without CPU times."""
    profiling_seconds: float | None = None
    profile_path: str | None = None
    level: float = 1.0
    """The factor the anchor samples scaled every predicted time by (1: no anchor)."""

    def table(self) -> str:
        """A small text table of the errors, one row per kind."""
        lines = [f"{'kind':<8} {'n':>3} {'median':>8} {'p90':>8} {'max':>8}"]
        for kind, e in self.errors.items():
            if e.count:
                lines.append(f"{kind:<8} {e.count:>3} {e.median:>8.1%} {e.p90:>8.1%} {e.max:>8.1%}")
        r = self.rates
        lines.append(
            f"fitted: linear {r.linear_flops_per_s / 1e9:.1f} GFLOP/s, attention "
            f"{r.attention_flops_per_s / 1e9:.1f} GFLOP/s, weights "
            f"{r.weight_bytes_per_s / 1e9:.2f} GB/s, KV {r.kv_bytes_per_s / 1e9:.2f} GB/s, "
            f"overheads {1e3 * r.iteration_overhead_s:.2f} ms/iteration + "
            f"{1e3 * r.per_sequence_overhead_s:.3f} ms/decode + "
            f"{1e3 * r.per_prefill_chunk_overhead_s:.3f} ms/chunk"
        )
        if self.busy_fraction is not None:
            lines.append(
                f"clock: {self.clock}; other processes held the core {self.busy_fraction:.0%} "
                f"of the timed wall time (median)"
            )
        if self.level != 1.0:
            lines.append(f"level set by the live iterations: times x{self.level:.3f}")
        if self.lower_bounds:
            lines.append(
                f"lower bounds only (never the binding term): {', '.join(self.lower_bounds)}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (profile meta, JSON output)."""
        return {
            "errors": {k: dataclasses.asdict(v) for k, v in self.errors.items() if v.count},
            "rates": dataclasses.asdict(self.rates),
            "lower_bounds": list(self.lower_bounds),
            "clock": self.clock,
            "busy_fraction": self.busy_fraction,
            "fit_seconds": self.fit_seconds,
            "profiling_seconds": self.profiling_seconds,
            "profile_path": self.profile_path,
            "level": self.level,
        }


def _initial_guesses(seconds: list[float], works: list[IterationWork]) -> list[np.ndarray]:
    """Starting points for the fit: one from the data, plus deterministic perturbations
    (the roofline's max() makes the objective piecewise, with local minima)."""
    fastest = min(seconds)
    timed = list(zip(works, seconds, strict=True))
    linear = max(w.linear_flops / t for w, t in timed)
    attention = max((w.prefill_attention_flops + w.decode_attention_flops) / t for w, t in timed)
    weights = max(w.weight_bytes for w in works) / fastest
    kv = max((w.prefill_kv_bytes + w.decode_kv_bytes) / t for w, t in timed)
    base = FittedRates(
        linear_flops_per_s=linear,
        attention_flops_per_s=max(attention, 1e-3 * linear),
        weight_bytes_per_s=weights,
        kv_bytes_per_s=max(kv, 1e-3 * weights),
        iteration_overhead_s=0.5 * fastest,
        per_sequence_overhead_s=0.01 * fastest,
        per_prefill_chunk_overhead_s=0.05 * fastest,
    ).to_log()
    # Measured here the landscape is nearly unimodal: the data-driven start almost always
    # wins, and a few log-normal jitters (x4.5 typical) guard against the odd bad basin.
    rng = np.random.default_rng(0)
    return [base] + [base + rng.normal(0.0, 1.5, size=len(base)) for _ in range(6)]


def _tighten(rates: FittedRates, works: list[IterationWork]) -> tuple[FittedRates, tuple[str, ...]]:
    """Lower each rate whose roofline term never binds to where it would first bind.

    Such a rate is free above some value (a flat direction of the fit, which can end at
    absurd numbers); the slowest value consistent with the data predicts every sample the
    same and keeps the profile physically plausible.
    """
    pairs = (
        (
            "linear_flops_per_s",
            "weight_bytes_per_s",
            [(w.linear_flops, w.weight_bytes) for w in works],
        ),
        (
            "attention_flops_per_s",
            "kv_bytes_per_s",
            [(w.prefill_attention_flops, w.prefill_kv_bytes) for w in works]
            + [(w.decode_attention_flops, w.decode_kv_bytes) for w in works],
        ),
    )
    loose: list[str] = []
    for flops_name, bytes_name, items in pairs:
        flops_rate, bytes_rate = getattr(rates, flops_name), getattr(rates, bytes_name)
        items = [(f, b) for f, b in items if f > 0 and b > 0]
        if not items:
            continue
        if all(f / flops_rate >= b / bytes_rate for f, b in items):
            bound = max(b * flops_rate / f for f, b in items)
            rates = dataclasses.replace(rates, **{bytes_name: bound})
            loose.append(bytes_name)
        elif all(b / bytes_rate >= f / flops_rate for f, b in items):
            bound = max(f * bytes_rate / b for f, b in items)
            rates = dataclasses.replace(rates, **{flops_name: bound})
            loose.append(flops_name)
    return rates, tuple(loose)


def fit_profile(
    samples: list[Sample],
    model: ModelShape,
    *,
    clock: Clock = "cpu",
    memory_bytes: float | None = None,
    meta: Mapping[str, Any] | None = None,
    anchor: int = 0,
) -> tuple[Profile, FitReport]:
    """Fit a ``cpu`` profile so ``CostModel`` (tp=1) predicts ``samples``' times on ``clock``
    for ``model``.

    With ``anchor`` n > 0 the first n samples shape the fit but the last ones set its level:
    after fitting, every time is scaled so the median measured/predicted ratio of the samples
    after the first n is 1 (e.g. a grid timed on an idle worker for coverage, then the
    iterations of live runs whose load the profile must match).

    Minimizes the soft-L1 loss of log(predicted / measured) over the log-parameters from
    several starts. ``memory_bytes`` (default: this machine's RAM) becomes the spec's
    ``hbm_bytes``. The profile's ``meta`` holds ``meta``, the fit and the samples.
    """
    try:
        from scipy.optimize import least_squares
    except ImportError as exc:
        raise ImportError(
            "fit_profile needs scipy: pip install 'pearl-rollout[live]' (or scipy>=1.11)"
        ) from exc
    if len(samples) < len(dataclasses.fields(FittedRates)):
        raise ConfigError(
            f"fit_profile needs at least {len(dataclasses.fields(FittedRates))} samples "
            f"(one per fitted parameter), got {len(samples)}"
        )
    _check_clock(clock)
    measured = [s.time(clock) for s in samples]
    for i, t in enumerate(measured):
        if not (t > 0 and math.isfinite(t)):
            raise ConfigError(f"sample {i} has {clock} seconds={t!r}; must be a positive number")
    memory = float(memory_bytes) if memory_bytes is not None else _physical_memory_bytes()
    started = time.perf_counter()
    # Work is hardware-independent: compute it once, price it per trial parameter set.
    placeholder = CostModel(CPU_PLACEHOLDER, model, 1)
    works = [placeholder.iteration_work(s.prefills, s.decode_contexts) for s in samples]
    log_measured = np.log(measured)

    def predict(rates: FittedRates) -> np.ndarray:
        cost = CostModel(rates.gpu(memory), model, 1, rates.constants())
        return np.array([cost.price(w).total_s for w in works])

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict(FittedRates.from_log(x))) - log_measured

    # Overheads may fit to ~0; bounds keep their logs finite (1 ns is zero for all purposes).
    # Rates stop well above any device (1e16 FLOP/s, 1e14 B/s); _tighten lowers loose ones.
    lower = np.log([1e6, 1e6, 1e6, 1e6, 1e-9, 1e-9, 1e-9])
    upper = np.log([1e16, 1e16, 1e14, 1e14, 10.0, 10.0, 10.0])
    best = None
    for x0 in _initial_guesses(measured, works):
        result = least_squares(
            residuals,
            np.clip(x0, lower + 1e-6, upper - 1e-6),
            bounds=(lower, upper),
            loss="soft_l1",
            f_scale=0.05,  # residuals beyond ~5% (noisy repeats) count linearly, not squared
            x_scale=1.0,
            max_nfev=2000,
        )
        if best is None or result.cost < best.cost:
            best = result
    rates, lower_bounds = _tighten(FittedRates.from_log(best.x), works)
    level = 1.0
    if 0 < anchor < len(samples):
        level = float(np.median(np.exp(log_measured[anchor:]) / predict(rates)[anchor:]))
        rates = rates.slower(level)
    fit_seconds = time.perf_counter() - started

    relative = (predict(rates) / np.exp(log_measured) - 1.0).tolist()
    by_kind: dict[str, list[float]] = {k.value: [] for k in BatchKind}
    for s, e in zip(samples, relative, strict=True):
        by_kind[s.kind.value].append(e)
    errors = {k: ErrorStats.of(v) for k, v in by_kind.items()}
    errors["all"] = ErrorStats.of(relative)
    busy = [1.0 - s.cpu_seconds / s.seconds for s in samples if s.cpu_seconds is not None]
    report = FitReport(
        rates,
        errors,
        tuple(relative),
        fit_seconds,
        lower_bounds,
        clock,
        float(np.median(busy)) if busy else None,
        level=level,
    )
    profile = Profile(
        gpu=rates.gpu(memory),
        constants=rates.constants(),
        dtype_bytes=model.dtype_bytes,
        meta={
            **dict(meta or {}),
            "model": model.name,
            "model_params": model.total_params,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "fit": report.to_dict(),
            "samples": [s.to_dict() for s in samples],
        },
    )
    return profile, report


def samples_from_profile(profile: Profile) -> list[Sample]:
    """The samples a calibrated profile was fitted on (from its ``meta``), for refitting."""
    raw = profile.meta.get("samples")
    if not isinstance(raw, list):
        raise ConfigError("profile meta holds no 'samples' list; was it made by calibrate?")
    return [Sample.from_dict(s, f"profile meta samples[{i}]") for i, s in enumerate(raw)]


def _physical_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return CPU_PLACEHOLDER.hbm_bytes


def machine_description() -> dict[str, Any]:
    """What the profile was measured on: CPU model, cores, torch version and threads."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": _physical_memory_bytes(),
        "python": platform.python_version(),
        "system": platform.platform(),
    }
    try:
        import torch

        out["torch"] = str(torch.__version__)  # a str subclass YAML cannot write
        out["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return out


# --- end to end ---------------------------------------------------------------------------

RANDOM_MODELS: dict[str, dict[str, Any]] = {
    "qwen3-16m": {
        "model_type": "qwen3",
        "vocab_size": 8192,
        "hidden_size": 384,
        "intermediate_size": 1024,
        "num_hidden_layers": 6,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 4096,
    },
    "qwen3-tiny": {
        "model_type": "qwen3",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 2048,
    },
}
"""Random-weight models to calibrate without a checkpoint (timings do not depend on the
weights' values): ``qwen3-16m`` (15.7M parameters) suits the default grid,
``qwen3-tiny`` the quick one."""


def model_shape_of(engine: LLMEngine) -> ModelShape:
    """The cost model's view of the engine's model, in float32."""
    return ModelShape.from_hf_config(
        engine.model_config.to_hf_dict(),
        engine.model_id,
        source=f"engine {engine.model_id}",
        dtype_bytes=PROFILE_DTYPE_BYTES,
    )


def build_engine(
    source: ModelConfig | Mapping[str, Any] | str | Path,
    grid: CalibrationGrid,
    repeats: int = DEFAULT_REPEATS,
    block_size: int = 16,
    seed: int = 0,
) -> LLMEngine:
    """An engine sized for ``grid``: over a random-weight model (a ``RANDOM_MODELS`` name, a
    config dict/``ModelConfig``, or a ``config.json`` file or folder without weights) or
    over a Hugging Face folder with ``*.safetensors``."""
    from pearl.engine.engine import EngineConfig, LLMEngine
    from pearl.models.config import ModelConfig

    weights_folder: Path | None = None
    name: str | None = None
    if isinstance(source, ModelConfig):
        cfg = source
    elif isinstance(source, Mapping):
        cfg = ModelConfig.from_dict(dict(source), source="calibration model config")
    elif isinstance(source, str) and source in RANDOM_MODELS:
        cfg = ModelConfig.from_dict(RANDOM_MODELS[source], source=f"random model {source!r}")
        name = source
    else:
        path = Path(source)
        if path.is_dir():
            cfg = ModelConfig.from_folder(path)
            if any(path.glob("*.safetensors")):
                weights_folder = path
            name = path.resolve().name
        elif path.is_file():
            cfg = ModelConfig.from_folder(path.parent) if path.name == "config.json" else None
            if cfg is None:
                raise ConfigError(f"{path}: expected a config.json file or a model folder")
            name = path.resolve().parent.name
        else:
            raise ConfigError(
                f"calibration model {str(source)!r} is neither a model folder, a config.json, "
                f"nor a random model name ({', '.join(RANDOM_MODELS)})"
            )
    max_len = grid.max_len(repeats) + 1
    if max_len > cfg.max_position_embeddings:
        raise ConfigError(
            f"calibration grid {grid.name!r} needs sequences of {max_len} tokens; the model's "
            f"max_position_embeddings is {cfg.max_position_embeddings} (use a smaller grid)"
        )
    engine_config = EngineConfig(
        block_size=block_size,
        # The largest shape, plus the warm-up's few blocks and slack.
        num_kv_blocks=grid.kv_blocks(block_size, repeats) + 64,
        max_num_batched_tokens=grid.max_num_tokens(),
        max_num_seqs=grid.max_num_sequences(),
        max_model_len=cfg.max_position_embeddings,
        model_id=name,
        seed=seed,
    )
    if weights_folder is not None:
        return LLMEngine.from_folder(weights_folder, engine_config)
    return LLMEngine.from_model_config(cfg, engine_config, seed=seed)


def calibrate(
    source: LLMEngine | ModelConfig | Mapping[str, Any] | str | Path,
    out_path: str | Path,
    grid: str | CalibrationGrid = "default",
    *,
    repeats: int = DEFAULT_REPEATS,
    clock: Clock = "cpu",
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> FitReport:
    """Profile an engine (or one built from ``source``, see :func:`build_engine`), fit a
    profile on ``clock`` times, save it to ``out_path`` (YAML or JSON), return the report."""
    from pearl.engine.engine import LLMEngine

    grid = get_grid(grid)
    engine = (
        source if isinstance(source, LLMEngine) else build_engine(source, grid, repeats, seed=seed)
    )
    model = model_shape_of(engine)
    if log is not None:
        log(
            f"calibrating {model.name} ({model.total_params / 1e6:.1f}M parameters, float32) "
            f"on grid {grid.name!r}: {len(grid.shapes)} shapes x {repeats} repeats"
        )
    started = time.perf_counter()
    samples = profile_engine(engine, grid, repeats, clock=clock, seed=seed, log=log)
    profiling_seconds = time.perf_counter() - started
    meta = {
        "fitted_on": machine_description(),
        "grid": grid.name,
        "repeats": repeats,
        "profiling_seconds": round(profiling_seconds, 2),
        "engine": {
            "block_size": engine.config.block_size,
            "model_config": engine.model_config.to_hf_dict(),
        },
    }
    profile, report = fit_profile(samples, model, clock=clock, meta=meta)
    path = save_profile(out_path, profile)
    return dataclasses.replace(report, profiling_seconds=profiling_seconds, profile_path=str(path))


def run_calibrate(
    model: str,
    out: str,
    grid: str = "default",
    repeats: int = DEFAULT_REPEATS,
    clock: Clock = "cpu",
    seed: int = 0,
    threads: int = 1,
    echo: Callable[[str], None] = print,
) -> FitReport:
    """What ``pearl calibrate`` runs: set torch threads, calibrate ``model`` (a model folder,
    config.json or ``RANDOM_MODELS`` name), save to ``out``, echo progress and the fit table."""
    import torch

    torch.set_num_threads(threads)
    report = calibrate(model, out, grid, repeats=repeats, clock=clock, seed=seed, log=echo)
    echo("")
    echo(report.table())
    echo(
        f"profiled in {report.profiling_seconds:.1f} s, fitted in {report.fit_seconds:.1f} s; "
        f"profile: {report.profile_path}"
    )
    return report


__all__ = [
    "RANDOM_MODELS",
    "BatchKind",
    "BatchShape",
    "CalibrationGrid",
    "ErrorStats",
    "FitReport",
    "FittedRates",
    "Sample",
    "build_engine",
    "calibrate",
    "fit_profile",
    "get_grid",
    "machine_description",
    "model_shape_of",
    "profile_engine",
    "run_calibrate",
    "samples_from_profile",
]
