"""Run configuration: YAML files validated with pydantic, plus ``key=value`` overrides.

Keys are grouped as DESIGN.md names them (``cluster.*``, ``model.*``, ``workload.*``,
``sim.*``, ``logger.*``); unknown keys are errors that name the key and list the
valid ones.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pearl.errors import ConfigError
from pearl.redaction import REDACTED, is_secret_key, redact_secrets, redacted_keys


class _Section(BaseModel):
    # Override values are parsed as YAML, so `run_name=123` arrives as an int.
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


class ModelSection(_Section):
    name: str = Field(
        "Qwen3-30B-A3B", description="catalog name or path to a config.json / model folder"
    )


class ClusterSection(_Section):
    gpu: str = Field("H800", description="GPU catalog name (H800, H100, H200, A100-80G, B200, ...)")
    tp: int = Field(2, ge=1, le=64, description="tensor-parallel degree of each rollout worker")
    deployments: list[str] = Field(
        default_factory=lambda: ["8C"],
        description="fixed deployments to run: '8C' (8 colocated) or '5P3D'",
    )
    profile: str | None = Field(
        None, description="cost-model profile file (YAML/JSON) overriding constants"
    )

    @field_validator("deployments")
    @classmethod
    def _check_deployments(cls, value: list[str]) -> list[str]:
        from pearl.control.deployment import Deployment

        for text in value:
            Deployment.parse(text)
        if not value:
            raise ValueError("at least one deployment is needed")
        return value


class WorkloadSection(_Section):
    profile: str = Field(
        "swe", description="workload profile: swe, swe_thinking, swe_paper, gui, search, game, tiny"
    )
    num_tasks: int | None = Field(
        None, ge=1, le=100_000, description="tasks per batch (default: the profile's)"
    )
    group_size: int | None = Field(
        None, ge=1, le=1024, description="trajectories per task (default: the profile's)"
    )
    seed: int = Field(0, ge=0, description="workload sampling seed")
    trace: str | None = Field(
        None, description="replay a JSONL trajectory trace instead of generating"
    )


class SimSection(_Section):
    block_size: int = Field(16, ge=1, description="KV page size in tokens")
    max_num_batched_tokens: int = Field(8192, ge=1, description="tokens per engine iteration")
    max_num_seqs: int = Field(256, ge=1, description="sequences per engine iteration")
    max_model_len: int = Field(40960, ge=2, description="longest context a worker accepts")
    fast_forward: bool = Field(
        True, description="skip runs of identical decode iterations in one step (same result)"
    )
    scheduling: Literal["mixed", "sglang"] = Field(
        "mixed",
        description="iteration composition: mixed (decode-first + chunked prefill in one "
        "pass) or sglang (SGLang's default: prefill batches alone, first; no mixing)",
    )
    chunked_prefill_size: int = Field(8192, ge=1, description="sglang mode: tokens per chunk")
    max_prefill_tokens: int = Field(16384, ge=1, description="sglang mode: tokens per batch")
    flush_cache_on_weight_update: bool = Field(
        False,
        description="drop pinned sessions on every weight update (continuing sessions "
        "re-prefill; the prefix cache is emptied on every update either way)",
    )
    cross_turn_reuse: Literal["prefix", "none"] = Field(
        "prefix",
        description="KV a colocated turn starts from: prefix (its pinned session, else the "
        "prefix cache, up to the first token its prompt changed) or none (no pinned session, "
        "no prefix-cache hit: every turn prefills its whole prompt); docs/regime.md, Switches",
    )
    pd_decode_reuse: Literal["retain", "none"] = Field(
        "retain",
        description="what a disaggregated decode worker keeps of a session between turns: "
        "retain (its KV: a turn moves only the tokens it lacks) or none (nothing, as SGLang's "
        "PD decode server: every turn moves the whole prompt's KV); docs/regime.md, Switches",
    )


def plain_run_name(cls, value: str | None) -> str | None:
    """A run name is a folder name, never a path (validator shared by the run configs)."""
    if value is not None and (not value or "/" in value or "\\" in value or value in (".", "..")):
        raise ValueError(f"run_name must be a plain folder name, got {value!r}")
    return value


class LoggerSection(_Section):
    run_dir: str = Field("runs", description="parent folder of run folders")
    run_name: str | None = Field(
        None, description="run folder name (default: a timestamp and a random suffix)"
    )

    _plain_name = field_validator("run_name")(plain_run_name)


class SimulateConfig(_Section):
    """``pearl simulate``: one rollout batch on fixed deployments of a simulated cluster."""

    kind: Literal["rollout"] = "rollout"
    model: ModelSection = Field(default_factory=ModelSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    workload: WorkloadSection = Field(default_factory=WorkloadSection)
    sim: SimSection = Field(default_factory=SimSection)
    logger: LoggerSection = Field(default_factory=LoggerSection)


def _parse_value(text: str) -> Any:
    """``key=value`` values are YAML scalars or lists (``[8C, 5P3D]``)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides to a nested dict (a copy)."""
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. cluster.tp=4)")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = _parse_value(value)
    return out


def load_config(
    model: type[BaseModel], path: str | Path | None, overrides: list[str] | None = None
):
    """Read a YAML config (or start from defaults), apply overrides, validate."""
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} not found") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    raw = apply_overrides(raw, overrides or [])
    secrets = redacted_keys(raw)
    if secrets:  # a run folder's config.yaml: its secrets were not saved
        raise ConfigError(
            f"{source}: {', '.join(secrets)} {'holds' if len(secrets) == 1 else 'hold'} "
            f"{REDACTED!r}: run folders keep no secrets; {_secrets_again(secrets)}"
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                section = _section_of(model, err["loc"][:-1])
                valid = ", ".join(section.model_fields) if section else ""
                msg = f"unknown key; valid keys here: {valid}"
            shown = err.get("input")  # a secret is not echoed to the terminal
            if err["loc"] and is_secret_key(str(err["loc"][-1])):
                shown = REDACTED
            else:
                shown = redact_secrets(shown)
            lines.append(f"  {where}: {msg} (got {shown!r})")
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines)) from None


def _secrets_again(secrets: list[str]) -> str:
    """How to give a run folder's redacted secrets again: as overrides, but the agent
    endpoint's key from the environment (``pearl.agents.plugin``), off the command line."""
    again = [f"{key}=..." if key != AGENT_KEY else f"{key}=null" for key in secrets]
    how = f"pass {'it' if len(secrets) == 1 else 'them'} again ({' '.join(again)}"
    if AGENT_KEY in secrets:
        how += f", the agent endpoint key exported as ${AGENT_KEY_ENV}: an override would show"
        how += " it to every local user"
    return how + ")"


AGENT_KEY, AGENT_KEY_ENV = "env.options.api_key", "PEARL_AGENT_API_KEY"  # pearl.agents.plugin


def _section_of(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    node: Any = model
    for part in loc:
        field = node.model_fields.get(part) if hasattr(node, "model_fields") else None
        if field is None:
            return None
        node = field.annotation
    return node if isinstance(node, type) and issubclass(node, BaseModel) else None


def dump_config(cfg: BaseModel) -> str:
    """A config as a run folder's ``config.yaml``: YAML, its secrets ``<redacted>``
    (``pearl.redaction``; ``load_config`` asks for them again)."""
    return yaml.safe_dump(redact_secrets(cfg.model_dump(mode="json")), sort_keys=False)


def annotated_defaults(model: type[BaseModel], title: str) -> str:
    """A config class's defaults as YAML, each key commented with what it means and its
    bounds: what ``pearl config show`` prints, a valid config file as it stands."""
    lines = [f"# {title}", "# Any key can be overridden on the command line as section.key=value."]
    defaults = redact_secrets(model().model_dump(mode="json"))

    def emit(cls: type[BaseModel], values: dict[str, Any], indent: str) -> None:
        for name, field in cls.model_fields.items():
            value = values[name]
            sub = field.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                lines.append("")
                lines.append(f"{indent}{name}:")
                emit(sub, value, indent + "  ")
                continue
            if not indent and len(lines) > 2:
                lines.append("")
            text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
            text = text.removesuffix("\n...").removesuffix("...").strip()
            note = "; ".join(x for x in (field.description or "", _bounds(field)) if x)
            lines.append(f"{indent}{name}: {text}" + (f"  # {note}" if note else ""))

    emit(model, defaults, "")
    return "\n".join(lines) + "\n"


def _bounds(field: Any) -> str:
    """A field's constraints in words (``>= 1, <= 64``; ``one of: mixed, sglang``)."""
    words = []
    for meta in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            bound = getattr(meta, attr, None)
            if bound is not None:
                words.append(f"{sign} {bound:g}" if isinstance(bound, float) else f"{sign} {bound}")
    choices = getattr(field.annotation, "__args__", ())
    if getattr(field.annotation, "__origin__", None) is Literal and choices:
        words.append("one of: " + ", ".join(map(str, choices)))
    return ", ".join(words)


# --- ``kind: rl``: whole RL runs under rollout policies (the headline experiment) ----------


class RLClusterSection(_Section):
    gpu: str = Field("H800", description="GPU catalog name")
    tp: int = Field(2, ge=1, le=64, description="tensor-parallel degree of every rollout worker")
    reserved_gpus: int = Field(4, ge=1, description="dedicated rollout GPUs that never leave")
    max_preemptible_gpus: int = Field(12, ge=0, description="preemptible rollout GPUs at most")
    training_gpus: int = Field(16, ge=1, description="training GPUs (the overlap zone)")
    profile: str | None = Field(None, description="cost-model profile file overriding constants")


class RLSection(_Section):
    duration_s: float = Field(
        7200.0, gt=0, le=1e8, allow_inf_nan=False, description="no rollout batch starts after this"
    )
    max_staleness: int = Field(1, ge=0, description="steps a rollout's weights may lag")
    overlap_batches: bool = Field(
        False,
        description="start a rollout batch as soon as its weights are synced, while earlier "
        "batches finish (continuous asynchronous generation); false: one batch at a time",
    )
    weight_update: Literal["policy", "continue", "abort_restart", "abort_resume"] = Field(
        "policy",
        description="turns in flight when new weights land: continue decoding; abort and "
        "re-issue from the start (ROLL, docs/baselines.md); abort and resume from the tokens "
        "generated; policy: each policy's own",
    )


class ElasticSection(_Section):
    segments: list[str] = Field(
        default_factory=lambda: ["segment1", "segment2", "segment3"],
        description="availability traces: segment1..3 (shipped) or CSV files of preemptible GPUs",
    )
    scale: int = Field(
        1,
        ge=1,
        le=4096,
        description="GPUs each available instance of the traces stands for (the shipped "
        "Bamboo segments count 1-GPU instances, at most 12; 8 reads each as an 8-GPU node)",
    )

    @field_validator("segments")
    @classmethod
    def _check_segments(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one availability segment is needed")
        return value


class PDSection(_Section):
    mode_switch_threshold: float = Field(
        0.05, ge=0, lt=1, description="switch C<->PD only if it cuts the makespan by this share"
    )
    ratio_change_threshold: float = Field(
        0.02, ge=0, lt=1, description="change the P:D ratio only if it cuts the makespan by this"
    )
    static_split: list[int] = Field(
        default_factory=lambda: [1, 1], description="static-pd policy: P:D ratio"
    )

    @field_validator("static_split")
    @classmethod
    def _check_split(cls, value: list[int]) -> list[int]:
        if len(value) != 2 or min(value) < 1:
            raise ValueError(f"static_split must be two ints >= 1 (P, D), got {value}")
        return value


class RLExperimentConfig(_Section):
    """``pearl simulate`` with ``kind: rl``: every policy on every availability segment."""

    kind: Literal["rl"] = "rl"
    model: ModelSection = Field(default_factory=lambda: ModelSection(name="Qwen3-8B"))
    cluster: RLClusterSection = Field(default_factory=RLClusterSection)
    workload: WorkloadSection = Field(default_factory=WorkloadSection)
    rl: RLSection = Field(default_factory=RLSection)
    elastic: ElasticSection = Field(default_factory=ElasticSection)
    pd: PDSection = Field(default_factory=PDSection)
    policies: list[str] = Field(
        default_factory=lambda: [
            "roll",
            "roll-large",
            "rlboost",
            "static-pd",
            "pearl-pd",
            "pearl-ungated",
            "pearl",
        ],
        description="rollout policies to run on every segment (see pearl.control.policies)",
    )
    # 64-token KV pages: the simulator's per-block work (allocation, prefix hashing,
    # eviction) is ~25% of an RL run at 16; throughputs agree within 0.03% (measured).
    sim: SimSection = Field(default_factory=lambda: SimSection(block_size=64))
    logger: LoggerSection = Field(default_factory=LoggerSection)
    processes: int = Field(2, ge=1, le=64, description="runs in parallel (one per process)")

    @field_validator("policies")
    @classmethod
    def _check_policies(cls, value: list[str]) -> list[str]:
        from pearl.control.policies import POLICIES

        unknown = [p for p in value if p not in POLICIES]
        if unknown or not value:
            raise ValueError(f"unknown policies {unknown}; valid: {', '.join(POLICIES)}")
        return value


class SpotSection(_Section):
    """A spot market described by its size and churn instead of recorded traces."""

    max_available: int = Field(12, ge=1, description="preemptible GPUs the market offers at most")
    changes_per_hour: float = Field(
        8.0, gt=0, le=3600, description="availability changes per hour (churn)"
    )
    traces: int = Field(3, ge=1, le=100, description="random traces drawn (seeds 0..n-1)")
    duration_s: float = Field(7200.0, gt=0, le=1e8, description="each trace's length")


def check_ray_address(value: str | None) -> str | None:
    """A Ray cluster address PEARL joins as a driver: ``auto`` or the head's host:port."""
    if value is None or value == "auto":
        return value
    if value.startswith("ray://"):
        raise ValueError(
            f"{value!r} is a Ray Client address, which PEARL does not use: run it on a node "
            "of the cluster with 'auto', or give the head's host:port (GCS port)"
        )
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not 'auto' or host:port (e.g. 10.0.0.1:6379)")
    return value


class PlanSection(_Section):
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


def load_simulate_config(path: str | Path | None, overrides: list[str] | None = None):
    """``SimulateConfig`` or ``RLExperimentConfig``, chosen by the top-level ``kind`` key
    (``rollout``, the default, or ``rl``), after overrides (so ``kind=rl`` works too)."""
    kind = "rollout"
    raw: Any = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (FileNotFoundError, yaml.YAMLError):
            raw = {}  # load_config reports these with context
    raw = apply_overrides(raw if isinstance(raw, dict) else {}, overrides or [])
    kind = raw.get("kind", kind)
    models = {"rollout": SimulateConfig, "rl": RLExperimentConfig}
    if kind not in models:
        raise ConfigError(f"kind: {kind!r} is not one of {', '.join(models)}")
    if kind == "rollout":
        # Sections only an RL experiment has: say which kind takes them.
        rl_only = sorted(
            set(raw) & (set(RLExperimentConfig.model_fields) - set(SimulateConfig.model_fields))
        )
        if rl_only:
            raise ConfigError(
                f"{', '.join(rl_only)}: only RL experiments take "
                f"{'this key' if len(rl_only) == 1 else 'these keys'}; add kind=rl (a "
                f"'kind: rl' config such as configs/headline.yaml), or leave them out for one "
                f"rollout batch (kind: rollout)"
            )
    return load_config(models[kind], path, overrides)
