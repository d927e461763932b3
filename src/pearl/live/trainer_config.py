"""What the live GRPO trainer is told: ``TrainerConfig``, checked as it is made."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pearl.live.lora import LoRAConfig
from pearl.models.devices import DTYPES

# The loss variants a TrainerConfig may name (pearl.live.grpo implements each).
ADVANTAGE_ESTIMATORS = ("grpo", "rloo")
KL_ESTIMATORS = ("k1", "k3")
REWARD_SCALES = ("group", "batch", "none")
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


@dataclass(slots=True, frozen=True)
class TrainerConfig:
    learning_rate: float = 2e-6
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.0
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    """The upper clip (DAPO's clip-higher); None: ``clip_eps`` (``pearl.live.grpo``)."""
    advantage_estimator: str = "grpo"  # grpo or rloo
    scale_rewards: str = "group"  # group, batch or none
    loss_agg_mode: str = "token-mean"  # LOSS_AGG_MODES
    loss_norm_tokens: int | None = None
    """``seq-mean-token-sum-norm``'s constant (Dr. GRPO's generation budget)."""
    kl_coef: float = 0.0
    """The weight of the KL penalty to the frozen starting weights (0: no reference)."""
    kl_estimator: str = "k3"  # k1 or k3 (pearl.live.grpo.kl_per_token)
    mask_overlong: bool = False
    """Leave trajectories cut by the context cap out of the loss (their group's baseline
    still counts them): DAPO's overlong filtering."""
    recompute_logprobs: bool = False
    """Take the ratio against the trainer's own log-probabilities of the weights that
    start the step, and weight tokens by truncated importance sampling against the
    engine's (``tis_cap``)."""
    tis_cap: float = 3.0
    ppo_epochs: int = 1
    """Passes over each batch (TRL's ``num_iterations``, verl's ``ppo_epochs``)."""
    mini_batches: int = 1
    """Optimizer steps per pass, each on its share of the batch's groups (verl's
    ``ppo_mini_batch_size`` = batch / mini_batches). With more than one update a step,
    the ratio is taken against the trainer's log-probabilities of the weights that start
    the step, as TRL and verl do."""
    lora: LoRAConfig | None = None
    """Train low-rank adapters on the frozen weights (``pearl.live.lora``); None: all weights."""
    kl_ratio_correction: bool = False
    """Weight each token's KL term by its importance ratio (DeepSeek-V3.2; TRL's default)."""
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 2048
    temperature: float = 1.0
    """The sampling temperature the behaviour log-probabilities were computed at."""
    top_k: int = 0
    top_p: float = 1.0
    """The rollout's truncation (0 / 1.0: none): the current log-probabilities are taken
    under the same truncated distribution the tokens were drawn from."""
    device: str = "cpu"  # cpu, cuda or cuda:N
    dtype: str = "float32"
    """float32, or bfloat16 for the forward and backward passes (mixed precision: the
    weights, the optimizer and the gradients' reduction stay float32)."""

    def __post_init__(self) -> None:
        checks = {
            "learning_rate": self.learning_rate > 0 and math.isfinite(self.learning_rate),
            "clip_eps": 0 < self.clip_eps < 1,
            "clip_eps_high": self.clip_eps_high is None or 0 < self.clip_eps_high < 10,
            "advantage_estimator": self.advantage_estimator in ADVANTAGE_ESTIMATORS,
            "scale_rewards": self.scale_rewards in REWARD_SCALES
            and (self.advantage_estimator != "rloo" or self.scale_rewards == "none"),
            "loss_agg_mode": self.loss_agg_mode in LOSS_AGG_MODES,
            "kl_coef": self.kl_coef >= 0 and math.isfinite(self.kl_coef),
            "tis_cap": self.tis_cap >= 1 and math.isfinite(self.tis_cap),
            "ppo_epochs": self.ppo_epochs >= 1,
            "mini_batches": self.mini_batches >= 1,
            "kl_estimator": self.kl_estimator in KL_ESTIMATORS,
            "loss_norm_tokens": (self.loss_norm_tokens or 0) >= 1
            if self.loss_agg_mode == "seq-mean-token-sum-norm"
            else self.loss_norm_tokens is None or self.loss_norm_tokens >= 1,
            "max_grad_norm": self.max_grad_norm > 0,
            "micro_batch_tokens": self.micro_batch_tokens >= 16,
            "temperature": self.temperature > 0,
            "top_k": self.top_k >= 0,
            "top_p": 0 < self.top_p <= 1,
            "weight_decay": self.weight_decay >= 0,
            "dtype": self.dtype in DTYPES,
            "device": self.device == "cpu" or self.device.split(":")[0] == "cuda",
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"trainer config: invalid {', '.join(bad)} in {self}")
