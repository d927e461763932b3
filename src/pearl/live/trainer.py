"""The live GRPO trainer: PyTorch, one process (a Ray actor in ``pearl train``).

``GRPOTrainer`` is a plain class (tested in-process); ``pearl.live.trainer_handle`` is the
control plane's handle on it as Ray actors. Its config is ``pearl.live.trainer_config``,
the loss's arithmetic ``pearl.live.grpo`` (pure functions, checked against TRL's), its
files ``pearl.live.checkpoint``.
A step lays each group's trajectories (one task's G tries, sharing their prompt) out as a
prefix tree (``pearl.live.packing``: the prompt once, the gradient from every trajectory
reaching it), stacks the trees into micro-batches of at most ``micro_batch_tokens``
tokens, scores only the positions that predict the model's own tokens (the lm head runs
on those rows only), accumulates the clipped token-level GRPO loss, clips the
gradient norm and takes one AdamW step; the new weights are version ``step + 1``.

Checkpoints hold no pickle: weights and optimizer moments in safetensors, counters in JSON.
"""

from __future__ import annotations

import copy
import datetime
import math
import resource
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pearl.control.episode import ENV_FAILURES
from pearl.control.interfaces import TrainBatch, TrainSample
from pearl.engine.sampler import truncated_log_softmax
from pearl.errors import CheckpointError
from pearl.live import packing
from pearl.live.checkpoint import read_checkpoint, write_checkpoint
from pearl.live.cluster import actor_location
from pearl.live.grpo import (
    LossTerms,
    advantages,
    clipped_token_loss,
    kl_per_token,
    loss_terms,
    mini_batches,
    truncated_is_weights,
)
from pearl.live.lora import (
    adapter_files,
    adapters_disabled,
    apply_lora,
    merged_weights,
    read_adapters,
)
from pearl.live.packing import PackedBatch
from pearl.live.server import ModelSpec
from pearl.live.trainer_config import TrainerConfig
from pearl.models.config import ModelConfig
from pearl.models.devices import torch_device, torch_dtype
from pearl.models.loader import build_model, load_model, load_state_dict, read_safetensors_folder

COLLECTIVE_TIMEOUT_S = 120
"""How long a trainer process waits in a collective for the others (one that died)."""


class DeviceLentError(RuntimeError):
    """The trainer was asked to step while its device is lent to rollout."""


class _Scorer(torch.nn.Module):
    """The scored tokens' logits of a packed batch in one module call, so that FSDP
    gathers the model's own parameters (embeddings, final norm, lm head) around it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        hidden = self.model.forward_tree(batch.ids, batch.positions, batch.allowed)
        return self.model.compute_logits(hidden[batch.rows, batch.cols])


def step_metrics(
    every: list[TrainSample],
    kept: int,
    totals: dict[str, float],
    norms: list[float],
    cfg: TrainerConfig,
) -> dict[str, float]:
    """What a train step reports: its updates' sums (``totals``: the loss, tokens, clipped,
    ratios, entropy, KL and mismatch over every update) made means, and the batch's
    rewards and lengths (``every`` sample; ``kept`` of them trained, the rest environment
    failures)."""
    rewards = [s.reward for s in every]
    lengths = [sum(s.loss_mask) for s in every]
    tokens = totals["tokens"]  # over every update
    return {
        "loss": totals["loss"] / max(1, len(norms)),  # the mean over updates that stepped
        "grad_norm": float(np.mean(norms)) if norms else 0.0,
        "updates": float(len(norms)),
        "clip_fraction": totals["clipped"] / max(1.0, tokens),
        "mean_ratio": totals["ratio_sum"] / tokens if tokens else math.nan,  # none scored
        # the policy's entropy at the tokens it trained on (nats per token)
        "entropy": totals["entropy_sum"] / tokens if tokens else math.nan,
        # the KL estimate to the reference per trained token (kl_coef > 0 only)
        "kl": totals["kl_sum"] / tokens if tokens and cfg.kl_coef > 0 else math.nan,
        # |log p_trainer - log p_engine| per trained token: staleness and numerics
        "mismatch_mean": totals["mismatch_sum"] / tokens if tokens else math.nan,
        "mismatch_max": totals["mismatch_max"] if tokens else math.nan,
        # the model's own tokens per trajectory (every reply of it), as peers log them
        "response_length_mean": float(np.mean(lengths)),
        "response_length_max": float(max(lengths)),
        "trained_tokens": tokens / cfg.ppo_epochs,  # the batch's, once
        "batch_tokens": totals["batch_tokens"],
        "skipped_trajectories": float(kept) - totals["scored_trajectories"] / cfg.ppo_epochs,
        "overlong_masked": totals["overlong_masked"],
        "env_failures": float(len(every) - kept),
        "reward_mean": float(np.mean(rewards)),
        "reward_std": float(np.std(rewards)),
        "success_rate": float(np.mean([s.success for s in every])),
    }


class GRPOTrainer:
    def __init__(
        self, model: ModelSpec, config: TrainerConfig | None = None, torch_threads: int = 1
    ) -> None:
        torch.set_num_threads(torch_threads)
        self.config = config or TrainerConfig()
        self.device = torch_device(self.config.device)
        self.compute_dtype = torch_dtype(self.config.dtype)
        if model.folder is not None:
            self.model = load_model(model.folder)
        elif model.config is not None:
            self.model = build_model(ModelConfig.from_dict(model.config), seed=model.seed)
        else:
            raise ValueError("ModelSpec needs a folder or a config")
        self.base_model = model.folder or "random"
        self.adapted: list[str] = []  # the modules with LoRA adapters
        if self.config.lora is not None:
            self.adapted = apply_lora(self.model, self.config.lora, seed=model.seed)
        self.model.to(self.device)  # float32 master weights on any device
        self.model.train()
        self.scorer = _Scorer(self.model)
        # The KL penalty's reference: the starting weights (the run's model, also on a
        # resume, which loads the checkpoint into self.model afterwards), frozen. With
        # LoRA it is the base model itself, the adapters switched off.
        self.reference: _Scorer | None = None
        if self.config.kl_coef > 0 and self.config.lora is None:
            frozen = copy.deepcopy(self.model).eval().requires_grad_(False)
            self.reference = _Scorer(frozen)
        self.optimizer = self._make_optimizer()
        self.version = 0
        self.lent = False
        self.rank, self.world = 0, 1  # one of ``world`` processes (init_distributed)
        self._writer: Any = None  # the checkpoint writer thread, started at the first save
        self._pending: Any = None  # the checkpoint being written (a Future)
        self._last_saved: tuple[Path, int] | None = None  # (folder, version) last snapshotted

    def _make_optimizer(self) -> torch.optim.AdamW:
        """AdamW over the trainable parameters (with LoRA: the adapters only)."""
        return torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=self.config.learning_rate,
            betas=self.config.betas,
            weight_decay=self.config.weight_decay,
        )

    # -- several processes (FSDP2) ------------------------------------------------------
    @staticmethod
    def rendezvous_address() -> str:
        """Called on rank 0's process: host:port where the process group meets (this
        node's address, a port free now)."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return f"{actor_location()['node_ip']}:{port}"

    def init_distributed(self, rank: int, world: int, address: str) -> None:
        """Join a ``world``-process group (gloo; rank 0 listens at ``address``) and shard
        the model and the optimizer over it (FSDP2: each decoder layer, then the rest).
        Optimizer state already loaded (a resumed checkpoint) is sharded the same way."""
        import torch.distributed as dist  # the distributed pieces only where sharding
        from torch.distributed.device_mesh import init_device_mesh  # live extra
        from torch.distributed.fsdp import (
            MixedPrecisionPolicy,
            fully_shard,
            register_fsdp_forward_method,
        )
        from torch.distributed.tensor import distribute_tensor  # live extra

        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"tcp://{address}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
        self.rank, self.world = rank, world
        names = {id(p): n for n, p in self.model.named_parameters()}
        state = {names[id(p)]: st for p, st in self.optimizer.state.items()}
        mesh = init_device_mesh(self.device.type, (world,))
        policy = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        for layer in self.model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
            register_fsdp_forward_method(layer, "tree")  # the prefix-tree pass calls it
        fully_shard(self.scorer, mesh=mesh, mp_policy=policy)
        if self.reference is not None:  # sharded the same way: each process holds 1/world
            for layer in self.reference.model.model.layers:
                fully_shard(layer, mesh=mesh, mp_policy=policy)
                register_fsdp_forward_method(layer, "tree")
            fully_shard(self.reference, mesh=mesh, mp_policy=policy)
        self.optimizer = self._make_optimizer()
        for name, param in self.model.named_parameters():
            if name in state:
                st = state[name]
                self.optimizer.state[param] = {
                    "step": st["step"],
                    "exp_avg": distribute_tensor(
                        st["exp_avg"], param.device_mesh, param.placements
                    ),
                    "exp_avg_sq": distribute_tensor(
                        st["exp_avg_sq"], param.device_mesh, param.placements
                    ),
                }

    def _full(self, tensor: torch.Tensor) -> torch.Tensor:
        """The whole tensor (gathered from every process when sharded: a collective)."""
        full = getattr(tensor, "full_tensor", None)
        return full() if full is not None else tensor

    def _my_share(
        self, samples: list[TrainSample], useful: list[int]
    ) -> list[tuple[PackedBatch, float]]:
        """This process's micro-batches with their loss weight: whole groups dealt out
        round-robin over the processes, padded with zero-weight repeats to the most any
        process has (each process runs as many forward and backward passes, so FSDP's
        collectives pair up)."""
        if self.world == 1:
            return [(part, 1.0) for part in self._micro_batches(samples, useful)]
        rank_of = {
            g: n % self.world for n, g in enumerate(sorted({samples[i].group for i in useful}))
        }
        shares = [
            self._micro_batches(samples, [i for i in useful if rank_of[samples[i].group] == r])
            for r in range(self.world)
        ]
        mine = [(part, 1.0) for part in shares[self.rank]]
        longest = max(len(share) for share in shares)
        if len(mine) < longest:
            filler = next(share[0] for share in shares if share)
            mine += [(filler, 0.0)] * (longest - len(mine))
        return mine

    # -- scoring ------------------------------------------------------------------------
    def _micro_batches(self, samples: list[TrainSample], indices: list[int]) -> list[PackedBatch]:
        """The ``indices`` of ``samples`` as prefix-tree rows (a group's shared prompt
        once), stacked into micro-batches of at most ``micro_batch_tokens`` tokens."""
        budget = self.config.micro_batch_tokens
        rows = packing.trees(samples, indices, budget)
        return [packing.pack(samples, mb) for mb in packing.micro_batches(samples, rows, budget)]

    def _token_logprobs(
        self,
        batch: PackedBatch,
        entropy: list[float] | None = None,
        scorer: torch.nn.Module | None = None,
    ) -> torch.Tensor:
        """The current weights' (or ``scorer``'s) log-probability of each scored token of
        ``batch`` [N]; with ``entropy``, also appends the sum of the sampling distribution's
        entropy (nats, the same truncation) at these tokens."""
        batch = batch.to(self.device)
        scorer = scorer or self.scorer
        if self.compute_dtype is torch.float32 or self.world > 1:  # FSDP2 casts by itself
            logits = scorer(batch)
        else:
            with torch.autocast(self.device.type, dtype=self.compute_dtype):
                logits = scorer(batch)
        cfg = self.config
        logits = logits.float() / cfg.temperature
        if cfg.top_k or cfg.top_p < 1.0:
            logprobs = truncated_log_softmax(logits, cfg.top_k, cfg.top_p)
        else:
            logprobs = torch.log_softmax(logits, dim=-1)
        if entropy is not None:
            with torch.no_grad():
                p = logprobs.exp()
                terms = torch.where(p > 0, -p * logprobs, torch.zeros_like(p))
                entropy.append(float(terms.sum()))
        return logprobs.gather(1, batch.targets.unsqueeze(1)).squeeze(1)

    @torch.no_grad()
    def _reference_logprobs(self, batch: PackedBatch) -> torch.Tensor:
        """The KL reference's log-probabilities of ``batch``'s scored tokens."""
        if self.reference is not None:
            return self._token_logprobs(batch, scorer=self.reference)
        with adapters_disabled(self.model):
            return self._token_logprobs(batch)

    @torch.no_grad()
    def score(self, samples: list[TrainSample]) -> list[list[float]]:
        """The current weights' log-probability of each masked token (0 elsewhere), aligned
        with each sample's tokens. (Every process scores every sample: the same passes,
        so FSDP's collectives pair up.)"""
        out = [[0.0] * len(s.token_ids) for s in samples]
        for batch in self._micro_batches(samples, list(range(len(samples)))):
            logprobs = self._token_logprobs(batch)
            where = zip(batch.sample.tolist(), batch.offsets.tolist(), strict=True)
            for (i, t), lp in zip(where, logprobs.tolist(), strict=True):
                out[i][t] = lp
        return out

    # -- training -----------------------------------------------------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One GRPO step on ``batch.samples`` (``ppo_epochs`` x ``mini_batches`` optimizer
        updates); returns what it measured."""
        if self.lent:
            raise DeviceLentError("the trainer's device is lent to rollout; restore it first")
        every = list(batch.samples)
        if not every:
            raise ValueError(f"train step {batch.step} has no samples")
        # An episode its environment failed (raised, wrong type, timed out) says nothing
        # about the policy: it counts as reward 0 in the step's reward, but neither trains
        # nor moves its group's baseline.
        samples = [s for s in every if s.stop_reason not in ENV_FAILURES]
        t0 = time.perf_counter()
        cfg = self.config
        advantage = advantages(
            [s.reward for s in samples],
            [s.group for s in samples],
            cfg.advantage_estimator,
            cfg.scale_rewards,
        )
        minis = mini_batches(samples, cfg.mini_batches)
        # Several updates a step: every one's ratio is against the step's starting weights.
        old = self.score(samples) if cfg.ppo_epochs * len(minis) > 1 else None
        totals: dict[str, float] = {}
        norms: list[float] = []
        for epoch in range(cfg.ppo_epochs):
            for mini in minis:
                measured = self.backward(
                    [samples[i] for i in mini],
                    [advantage[i] for i in mini],
                    None if old is None else [old[i] for i in mini],
                )
                if measured["scored_trajectories"]:
                    norms.append(self._clip_and_step(batch.step))
                for key, value in measured.items():
                    if key == "mismatch_max":
                        totals[key] = max(totals.get(key, 0.0), value)
                    elif epoch == 0 or key not in ("batch_tokens", "overlong_masked"):
                        totals[key] = totals.get(key, 0.0) + value
        self.version += 1  # a step with nothing to learn still makes (unchanged) weights v+1
        stats = step_metrics(every, len(samples), totals, norms, cfg)
        return {**stats, "seconds": time.perf_counter() - t0, "memory_mb": self.peak_memory_mb()}

    def state_bytes(self) -> dict[str, int]:
        """Bytes of the training state this process holds (its shard, when sharded): the
        weights, their gradients, AdamW's moments and the KL reference's weights."""

        def size(tensors) -> int:
            total = 0
            for t in tensors:
                local = getattr(t, "to_local", None)
                t = local() if local is not None else t
                total += t.numel() * t.element_size()
            return total

        params = list(self.model.parameters())
        moments = [v for st in self.optimizer.state.values() for v in st.values() if v.dim()]
        reference = self.reference.parameters() if self.reference is not None else []
        return {
            "weights": size(params),
            "gradients": size(p.grad for p in params if p.grad is not None),
            "optimizer": size(moments),
            "reference": size(reference),
        }

    def peak_memory_mb(self) -> float:
        """The most memory this process has held: on a GPU the device memory PyTorch
        allocated, on CPU the process's peak resident set (weights, gradients, optimizer,
        activations and everything else it loaded)."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    def _clip_and_step(self, step: int) -> float:
        """Clip the gradient's norm and take an optimizer step; the norm before clipping."""
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        grad_norm = float(self._full(norm))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"train step {step}: gradient norm is {grad_norm}")
        self.optimizer.step()
        return grad_norm

    def backward(
        self,
        samples: list[TrainSample],
        advantage: list[float] | None = None,
        old: list[list[float]] | None = None,
    ) -> dict[str, float]:
        """The GRPO loss of ``samples`` (``pearl.live.grpo``, the configured variant) and its
        gradient in the parameters' ``.grad`` (zeroed first); no optimizer step. Returns the
        loss and what it counted, over every process's share. ``advantage``: the samples'
        (default: computed from these samples alone); ``old``: the log-probabilities to
        take the ratio against, aligned with each sample's tokens (``score``'s output;
        default: the engine's behaviour log-probabilities, or with ``recompute_logprobs``
        the current weights')."""
        batch = loss_terms(samples, advantage, self.config)
        self.optimizer.zero_grad(set_to_none=True)
        # loss, tokens, clipped, ratios, entropy, kl, |trainer - engine| log-prob sum
        sums = torch.zeros(7, dtype=torch.float64)
        mismatch_max = torch.zeros(1, dtype=torch.float64)
        for part, weight in self._my_share(samples, batch.useful):
            loss, measured, gap = self._part_loss(part, batch, old)
            # Each process's loss is its share of the batch's weighted token sum; FSDP
            # averages the processes' gradients (gloo has no pre-scaled sum), so scaling by
            # their number makes the average the sum.
            scale = weight * self.world
            (loss * scale if scale != 1.0 else loss).backward()
            if weight:
                sums += torch.tensor([float(loss.detach()), *measured], dtype=torch.float64)
                if gap.numel():
                    mismatch_max = torch.maximum(mismatch_max, gap.max().double().cpu().view(1))
        sums, mismatch_max = self._batch_totals(sums, mismatch_max)
        loss_sum, tokens, clipped, ratio_sum, entropy_sum, kl_sum, gap_sum = sums.tolist()
        return {
            "loss": loss_sum,
            "tokens": tokens,
            "clipped": clipped,
            "ratio_sum": ratio_sum,
            "entropy_sum": entropy_sum,
            "kl_sum": kl_sum,
            "mismatch_sum": gap_sum,
            "mismatch_max": float(mismatch_max[0]),
            "batch_tokens": float(batch.total),
            "scored_trajectories": float(len(batch.useful)),
            "overlong_masked": float(sum(batch.overlong)),
        }

    def _part_loss(
        self, part: PackedBatch, batch: LossTerms, old: list[list[float]] | None
    ) -> tuple[torch.Tensor, list[float], torch.Tensor]:
        """One packed part's loss (not yet backpropagated), what it counted (tokens,
        clipped, ratios, entropy, kl, mismatch sum) and its per-token log-prob gap between
        trainer and engine."""
        cfg = self.config
        entropy: list[float] = []
        logprobs = self._token_logprobs(part, entropy).unsqueeze(1)  # [N, 1]: a token a row
        behaviour = part.behaviour.to(self.device).unsqueeze(1)
        ratio_base, is_weights = behaviour, None
        if old is not None:  # the step's own, scored before its first update
            where = zip(part.sample.tolist(), part.offsets.tolist(), strict=True)
            ratio_base = torch.tensor(
                [old[i][t] for i, t in where], dtype=torch.float32, device=self.device
            ).unsqueeze(1)
        elif cfg.recompute_logprobs:  # one update a batch: the step's own = these
            ratio_base = logprobs.detach()
        if cfg.recompute_logprobs:
            is_weights = truncated_is_weights(ratio_base, behaviour, cfg.tis_cap)
        # The mismatch metrics: the trainer's numbers for the weights that start the
        # step, against the engine's for the weights that sampled (older by the
        # staleness, and another implementation).
        start = ratio_base if old is not None else logprobs.detach()
        gap = (start - behaviour).abs()
        kl = None
        if cfg.kl_coef > 0:
            ref = self._reference_logprobs(part).unsqueeze(1)
            kl = kl_per_token(logprobs, ref, cfg.kl_estimator)
            if cfg.kl_ratio_correction:
                kl = kl * torch.exp(logprobs - behaviour)
        loss, stats = clipped_token_loss(
            logprobs,
            ratio_base,
            batch.advantage[part.sample].to(self.device),
            torch.ones_like(logprobs),
            batch.clip,
            None if batch.weights is None else batch.weights[part.sample].to(self.device),
            batch.divisor,
            kl,
            cfg.kl_coef,
            is_weights,
        )
        measured = [
            stats["tokens"],
            stats["clipped"],
            stats["ratio_sum"],
            *entropy,
            stats["kl_sum"],
            float(gap.sum()),
        ]
        return loss, measured, gap

    def _batch_totals(
        self, sums: torch.Tensor, mismatch_max: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's sums and largest mismatch made the whole batch's (every
        process's), on every process."""
        if self.world == 1:
            return sums, mismatch_max
        import torch.distributed as dist  # live extra

        on_device = sums.to(self.device)  # nccl reduces device tensors only
        dist.all_reduce(on_device)
        largest = mismatch_max.to(self.device)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        return on_device.cpu(), largest.cpu()

    # -- weights, devices, checkpoints ----------------------------------------------------
    def _whole_weights(self) -> dict[str, torch.Tensor]:
        """Every parameter as a whole tensor (gathered when sharded: a collective)."""
        return {n: self._full(p.detach()) for n, p in self.model.named_parameters()}

    def weights(self) -> tuple[int, dict[str, np.ndarray]]:
        """(version, weights as numpy arrays) for the rollout workers: with LoRA, the base
        weights with the adapters merged in."""
        weights = self._whole_weights()
        if self.rank:
            return self.version, {}  # rank 0 publishes; the others took part in gathering
        if self.adapted:
            weights = merged_weights(self.model, weights)
        return self.version, {n: w.cpu().numpy().copy() for n, w in weights.items()}

    def where(self) -> dict[str, Any]:
        """The node this actor runs on (inside a Ray actor only)."""
        return actor_location()

    def release_device(self) -> None:
        self.lent = True

    def restore_device(self) -> None:
        self.lent = False

    def save(self, folder: str | Path) -> Path:
        """Write weights (a loadable model folder), optimizer moments and counters, and
        wait until they are on disk (a checkpoint of these weights already written or
        being written to ``folder`` is not written again)."""
        if self._last_saved != (Path(folder), self.version):
            self.save_async(folder)
        self.flush()
        return Path(folder)

    def save_async(self, folder: str | Path) -> None:
        """Snapshot the weights, optimizer moments and counters now (a copy in memory) and
        write them in the background, so that training goes on while the checkpoint is
        written (SmolLM2-135M: 1.6 GB, ~4 s on the dev machine). One write is in flight at
        a time; the folder appears whole (written as ``<folder>.tmp``, then renamed). A
        failed write raises at the next ``save``, ``save_async`` or ``flush``."""
        self.flush()
        names = {id(p): n for n, p in self.model.named_parameters()}
        weights = {n: t.cpu().clone() for n, t in self._whole_weights().items()}
        moments: dict[str, torch.Tensor] = {}
        steps: dict[str, float] = {}
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                state = self.optimizer.state.get(p)
                if state:
                    name = names[id(p)]
                    moments[f"{name}:exp_avg"] = self._full(state["exp_avg"]).cpu().clone()
                    moments[f"{name}:exp_avg_sq"] = self._full(state["exp_avg_sq"]).cpu().clone()
                    steps[name] = float(state["step"])
        if self.rank:  # it took part in gathering; rank 0 writes
            self._last_saved = (Path(folder), self.version)
            return
        adapter = None
        if self.adapted:
            assert self.config.lora is not None
            adapter = adapter_files(self.config.lora, weights, self.base_model, self.adapted)
            weights = merged_weights(self.model, weights)
        meta = {"version": self.version, "steps": steps, "config": asdict(self.config)}
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint")
        self._pending = self._writer.submit(
            write_checkpoint, Path(folder), self.model.config, weights, moments, meta, adapter
        )
        self._last_saved = (Path(folder), self.version)

    def flush(self) -> None:
        """Wait for the checkpoint being written, if any (and raise its error)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except BaseException:
                self._last_saved = None  # that folder is not on disk
                raise

    def load(self, folder: str | Path) -> None:
        """Restore weights, optimizer moments and the version from ``save``'s folder (with
        LoRA: the adapters, on the base weights this trainer started from)."""
        if self.world > 1:
            raise RuntimeError("load a checkpoint before init_distributed shards the model")
        folder = Path(folder)
        meta, moments = read_checkpoint(folder)
        named = dict(self.model.named_parameters())
        if self.adapted:
            try:
                adapters = read_adapters(folder / "adapter")
            except OSError:
                raise CheckpointError(
                    f"{folder}: no adapter/ folder: not a checkpoint of a LoRA run (resume it "
                    "without trainer.lora, or start from its model folder as model.name)"
                ) from None
            with torch.no_grad():
                for name in (f"{m}.lora_{ab}" for m in self.adapted for ab in "AB"):
                    if name not in adapters or adapters[name].shape != named[name].shape:
                        raise CheckpointError(f"{folder}: adapter {name} missing or reshaped")
                    named[name].copy_(adapters[name])
        else:
            load_state_dict(self.model, read_safetensors_folder(folder), source=str(folder))
        for name, step in meta.get("steps", {}).items():
            if name not in named:
                raise CheckpointError(f"{folder}: optimizer state for unknown tensor {name!r}")
            self.optimizer.state[named[name]] = {
                "step": torch.tensor(step),
                "exp_avg": moments[f"{name}:exp_avg"].to(self.device),
                "exp_avg_sq": moments[f"{name}:exp_avg_sq"].to(self.device),
            }
        self.version = int(meta["version"])
