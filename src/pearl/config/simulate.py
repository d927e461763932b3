"""``pearl simulate``'s configuration: one rollout batch on fixed deployments
(``SimulateConfig``, ``kind: rollout``) or an RL experiment (``RLExperimentConfig``,
``kind: rl``), in the sections DESIGN.md names (``cluster.*``, ``model.*``, ``workload.*``,
``sim.*``, ``rl.*``, ``elastic.*``, ``pd.*``, ``logger.*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator

from pearl.config.loading import Section, apply_overrides, load_config, plain_run_name
from pearl.control.deployment import Deployment
from pearl.control.policies import POLICIES
from pearl.errors import ConfigError
from pearl.sim.worker import SimEngineConfig


class ModelSection(Section):
    name: str = Field(
        "Qwen3-30B-A3B", description="catalog name or path to a config.json / model folder"
    )


class ClusterSection(Section):
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

        for text in value:
            Deployment.parse(text)
        if not value:
            raise ValueError("at least one deployment is needed")
        return value


class WorkloadSection(Section):
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


# The simulated worker's defaults, read from where they are defined (one place each).
_ENGINE = SimEngineConfig()


class SimSection(Section):
    block_size: int = Field(_ENGINE.block_size, ge=1, description="KV page size in tokens")
    max_num_batched_tokens: int = Field(
        _ENGINE.max_num_batched_tokens, ge=1, description="tokens per engine iteration"
    )
    max_num_seqs: int = Field(
        _ENGINE.max_num_seqs, ge=1, description="sequences per engine iteration"
    )
    max_model_len: int = Field(
        _ENGINE.max_model_len, ge=2, description="longest context a worker accepts"
    )
    fast_forward: bool = Field(
        _ENGINE.fast_forward,
        description="skip runs of identical decode iterations in one step (same result)",
    )
    scheduling: Literal["mixed", "sglang"] = Field(
        _ENGINE.scheduling,
        description="iteration composition: mixed (decode-first + chunked prefill in one "
        "pass) or sglang (SGLang's default: prefill batches alone, first; no mixing)",
    )
    chunked_prefill_size: int = Field(
        _ENGINE.chunked_prefill_size, ge=1, description="sglang mode: tokens per chunk"
    )
    max_prefill_tokens: int = Field(
        _ENGINE.max_prefill_tokens, ge=1, description="sglang mode: tokens per batch"
    )
    flush_cache_on_weight_update: bool = Field(
        _ENGINE.flush_cache_on_weight_update,
        description="drop pinned sessions on every weight update (continuing sessions "
        "re-prefill; the prefix cache is emptied on every update either way)",
    )
    cross_turn_reuse: Literal["prefix", "none"] = Field(
        str(_ENGINE.cross_turn_reuse),
        description="KV a colocated turn starts from: prefix (its pinned session, else the "
        "prefix cache, up to the first token its prompt changed) or none (no pinned session, "
        "no prefix-cache hit: every turn prefills its whole prompt); docs/regime.md, Switches",
    )
    pd_decode_reuse: Literal["retain", "none"] = Field(
        str(_ENGINE.pd_decode_reuse),
        description="what a disaggregated decode worker keeps of a session between turns: "
        "retain (its KV: a turn moves only the tokens it lacks) or none (nothing, as SGLang's "
        "PD decode server: every turn moves the whole prompt's KV); docs/regime.md, Switches",
    )


class LoggerSection(Section):
    run_dir: str = Field("runs", description="parent folder of run folders")
    run_name: str | None = Field(
        None, description="run folder name (default: a timestamp and a random suffix)"
    )

    _plain_name = field_validator("run_name")(plain_run_name)


class SimulateConfig(Section):
    """``pearl simulate``: one rollout batch on fixed deployments of a simulated cluster."""

    kind: Literal["rollout"] = "rollout"
    model: ModelSection = Field(default_factory=ModelSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    workload: WorkloadSection = Field(default_factory=WorkloadSection)
    sim: SimSection = Field(default_factory=SimSection)
    logger: LoggerSection = Field(default_factory=LoggerSection)


class RLClusterSection(Section):
    gpu: str = Field("H800", description="GPU catalog name")
    tp: int = Field(2, ge=1, le=64, description="tensor-parallel degree of every rollout worker")
    reserved_gpus: int = Field(4, ge=1, description="dedicated rollout GPUs that never leave")
    max_preemptible_gpus: int = Field(12, ge=0, description="preemptible rollout GPUs at most")
    training_gpus: int = Field(16, ge=1, description="training GPUs (the overlap zone)")
    profile: str | None = Field(None, description="cost-model profile file overriding constants")


class RLSection(Section):
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


class ElasticSection(Section):
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


class PDSection(Section):
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


class RLExperimentConfig(Section):
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

        unknown = [p for p in value if p not in POLICIES]
        if unknown or not value:
            raise ValueError(f"unknown policies {unknown}; valid: {', '.join(POLICIES)}")
        return value


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
