"""Cost profiles (files): a GPU spec, cost-constant overrides and worker latencies, in YAML or JSON.

Layout (every section optional; unknown keys are rejected)::

    gpu: H800                      # a catalog name, or a mapping:
    # gpu: {base: H800, network_bandwidth_Bps: 100.0e9}   (catalog spec + overrides)
    # gpu: {name: cpu, peak_flops: ..., ...}              (every GPUSpec field)
    constants: {linear_compute_efficiency: 0.55, iteration_overhead_s: 0.002}
    latencies: {prepare_s: 40.0}   # overrides of WorkerLatencies' defaults
    dtype_bytes: 4                 # weight and KV dtype the profiled engine runs in
    meta: {fitted_on: "...", residual_rms_s: 0.001}      # free-form, kept as is

Calibration fits ``constants`` (and a custom ``gpu``) on this machine and saves them;
the simulator loads them back.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from pearl.errors import ConfigError
from pearl.sim.costmodel import CostConstants, WorkerLatencies
from pearl.sim.hardware import GPUSpec, get_gpu
from pearl.sim.shapes import ModelShape

PROFILE_KEYS = ("gpu", "constants", "latencies", "dtype_bytes", "meta")
"""Top-level keys a profile file may hold."""
_SUFFIXES = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}


@dataclass(slots=True, frozen=True)
class CostProfile:
    """A fitted cost profile (`cluster.profile`): an optional GPU, cost constants, optional
    worker latencies and dtype. Not a workload profile (`pearl.workloads.profiles`)."""

    gpu: GPUSpec | None = None
    constants: CostConstants = field(default_factory=CostConstants)
    latencies: WorkerLatencies | None = None
    latency_fields: tuple[str, ...] = ()
    """The latencies a profile file set (the others follow the model: ``model_latencies``);
    empty with ``latencies`` given: all of them."""
    dtype_bytes: int | None = None
    """Bytes per weight/KV value of the profiled engine; None keeps the model's."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form provenance (what was fitted, on what, how well)."""

    def model_latencies(self, model: ModelShape) -> WorkerLatencies | None:
        """The lifecycle latencies for ``model``: the ones this profile sets, the rest scaled
        to the model (None when the profile sets none)."""
        if self.latencies is None:
            return None
        names = self.latency_fields or tuple(f.name for f in dataclasses.fields(WorkerLatencies))
        given = {name: getattr(self.latencies, name) for name in names}
        return dataclasses.replace(WorkerLatencies.for_model(model), **given)

    def adapt_model(self, model: ModelShape) -> ModelShape:
        """``model`` in this profile's dtype (unchanged when the profile sets none)."""
        if self.dtype_bytes is None:
            return model
        return dataclasses.replace(
            model, dtype_bytes=self.dtype_bytes, kv_dtype_bytes=self.dtype_bytes
        )


def _format(path: Path) -> str:
    try:
        return _SUFFIXES[path.suffix.lower()]
    except KeyError:
        raise ConfigError(
            f"{path}: profile files must end in {', '.join(_SUFFIXES)}; got {path.suffix!r}"
        ) from None


def _check_keys(mapping: Mapping[str, Any], valid: tuple[str, ...], where: str) -> None:
    for key in mapping:
        if key not in valid:
            raise ConfigError(f"{where}: unknown key {key!r}; valid keys: {', '.join(valid)}")


def _numbers(mapping: Any, cls: type, where: str, *, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Validate a section whose values are numbers for fields of dataclass ``cls``."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(mapping).__name__}")
    names = tuple(f.name for f in fields(cls))
    _check_keys(mapping, names + extra, where)
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if key in extra or key == "name":
            out[key] = value
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: {key!r} must be a number, got {value!r}")
        out[key] = value
    return out


def _parse_gpu(raw: Any, where: str) -> GPUSpec:
    if isinstance(raw, str):
        try:
            return get_gpu(raw)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
    values = _numbers(raw, GPUSpec, where, extra=("base",))
    base_name = values.pop("base", None)
    try:
        if base_name is not None:
            base = get_gpu(str(base_name))
            return dataclasses.replace(base, **values)
        missing = [f.name for f in fields(GPUSpec) if f.name not in values]
        if missing:
            raise ConfigError(
                f"missing {', '.join(missing)} (give every GPUSpec field, or 'base: <catalog "
                "name>' plus overrides)"
            )
        return GPUSpec(**values)
    except (ConfigError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


SHIPPED_PROFILES = {
    "paper-h800": "paper-h800.yaml",  # the paper's cluster: trainer fitted to C2, MoE and all-reduce sourced
    # ... in a system that restarts rollout engines on training GPUs (no process retention)
    "paper-h800-no-retention": "paper-h800-no-retention.yaml",
}
"""Profiles that ship with PEARL, by name (``cluster.profile: paper-h800``)."""


def load_cost_profile(path: str | Path) -> CostProfile:
    """Read a profile file (YAML or JSON by suffix), or a shipped profile by name; errors
    name the file and the key."""
    if str(path) in SHIPPED_PROFILES:
        path = Path(__file__).parent / "data" / SHIPPED_PROFILES[str(path)]
    path = Path(path)
    kind = _format(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read profile ({exc})") from exc
    try:
        raw = yaml.safe_load(text) if kind == "yaml" else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {kind.upper()} ({exc})") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: a profile must be a mapping of {', '.join(PROFILE_KEYS)}")
    _check_keys(raw, PROFILE_KEYS, str(path))
    gpu = _parse_gpu(raw["gpu"], f"{path}: gpu") if raw.get("gpu") is not None else None
    try:
        constants = CostConstants(
            **_numbers(raw.get("constants") or {}, CostConstants, f"{path}: constants")
        )
        latencies, latency_fields = None, ()
        if raw.get("latencies") is not None:
            given = _numbers(raw["latencies"], WorkerLatencies, f"{path}: latencies")
            latencies = WorkerLatencies(**given)
            if len(given) < len(fields(WorkerLatencies)):  # else all given: ()
                latency_fields = tuple(given)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(
            message if message.startswith(str(path)) else f"{path}: {message}"
        ) from exc
    dtype_bytes = raw.get("dtype_bytes")
    if dtype_bytes is not None and (
        isinstance(dtype_bytes, bool) or not isinstance(dtype_bytes, int) or dtype_bytes < 1
    ):
        raise ConfigError(f"{path}: dtype_bytes must be a positive integer, got {dtype_bytes!r}")
    meta = raw.get("meta") or {}
    if not isinstance(meta, Mapping):
        raise ConfigError(f"{path}: meta must be a mapping, got {type(meta).__name__}")
    return CostProfile(
        gpu=gpu,
        constants=constants,
        latencies=latencies,
        latency_fields=latency_fields,
        dtype_bytes=dtype_bytes,
        meta=dict(meta),
    )


def cost_profile_to_dict(profile: CostProfile) -> dict[str, Any]:
    """The profile as plain data (every constant written out, so a file pins its values)."""
    out: dict[str, Any] = {}
    if profile.gpu is not None:
        out["gpu"] = dataclasses.asdict(profile.gpu)
    out["constants"] = dataclasses.asdict(profile.constants)
    if profile.latencies is not None:
        every = dataclasses.asdict(profile.latencies)
        out["latencies"] = {k: every[k] for k in profile.latency_fields or every}
    if profile.dtype_bytes is not None:
        out["dtype_bytes"] = profile.dtype_bytes
    if profile.meta:
        out["meta"] = dict(profile.meta)
    return out


def save_cost_profile(path: str | Path, profile: CostProfile) -> Path:
    """Write ``profile`` to ``path`` (YAML or JSON by suffix); return the path."""
    path = Path(path)
    kind = _format(path)
    data = cost_profile_to_dict(profile)
    if kind == "yaml":
        text = yaml.safe_dump(data, sort_keys=False)
    else:
        text = json.dumps(data, indent=2) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
