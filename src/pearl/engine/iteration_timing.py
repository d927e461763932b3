"""Profiling an engine: time real iterations of chosen batch shapes on this machine.

:func:`profile_engine` runs a grid of batch shapes (pure prefill chunks, pure decode
batches, decodes plus a prefill chunk) through an idle :class:`LLMEngine`, driving its own
scheduler so each timed ``engine.step()`` runs exactly the batch asked for, and records
the shape that ran with its measured seconds (:class:`Sample`). Fitting a cost model to
the samples is the simulator's business (``pearl.apps.calibrate``); a live worker profiles
itself with this module alone.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from pearl.engine.sequence import Request, SamplingParams
from pearl.errors import ConfigError, EngineStateError

if TYPE_CHECKING:
    from pearl.engine.engine import LLMEngine

DEFAULT_REPEATS = 5
"""Timed repeats per shape; the median one is kept (noise from neighbours on shared cores)."""


Clock = Literal["wall", "cpu"]
"""Which time profiling and fitting use: wall time, or the process's CPU time, i.e. wall
time minus the time other processes held the core. On a dedicated core the two agree; on
a shared machine CPU time is the better estimate of the dedicated wall time (measured
here: neighbours doubled the wall time of whole stretches of shapes, which no cost model
can fit). CPU time assumes one torch thread (more threads add up)."""


CLOCKS: tuple[Clock, ...] = ("wall", "cpu")


def check_clock(clock: object) -> None:
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


def _check_can_profile(engine: LLMEngine, grid: CalibrationGrid, repeats: int) -> None:
    """Refuse a busy engine, and a shape whose ``repeats`` overflow its KV cache or context."""
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
    check_clock(clock)
    _check_can_profile(engine, grid, repeats)
    max_new = 2 * repeats + 2  # the decodes' admission step plus every repeat, with room
    sampling = sampling or SamplingParams(temperature=1.0, max_new_tokens=max_new, ignore_eos=True)
    sampling = dataclasses.replace(sampling, max_new_tokens=max_new, ignore_eos=True)
    cfg = engine.scheduler.config
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
                assert sample.cpu_seconds is not None  # _time_shape measures both clocks
                log(
                    f"[{i + 1}/{len(grid.shapes)}] {shape.describe():<30} "
                    f"{1e3 * sample.seconds:8.2f} ms wall {1e3 * sample.cpu_seconds:8.2f} ms cpu"
                )
    finally:
        prober.abort_all()
        cfg.max_num_batched_tokens, cfg.max_num_seqs = saved
        engine.blocks.reset_prefix_cache()  # probe blocks hold random KV
    return samples
