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
import math
import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pearl.engine.config import EngineConfig
from pearl.engine.iteration_timing import (
    DEFAULT_REPEATS,
    BatchKind,
    CalibrationGrid,
    Clock,
    Sample,
    check_clock,
    get_grid,
    profile_engine,
)
from pearl.errors import ConfigError
from pearl.models.config import ModelConfig
from pearl.sim.cost_profile import CostProfile, save_cost_profile
from pearl.sim.costmodel import CostConstants, CostModel, IterationWork
from pearl.sim.hardware import CPU_PLACEHOLDER, GPUSpec
from pearl.sim.shapes import ModelShape

if TYPE_CHECKING:
    from pearl.engine.engine import LLMEngine

PROFILE_DTYPE_BYTES = 4
"""The CPU engine computes and caches in float32."""
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


def _least_squares() -> Callable[..., Any]:
    """scipy's ``least_squares``; ImportError naming the extra to install without scipy."""
    try:
        from scipy.optimize import least_squares  # live extra
    except ImportError as exc:
        raise ImportError(
            "fit_profile needs scipy: pip install 'pearl-rollout[live]' (or scipy>=1.11)"
        ) from exc
    return least_squares


def _measured_seconds(samples: list[Sample], clock: Clock) -> list[float]:
    """The samples' seconds on ``clock``; ConfigError with fewer samples than fitted
    parameters or a time that is not a positive finite number."""
    if len(samples) < len(dataclasses.fields(FittedRates)):
        raise ConfigError(
            f"fit_profile needs at least {len(dataclasses.fields(FittedRates))} samples "
            f"(one per fitted parameter), got {len(samples)}"
        )
    check_clock(clock)
    measured = [s.time(clock) for s in samples]
    for i, t in enumerate(measured):
        if not (t > 0 and math.isfinite(t)):
            raise ConfigError(f"sample {i} has {clock} seconds={t!r}; must be a positive number")
    return measured


def _multistart_fit(
    least_squares: Callable[..., Any],
    residuals: Callable[[np.ndarray], np.ndarray],
    measured: list[float],
    works: list[IterationWork],
) -> FittedRates:
    """The rates minimizing the soft-L1 loss of ``residuals`` (of the log-parameters), best
    of the bounded fits from every :func:`_initial_guesses` start."""
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
    return FittedRates.from_log(best.x)


def _fit_report(
    samples: list[Sample],
    relative: list[float],
    rates: FittedRates,
    fit_seconds: float,
    lower_bounds: tuple[str, ...],
    clock: Clock,
    level: float,
) -> FitReport:
    """The fit's report: error stats per batch kind and overall from the per-sample
    ``relative`` errors, and the samples' median busy fraction (None without CPU times)."""
    by_kind: dict[str, list[float]] = {k.value: [] for k in BatchKind}
    for s, e in zip(samples, relative, strict=True):
        by_kind[s.kind.value].append(e)
    errors = {k: ErrorStats.of(v) for k, v in by_kind.items()}
    errors["all"] = ErrorStats.of(relative)
    busy = [1.0 - s.cpu_seconds / s.seconds for s in samples if s.cpu_seconds is not None]
    return FitReport(
        rates,
        errors,
        tuple(relative),
        fit_seconds,
        lower_bounds,
        clock,
        float(np.median(busy)) if busy else None,
        level=level,
    )


def _fitted_profile(
    rates: FittedRates,
    memory: float,
    model: ModelShape,
    report: FitReport,
    samples: list[Sample],
    meta: Mapping[str, Any] | None,
) -> CostProfile:
    """The ``cpu`` profile of ``rates`` with ``memory`` bytes; its meta holds ``meta``, the
    model, the date, the fit report and the samples."""
    return CostProfile(
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


def fit_profile(
    samples: list[Sample],
    model: ModelShape,
    *,
    clock: Clock = "cpu",
    memory_bytes: float | None = None,
    meta: Mapping[str, Any] | None = None,
    anchor: int = 0,
    set_level: bool = False,
) -> tuple[CostProfile, FitReport]:
    """Fit a ``cpu`` profile so ``CostModel`` (tp=1) predicts ``samples``' times on ``clock``
    for ``model``.

    With ``anchor`` n > 0 the first n samples shape the fit but the last ones set its level:
    after fitting, every time is scaled so the samples after the first n take, summed, the
    time they measured (e.g. a grid timed on an idle worker for coverage, then the
    iterations of live runs whose load the profile must match). The sum, not the median
    ratio: on a shared host a worker's iterations are now and then descheduled (the driver,
    Ray's processes, other workers), a cost paid in a minority of iterations that a median
    ignores and a batch's makespan does not. ``set_level`` sets the level so with
    ``anchor`` 0 too (every sample's sum: live iterations with no grid before them).

    Minimizes the soft-L1 loss of log(predicted / measured) over the log-parameters from
    several starts. ``memory_bytes`` (default: this machine's RAM) becomes the spec's
    ``hbm_bytes``. The profile's ``meta`` holds ``meta``, the fit and the samples.
    """
    least_squares = _least_squares()
    measured = _measured_seconds(samples, clock)
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

    rates, lower_bounds = _tighten(
        _multistart_fit(least_squares, residuals, measured, works), works
    )
    level = 1.0
    if (anchor > 0 or set_level) and anchor < len(samples):
        level = float(np.sum(np.exp(log_measured[anchor:])) / np.sum(predict(rates)[anchor:]))
        rates = rates.slower(level)
    fit_seconds = time.perf_counter() - started

    relative = (predict(rates) / np.exp(log_measured) - 1.0).tolist()
    report = _fit_report(samples, relative, rates, fit_seconds, lower_bounds, clock, level)
    return _fitted_profile(rates, memory, model, report, samples, meta), report


def samples_from_profile(profile: CostProfile) -> list[Sample]:
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
        import torch  # live extra

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
    return ModelShape.from_model_config(
        engine.model_config,
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
    from pearl.engine.engine import LLMEngine  # torch

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
    if max_len > cfg.context_limit:
        raise ConfigError(
            f"calibration grid {grid.name!r} needs sequences of {max_len} tokens; the model's "
            f"max_position_embeddings is {cfg.context_limit} (use a smaller grid)"
        )
    engine_config = EngineConfig(
        block_size=block_size,
        # The largest shape, plus the warm-up's few blocks and slack.
        num_kv_blocks=grid.kv_blocks(block_size, repeats) + 64,
        max_num_batched_tokens=grid.max_num_tokens(),
        max_num_seqs=grid.max_num_sequences(),
        max_model_len=cfg.context_limit,
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
    from pearl.engine.engine import LLMEngine  # torch

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
    path = save_cost_profile(out_path, profile)
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
    import torch  # live extra

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
    "ErrorStats",
    "FitReport",
    "FittedRates",
    "build_engine",
    "calibrate",
    "fit_profile",
    "machine_description",
    "model_shape_of",
    "run_calibrate",
    "samples_from_profile",
]
