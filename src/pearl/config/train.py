"""``pearl train``'s configuration: model, cluster (policy, availability), environment,
rollout engine, trainer and run sections, validated (pydantic), with ``key=value``
overrides."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pearl.config.loading import Section, check_ray_address, load_config, plain_run_name
from pearl.control.policies import Borrowing, PDMode, Pool, get_policy
from pearl.control.rollout_engine import require_capabilities
from pearl.live.worker import server_class


class TrainModelSection(Section):
    name: str = Field("smollm2-135m", description="catalog model or a Hugging Face folder")


class TrainEnvSection(Section):
    name: str = Field(
        "calculator",
        description="an installed environment (calculator, guess, or one a package declares "
        "under the pearl.envs entry points) or package.module:Class (docs/environments.md)",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="the environment's arguments, e.g. {level: easy}"
    )
    step_timeout_s: float | None = Field(
        60.0,
        gt=0,
        description="seconds one reset/step may take; longer ends the episode (env_timeout, "
        "reward 0, not trained on) and the run goes on (null: no limit)",
    )


class TrainRolloutSection(Section):
    backend: Literal["pearl", "vllm"] = Field(
        "pearl",
        description="the rollout engine: pearl (ours) or vllm (vLLM's engine behind PEARL's "
        "KV connector and sleep/wake; every policy runs on both; run vllm from the venv "
        "scripts/vllm_env.sh makes)",
    )
    workers: int = Field(1, ge=1, le=16, description="colocated rollout workers (processes)")
    tasks_per_step: int = Field(8, ge=1, le=1024)
    group_size: int = Field(4, ge=2, le=64, description="trajectories per task (GRPO group)")
    max_new_tokens: int = Field(64, ge=1, le=4096, description="per turn")
    max_context_tokens: int = Field(768, ge=16, le=32768, description="per trajectory")
    max_turns: int | None = Field(
        None, ge=1, le=1000, description="per trajectory (null: until the environment ends it)"
    )
    dynamic_sampling: bool = Field(
        False,
        description="train only on groups whose rewards differ, rolling out more tasks until "
        "a step has tasks_per_step of them (DAPO; pearl.control.dynamic_sampling)",
    )
    max_extra_rounds: int = Field(
        4, ge=1, le=64, description="dynamic sampling: extra rollout rounds a step may take"
    )
    temperature: float = Field(
        0.7, gt=0, le=2.0, description="sampling temperature (the trainer's ratio uses it too)"
    )
    top_p: float = Field(
        1.0,
        gt=0,
        le=1.0,
        description="nucleus sampling: draw from the most probable tokens holding this much "
        "mass (1: off); behaviour and trainer log-probabilities use the truncated distribution",
    )
    top_k: int = Field(
        0, ge=0, le=1_000_000, description="draw from the k most probable tokens (0: off)"
    )
    kv_blocks: int = Field(
        512, ge=16, le=1_000_000, description="KV blocks of 16 tokens per worker"
    )
    max_num_seqs: int = Field(64, ge=1, le=1024)
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|cuda(:\d+)?)$",
        description="where each rollout engine runs: cpu, cuda or cuda:N (cuda needs "
        "cluster.worker_resources with GPU, so Ray gives the worker one)",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="the engines' weights and KV cache (logits stay float32)"
    )


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class TrainLoRASection(Section):
    """Low-rank adapters on the frozen model (``pearl.live.lora``); rank 0: off."""

    rank: int = Field(
        0, ge=0, le=4096, description="adapter rank (0: train every weight; 16 is common)"
    )
    alpha: float = Field(
        32.0, gt=0, le=1e6, description="the adapters' scale is alpha / rank (peft's lora_alpha)"
    )
    target_modules: list[Literal[LORA_TARGETS]] = Field(  # type: ignore[valid-type]
        list(LORA_TARGETS),
        min_length=1,
        description="the decoder layers' linear layers that get adapters (default: all)",
    )


class TrainTrainerSection(Section):
    """The GRPO step; the variants' names and sources are in ``pearl.live.grpo``."""

    learning_rate: float = Field(1e-5, gt=0, le=1e-2)
    clip_eps: float = Field(0.2, gt=0, lt=1, description="the ratio's clip (its lower side)")
    clip_eps_high: float | None = Field(
        None, gt=0, lt=10, description="the upper clip, DAPO's clip-higher (null: clip_eps)"
    )
    advantage_estimator: Literal["grpo", "rloo"] = Field(
        "grpo", description="grpo: reward minus the group mean; rloo: minus the others' mean"
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description="divide grpo's advantages by the group's std, the batch's, or not "
        "(none: Dr. GRPO)",
    )
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = Field(
        "token-mean",
        description="how token losses make the batch's loss (verl's names; TRL: bnpo, grpo, "
        "luspo, dr_grpo)",
    )
    loss_norm_tokens: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="seq-mean-token-sum-norm's constant (null: rollout.max_new_tokens x "
        "rollout.max_turns, or rollout.max_context_tokens without max_turns)",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        le=100,
        description="weight of the KL penalty to the frozen starting weights (0: none; a "
        "reference copy of the model then lives in each trainer process, FSDP-sharded)",
    )
    kl_estimator: Literal["k3", "k1"] = Field(
        "k3", description="k3: p_ref/p - log(p_ref/p) - 1 (TRL's, never negative); k1: log p/p_ref"
    )
    mask_overlong: bool = Field(
        False,
        description="leave trajectories cut by rollout.max_context_tokens out of the loss "
        "(DAPO's overlong filtering; their group's baseline still counts them)",
    )
    recompute_logprobs: bool = Field(
        False,
        description="take the ratio against the trainer's own log-probabilities and weight "
        "tokens by truncated importance sampling against the engine's (tis_cap)",
    )
    tis_cap: float = Field(
        3.0, ge=1, le=1000, description="the importance weight's cap (TRL's default 3.0)"
    )
    lora: TrainLoRASection = Field(default_factory=TrainLoRASection)
    ppo_epochs: int = Field(
        1, ge=1, le=64, description="passes over each batch (TRL num_iterations, verl ppo_epochs)"
    )
    mini_batches: int = Field(
        1,
        ge=1,
        le=1024,
        description="optimizer steps per pass, each on its share of the batch's groups; with "
        "more than one update a step the ratio is against the step's starting weights",
    )
    kl_ratio_correction: bool = Field(
        False,
        description="weight each token's KL term by its importance ratio, for an unbiased "
        "reverse-KL gradient (DeepSeek-V3.2; TRL's use_bias_correction_kl)",
    )
    max_grad_norm: float = Field(1.0, gt=0)
    micro_batch_tokens: int = Field(
        1024, ge=16, le=1_000_000, description="padded tokens per backward pass (memory)"
    )
    threads: int = Field(
        2, ge=1, le=64, description="torch threads of each trainer process (the bottleneck here)"
    )
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|cuda(:\d+)?)$",
        description="where each trainer process runs: cpu, cuda or cuda:N (cuda needs "
        "cluster.trainer_resources with GPU)",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="the forward and backward passes (bfloat16: mixed precision, float32 "
        "weights, optimizer and gradient reduction)",
    )
    processes: int = Field(
        1,
        ge=1,
        le=64,
        description="trainer processes sharing each step (FSDP2 over gloo, each on its share "
        "of the groups; the weights equal one process's)",
    )

    @model_validator(mode="after")
    def _variants_that_go_together(self) -> TrainTrainerSection:
        if self.advantage_estimator == "rloo" and self.scale_rewards != "none":
            raise ValueError(
                "advantage_estimator rloo is not scaled by a std: set scale_rewards: none "
                "(or use advantage_estimator grpo)"
            )
        if self.loss_norm_tokens is not None and self.loss_agg_mode != "seq-mean-token-sum-norm":
            raise ValueError(
                f"loss_norm_tokens is used only by loss_agg_mode seq-mean-token-sum-norm, "
                f"not {self.loss_agg_mode}: drop it or choose that mode"
            )
        return self


class TrainRunSection(Section):
    steps: int = Field(
        10,
        ge=0,
        le=100_000,
        description="RL steps (0: only evaluate model.name on run.eval_tasks held-out tasks)",
    )
    max_staleness: int = Field(
        1, ge=0, le=8, description="steps a rollout's weights may lag (0: synchronous GRPO)"
    )
    overlap_batches: bool = Field(
        False,
        description="start a rollout batch as soon as its weights are there, while the long "
        "tail of earlier batches still runs (up to max_staleness + 1 batches in flight); "
        "false: one rollout batch at a time",
    )
    seed: int = Field(0, ge=0)
    eval_tasks: int = Field(32, ge=0, le=100_000, description="held-out tasks before and after")
    eval_temperature: float | None = Field(
        None, ge=0, le=2.0, description="held-out sampling temperature: 0 greedy, default rollout's"
    )
    checkpoint_every: int = Field(0, ge=0, description="steps between checkpoints (0: end only)")
    chaos_kill_every_s: float = Field(
        0.0,
        ge=0,
        description="fault injection: kill a random dedicated rollout worker's process "
        "(ray.kill) this often, to exercise recovery (0: never)",
    )
    run_dir: str = Field("runs", description="parent folder of run folders")
    run_name: str | None = Field(
        None, description="run folder name (default: train- plus a timestamp and a suffix)"
    )

    _plain_name = field_validator("run_name")(plain_run_name)


class TrainClusterSection(Section):
    policy: str = Field(
        "roll",
        description="rollout policy (pearl.control.policies): roll, rlboost, static-pd, "
        "pearl-pd, pearl-ungated, pearl, ...",
    )
    preemptible_workers: int = Field(
        0, ge=0, le=16, description="elastic policies: at most this many extra rollout workers"
    )
    availability: list[tuple[float, int]] = Field(
        default_factory=list,
        description="elastic policies: (seconds from the start, preemptible workers) changes",
    )
    ray_address: str | None = Field(
        None,
        description="join a running Ray cluster: 'auto' (the one `ray start` joined on this "
        "machine) or the head's host:port; null: a private single-machine runtime on "
        "loopback (docs/cluster.md)",
    )
    worker_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray resources each rollout worker needs besides its CPU slot, e.g. "
        "{rollout: 1} to run workers only on nodes started with --resources='{\"rollout\": N}'",
    )
    trainer_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray resources the trainer needs besides its CPU slot (empty: the trainer "
        "runs on this machine's node, where the run folder and its checkpoints are)",
    )
    spread_workers: bool = Field(
        False, description="spread rollout workers over the nodes (Ray's SPREAD strategy)"
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:

        get_policy(value)  # raises with the valid names
        return value

    @field_validator("ray_address")
    @classmethod
    def _ray_address(cls, value: str | None) -> str | None:
        return check_ray_address(value)

    @field_validator("worker_resources", "trainer_resources")
    @classmethod
    def _resources(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name == "CPU" or not name:
                raise ValueError(
                    f"resource {name!r}: each actor takes one CPU slot already; name another "
                    "resource (a custom one the nodes declare, or GPU)"
                )
            if not (amount > 0 and math.isfinite(amount)):
                raise ValueError(f"resource {name!r}: amount {amount} is not a positive number")
        return value

    @field_validator("availability")
    @classmethod
    def _sane_changes(cls, value: list[tuple[float, int]]) -> list[tuple[float, int]]:
        for t, n in value:
            if not (t >= 0 and math.isfinite(t)) or n < 0:
                raise ValueError(
                    f"availability changes need times >= 0 and counts >= 0, got {(t, n)}"
                )
        return value


class TrainLoggerSection(Section):
    wandb: bool = Field(
        False,
        description="also log the scalars to Weights & Biases (pip install wandb); offline "
        "without an API key, WANDB_MODE overrides",
    )
    wandb_project: str = Field("pearl", min_length=1, description="the W&B project")


class TrainConfig(Section):
    model: TrainModelSection = Field(default_factory=TrainModelSection)
    cluster: TrainClusterSection = Field(default_factory=TrainClusterSection)
    env: TrainEnvSection = Field(default_factory=TrainEnvSection)
    rollout: TrainRolloutSection = Field(default_factory=TrainRolloutSection)
    trainer: TrainTrainerSection = Field(default_factory=TrainTrainerSection)
    run: TrainRunSection = Field(default_factory=TrainRunSection)
    logger: TrainLoggerSection = Field(default_factory=TrainLoggerSection)

    @property
    def loss_norm_tokens(self) -> int | None:
        """``seq-mean-token-sum-norm``'s constant: set, or a trajectory's generation budget
        (Dr. GRPO divides by the maximum completion length); None for the other modes."""
        t, r = self.trainer, self.rollout
        if t.loss_agg_mode != "seq-mean-token-sum-norm":
            return None
        if t.loss_norm_tokens is not None:
            return t.loss_norm_tokens
        return r.max_new_tokens * r.max_turns if r.max_turns else r.max_context_tokens

    @model_validator(mode="after")
    def _backend_can_run_the_policy(self) -> TrainConfig:
        """A policy that needs what the rollout backend cannot do (PD needs KV export and
        import, borrowing needs sleep) is refused here, before anything starts."""

        require_capabilities(
            get_policy(self.cluster.policy), server_class(self.rollout.backend).capabilities
        )
        return self

    def pool_sizes(self) -> tuple[int, int]:
        """The fewest and the most rollout workers the policy can have at once: the
        dedicated ones, plus the preemptible ones the availability changes bring (elastic
        pools), plus the trainer's slot between updates (borrowing)."""

        policy = get_policy(self.cluster.policy)
        most = self.rollout.workers
        if policy.pool is Pool.ELASTIC:
            offered = max((n for _, n in self.cluster.availability), default=0)
            most += min(offered, self.cluster.preemptible_workers)
        if policy.borrowing is not Borrowing.OFF:
            most += 1
        return self.rollout.workers, most

    @model_validator(mode="after")
    def _pd_pool_can_split(self) -> TrainConfig:
        """A policy that always splits prefill and decode (a static P:D ratio) needs two
        workers at some point; on a pool that never has them it would run colocated."""

        policy = get_policy(self.cluster.policy)
        most = self.pool_sizes()[1]
        if policy.pd in (PDMode.STATIC, PDMode.DISAGGREGATED) and most < 2:
            raise ValueError(
                f"cluster.policy={policy.name} splits prefill and decode, which needs at least "
                f"2 rollout workers (1 prefill + 1 decode); this pool never has more than "
                f"{most} (rollout.workers={self.rollout.workers}, "
                f"{self.cluster.preemptible_workers} preemptible). Set rollout.workers=2, or "
                "give preemptible workers (cluster.preemptible_workers and cluster.availability)"
            )
        return self

    @model_validator(mode="after")
    def _mini_batches_have_groups(self) -> TrainConfig:
        if self.trainer.mini_batches > self.rollout.tasks_per_step:
            raise ValueError(
                f"trainer.mini_batches={self.trainer.mini_batches} splits a batch of "
                f"rollout.tasks_per_step={self.rollout.tasks_per_step} groups: a mini-batch "
                "holds whole groups, so set mini_batches to at most tasks_per_step"
            )
        return self

    @model_validator(mode="after")
    def _gpus_are_asked_for(self) -> TrainConfig:
        """Ray hides the GPUs from an actor that does not ask for one: a cuda device needs
        the GPU resource in that actor's resources."""
        for device, resources, where in (
            (self.rollout.device, self.cluster.worker_resources, "worker_resources"),
            (self.trainer.device, self.cluster.trainer_resources, "trainer_resources"),
        ):
            if device != "cpu" and resources.get("GPU", 0) <= 0:
                raise ValueError(
                    f"device {device} needs a GPU from Ray: set cluster.{where}={{GPU: 1}} "
                    "(or a fraction, to share one GPU between actors)"
                )
        return self


def load_train_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    return load_config(TrainConfig, path, overrides)
