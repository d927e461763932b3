"""How long engine iterations, training steps, weight syncs and worker lifecycles take.

The iteration model is a per-part roofline on one tensor-parallel (TP) group:

    time = linear + prefill attention + decode attention + TP all-reduces + overheads
    part = max(FLOPs / (peak FLOP/s * compute efficiency), bytes / (HBM B/s * memory efficiency))

Parts run one after another (separate kernels), so their times add. Every FLOP and byte
is per GPU: a TP group splits weights, heads and KV heads ``tp`` ways. Work is computed
first, hardware-independently (:class:`IterationWork`), then priced
(:class:`IterationCost`) — calibration fits the prices on measured iterations.

All constants are fields of :class:`CostConstants`; defaults describe an SGLang-like
engine on H800/H100-class GPUs and come from public kernel benchmarks and engineering
judgement, not from PEARL's reported results.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from pearl.errors import ConfigError
from pearl.sim.hardware import GPUSpec
from pearl.sim.shapes import ModelShape, load_model_shape


@dataclass(slots=True, frozen=True)
class CostConstants:
    """Efficiencies and fixed costs; every number the cost model uses beyond the specs."""

    # --- inference roofline ------------------------------------------------------------
    # The four linear-layer numbers are fitted to measured H100 GEMM times (Vidur's
    # profiles of Llama-2-7B/70B and CodeLlama-34B at TP1-2; pearl.sim.operator_fit,
    # benchmarks/costmodel_vs_profiles.py checks the held-out models and TP degrees).
    linear_compute_efficiency: float = 0.7285
    """Fraction of peak FLOP/s the linear layers reach once compute-bound (bf16 GEMMs)."""
    attention_compute_efficiency: float = 0.5
    """Fraction of peak FLOP/s reached by attention kernels (FlashAttention-3 reaches
    ~60-75% on long sequences, FlashInfer/FA2 paged prefill ~40-50%)."""
    weight_memory_efficiency: float = 0.9291
    """Fraction of HBM bandwidth reached when streaming weights (large contiguous reads)."""
    linear_roofline_exponent: float = 1.763
    """p of the smooth roofline ``(t_compute^p + t_memory^p)^(1/p)`` of the linear layers:
    GEMMs of tens to hundreds of tokens are neither purely memory- nor compute-bound.
    ``inf`` is the sharp ``max``."""
    linear_kernel_overhead_s: float = 6.19e-6
    """Fixed cost per linear kernel (launch and tail; 4 per layer plus the LM head)."""
    kv_memory_efficiency: float = 0.7
    """Fraction of HBM bandwidth reached when reading a paged KV cache (gathered pages,
    per-sequence imbalance)."""
    collective_efficiency: float = 0.7
    """Fraction of link bandwidth a ring all-reduce reaches (NCCL bus bandwidth)."""
    allreduce_latency_s: float = 10e-6
    """Fixed cost of one small TP all-reduce (custom all-reduce kernels: ~5-15 us)."""
    iteration_overhead_s: float = 1e-3
    """Fixed cost per non-empty iteration: scheduling, sampling, CUDA-graph launch,
    host-device syncs that the engine cannot hide."""
    per_sequence_overhead_s: float = 0.0
    """Fixed cost per decoding sequence per iteration (0 on GPUs, where batch metadata is
    built in bulk; the CPU engine pays a Python cost per sequence)."""
    per_prefill_chunk_overhead_s: float = 2e-4
    """Fixed cost per prefill chunk: prefix-cache matching, page allocation, metadata."""
    kv_memory_fraction: float = 0.85
    """Fraction of device memory an engine may fill with weights plus KV cache (like
    SGLang's mem_fraction_static); the rest holds activations and CUDA graphs."""
    moe_compute_efficiency_ratio: float = 1.0
    """Compute efficiency of the routed experts' (fused-MoE) kernels as a fraction of
    ``linear_compute_efficiency``: 1 prices experts as dense GEMMs; below 1 their FLOPs
    take longer once compute-bound (docs/regime.md, "MoE prefill efficiency")."""

    # --- training (GRPO step) ----------------------------------------------------------
    train_mfu: float = 0.35
    """Model FLOPs utilization of the trainer (FSDP2, long sequences, activation
    recomputation not counted as useful FLOPs)."""
    train_extra_forward_passes: float = 1.0
    """Forward passes besides the training forward/backward: GRPO recomputes old-policy
    log-probs (1); a reference model for a KL term would add one more."""
    train_param_gather_passes: float = 2.0
    """FSDP parameter all-gathers per step (forward and backward), in weight dtype."""
    train_grad_bytes_per_param: float = 4.0
    """Bytes per parameter in the gradient reduce-scatter (fp32 reduction)."""
    train_comm_overlap: float = 0.5
    """Fraction of FSDP communication hidden behind compute."""
    train_step_overhead_s: float = 2.0
    """Fixed cost per step: batching, optimizer step, snapshotting, Python."""

    # --- weight sync -------------------------------------------------------------------
    weight_sync_efficiency: float = 0.8
    """Fraction of the receivers' link bandwidth a pipelined broadcast reaches."""
    weight_sync_hop_latency_s: float = 1e-3
    """Start-up cost per level of the broadcast tree."""
    weight_sync_overhead_s: float = 2.0
    """Fixed cost of installing new weights in an engine (pause, load, flush caches)."""

    def __post_init__(self) -> None:
        fractions = ("kv_memory_fraction", "train_comm_overlap")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"CostConstants.{f.name} must be a number, got {value!r}")
            if f.name in fractions:
                if not 0.0 <= value <= 1.0:
                    raise ConfigError(f"CostConstants.{f.name} must be in [0, 1], got {value!r}")
            elif f.name == "linear_roofline_exponent":
                if not value >= 1.0:  # also rejects NaN; inf is the sharp roofline
                    raise ConfigError(
                        f"CostConstants.{f.name} must be >= 1 (inf: sharp max), got {value!r}"
                    )
            elif f.name.endswith(("_efficiency", "_efficiency_ratio")) or f.name == "train_mfu":
                # Above 1 is allowed: calibration may fold a placeholder peak into it.
                if not value > 0.0:
                    raise ConfigError(f"CostConstants.{f.name} must be > 0, got {value!r}")
            elif value < 0.0:
                raise ConfigError(f"CostConstants.{f.name} must be >= 0, got {value!r}")


@dataclass(slots=True, frozen=True)
class WorkerLatencies:
    """Seconds for a rollout worker's lifecycle operations (defaults: Qwen3-8B, measured)."""

    prepare_s: float = 56.29
    """Inter-scale preparation: start a new worker, load weights, warm up (SPEC "Measured costs")."""
    finalize_s: float = 11.05
    """Inter-scale finalization: admit a prepared group into serving."""
    activate_s: float = 6.26
    """Intra-scale activation: restore weights, KV cache and CUDA graphs on a training GPU."""
    deactivate_s: float = 3.18
    """Intra-scale deactivation: release device state and hand the GPU back."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"WorkerLatencies.{f.name} must be >= 0, got {value!r}")

    @classmethod
    def for_model(cls, model: ModelShape) -> WorkerLatencies:
        """Latencies scaled to ``model`` by its weight bytes, from PEARL's two measurements.

        Rule: each latency is linear in weight bytes through the Qwen3-8B and Qwen3-30B-A3B
        points; outside that range the line continues with its slope floored at 0 (more
        weights never make an operation faster), and results are floored at 0.
        """
        (x0, lo), (x1, hi) = _measured_points()
        x = float(model.weight_bytes)
        values = {}
        for f in fields(cls):
            y0, y1 = getattr(lo, f.name), getattr(hi, f.name)
            slope = (y1 - y0) / (x1 - x0)
            if x < x0:
                y = y0 - max(slope, 0.0) * (x0 - x)
            elif x > x1:
                y = y1 + max(slope, 0.0) * (x - x1)
            else:
                y = y0 + slope * (x - x0)
            values[f.name] = max(y, 0.0)
        return cls(**values)


MEASURED_LATENCIES: dict[str, WorkerLatencies] = {
    "Qwen3-8B": WorkerLatencies(56.29, 11.05, 6.26, 3.18),
    "Qwen3-30B-A3B": WorkerLatencies(67.06, 17.89, 6.09, 4.38),
}
"""PEARL's Table 3 (mean seconds on H800, TP2 workers), by model."""


@functools.cache
def _measured_points() -> tuple[tuple[float, WorkerLatencies], tuple[float, WorkerLatencies]]:
    small, large = (
        (float(load_model_shape(name).weight_bytes), lat)
        for name, lat in MEASURED_LATENCIES.items()
    )
    return small, large


@dataclass(slots=True, frozen=True)
class IterationWork:
    """One iteration's work on one GPU of the TP group, before any hardware pricing."""

    tokens: int
    """Tokens through the linear layers (prefill chunk tokens + one per decode)."""
    sampled_tokens: int
    """Tokens through the LM head (every decode, one per prefill chunk)."""
    decode_sequences: int
    prefill_chunks: int
    linear_flops: float
    weight_bytes: float
    """Weights read: dense layers once, experts touched, LM head once."""
    prefill_attention_flops: float
    prefill_kv_bytes: float
    """Prior-context KV read once per chunk plus new KV written."""
    decode_attention_flops: float
    decode_kv_bytes: float
    allreduce_count: int
    allreduce_bytes: float
    """Size of each all-reduce message (tokens x hidden x dtype bytes)."""


@dataclass(slots=True, frozen=True)
class IterationCost:
    """Seconds per part of one iteration; ``total_s`` is what the engine waits."""

    linear_s: float
    prefill_attention_s: float
    decode_attention_s: float
    communication_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        """Sum of the parts (they run one after another)."""
        return (
            self.linear_s
            + self.prefill_attention_s
            + self.decode_attention_s
            + self.communication_s
            + self.overhead_s
        )


def linear_seconds(
    flops: float, weight_bytes: float, kernels: int, c: CostConstants, gpu: GPUSpec
) -> float:
    """Linear layers: ``kernels * t_kernel + (t_compute^p + t_memory^p)^(1/p)``, a roofline
    that turns smoothly from memory- to compute-bound (``p = inf``: the sharp max)."""
    t_c = flops / (gpu.peak_flops * c.linear_compute_efficiency)
    t_m = weight_bytes / (gpu.hbm_bandwidth_Bps * c.weight_memory_efficiency)
    hi, lo = (t_c, t_m) if t_c >= t_m else (t_m, t_c)
    p = c.linear_roofline_exponent
    smooth = hi if p == math.inf or hi == 0.0 else hi * (1.0 + (lo / hi) ** p) ** (1.0 / p)
    return kernels * c.linear_kernel_overhead_s + smooth


def allreduce_seconds(message_bytes: float, gpus: int, link_Bps: float, c: CostConstants) -> float:
    """One ring all-reduce of ``message_bytes`` over ``gpus`` GPUs: a fixed latency plus
    ``2 (n - 1) / n`` of the message over each GPU's link at the collective efficiency."""
    ring = 2.0 * (gpus - 1) / gpus * message_bytes
    return c.allreduce_latency_s + ring / (link_Bps * c.collective_efficiency)


@dataclass(slots=True, frozen=True)
class CostModel:
    """Seconds for engine iterations of ``model`` on a TP group of ``tp`` ``gpu``s."""

    gpu: GPUSpec
    model: ModelShape
    tp: int = 1
    constants: CostConstants = field(default_factory=CostConstants)
    latencies: WorkerLatencies | None = None
    """Lifecycle latencies (a cost profile's); None: scaled to the model from PEARL's
    measurements (``WorkerLatencies.for_model``)."""
    # Derived per-GPU numbers, fixed at construction so iteration_time stays cheap.
    _layer_dense_bytes: float = field(init=False, repr=False, compare=False)
    _lm_head_bytes: float = field(init=False, repr=False, compare=False)
    _expert_layer_bytes: float = field(init=False, repr=False, compare=False)
    _expert_miss: float = field(init=False, repr=False, compare=False)
    _q_shard: float = field(init=False, repr=False, compare=False)
    _kv_shard: float = field(init=False, repr=False, compare=False)
    _link_Bps: float = field(init=False, repr=False, compare=False)
    # Model shape numbers used per iteration (ModelShape computes them on every access).
    _active_layer_params: float = field(init=False, repr=False, compare=False)
    _lm_head_params: float = field(init=False, repr=False, compare=False)
    _pair_flops: float = field(init=False, repr=False, compare=False)
    _kv_token_bytes: float = field(init=False, repr=False, compare=False)
    _is_moe: bool = field(init=False, repr=False, compare=False)
    _linear_kernels: int = field(init=False, repr=False, compare=False)
    _extra_expert_flops: float = field(init=False, repr=False, compare=False)
    """FLOPs added per token so the routed experts' are priced at their own efficiency."""
    # Decode attention's bounds, context * a / b: both (a, b) pairs' divisors, and the pair
    # that is the larger at every context (None if neither always is); a decode step's
    # batch-fixed parts.
    _attention_divisors: tuple[float, float] = field(init=False, repr=False, compare=False)
    _attention_slope: tuple[float, float] | None = field(init=False, repr=False, compare=False)
    _decode_fixed: dict[int, tuple[float, float, float]] = field(
        init=False, repr=False, compare=False
    )
    _range: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ConfigError(f"CostModel.tp must be a positive integer, got {self.tp!r}")
        self._derive_per_gpu()
        self._derive_attention_bounds()
        object.__setattr__(self, "_decode_fixed", {})
        object.__setattr__(self, "_range", np.arange(0, dtype=np.float64))

    def _derive_per_gpu(self) -> None:
        """One GPU's share of the weights and heads, its all-reduce link, and the model
        shape's numbers an iteration uses (fixed here: ModelShape computes them per access)."""
        m, tp = self.model, self.tp
        setattr_ = object.__setattr__
        setattr_(self, "_layer_dense_bytes", m.layer_dense_params * m.dtype_bytes / tp)
        setattr_(self, "_lm_head_bytes", m.lm_head_params * m.dtype_bytes / tp)
        # Bytes if every expert of every MoE layer is read once (experts split tp ways).
        setattr_(
            self,
            "_expert_layer_bytes",
            m.moe_layers * m.num_experts * m.expert_bytes_per_expert / tp,
        )
        # Chance that one token does not route to a given expert.
        setattr_(
            self, "_expert_miss", 1.0 - m.num_experts_per_tok / m.num_experts if m.is_moe else 1.0
        )
        # Heads split tp ways; with more ranks than KV heads, KV heads are replicated.
        setattr_(
            self,
            "_q_shard",
            math.ceil(m.num_attention_heads / tp) / m.num_attention_heads,
        )
        setattr_(
            self,
            "_kv_shard",
            math.ceil(m.num_key_value_heads / tp) / m.num_key_value_heads,
        )
        # A TP group inside one node all-reduces over NVLink, otherwise over the NICs.
        link = (
            self.gpu.nvlink_bandwidth_Bps
            if tp <= self.gpu.gpus_per_node
            else self.gpu.network_bandwidth_Bps
        )
        setattr_(self, "_link_Bps", link)
        setattr_(self, "_active_layer_params", m.active_layer_params)
        setattr_(self, "_lm_head_params", m.lm_head_params)
        setattr_(self, "_pair_flops", m.attention_flops_per_token_pair * self._q_shard)
        setattr_(self, "_kv_token_bytes", m.kv_bytes_per_token * self._kv_shard)
        setattr_(self, "_is_moe", m.is_moe)
        setattr_(self, "_linear_kernels", 4 * m.num_hidden_layers + 1)

    def _derive_attention_bounds(self) -> None:
        """The routed experts' extra FLOPs, and decode attention's compute and memory bounds
        (their divisors, and the one that is larger at every context, if one is)."""
        m, tp = self.model, self.tp
        setattr_ = object.__setattr__
        c, g = self.constants, self.gpu
        routed = (
            m.moe_layers * m.num_experts_per_tok * m.expert_params_per_expert if m.is_moe else 0
        )
        extra = 0.0
        if routed and c.moe_compute_efficiency_ratio != 1.0:
            extra = 2.0 * routed / tp * (1.0 / c.moe_compute_efficiency_ratio - 1.0)
        setattr_(self, "_extra_expert_flops", extra)
        flops = g.peak_flops * c.attention_compute_efficiency
        memory = g.hbm_bandwidth_Bps * c.kv_memory_efficiency
        setattr_(self, "_attention_divisors", (flops, memory))
        # (context * a) / b rounds within 2 ulps of the exact value: a margin of 1e-9
        # between the two slopes decides the max for every context, bitwise.
        compute, kv = self._pair_flops / flops, self._kv_token_bytes / memory
        slope = None
        if compute > (1 + 1e-9) * kv:
            slope = (self._pair_flops, flops)
        elif kv > (1 + 1e-9) * compute:
            slope = (self._kv_token_bytes, memory)
        setattr_(self, "_attention_slope", slope)

    # --- work ------------------------------------------------------------------------

    def expected_experts_touched(self, tokens: int) -> float:
        """Expected distinct experts per MoE layer that ``tokens`` tokens route to.

        E * (1 - (1 - k/E)^T), assuming uniform independent routing; 0 for dense models.
        """
        m = self.model
        if not m.is_moe or tokens <= 0:
            return 0.0
        return m.num_experts * (1.0 - self._expert_miss**tokens)

    def iteration_work(
        self, prefills: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> IterationWork:
        """Work of one iteration; see :meth:`iteration_time` for the arguments."""
        total_context = 0
        for context in decode_contexts:
            if isinstance(context, bool) or not isinstance(context, int) or context < 1:
                raise ValueError(
                    f"decode context must be an integer >= 1 (it includes the token being "
                    f"decoded), got {context!r}"
                )
            total_context += context
        return self._work(prefills, len(decode_contexts), total_context)

    def _work(
        self, prefills: Sequence[tuple[int, int]], decodes: int, decode_context: int
    ) -> IterationWork:
        m = self.model
        new_tokens = 0
        prior_tokens = 0
        pairs = 0
        for chunk in prefills:
            tokens, prior = chunk
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
                raise ValueError(f"prefill chunk tokens must be an integer >= 1, got {chunk!r}")
            if isinstance(prior, bool) or not isinstance(prior, int) or prior < 0:
                raise ValueError(
                    f"prefill chunk prior context must be an integer >= 0, got {chunk!r}"
                )
            new_tokens += tokens
            prior_tokens += prior
            # Token i of the chunk attends to the prior context and to tokens 0..i (causal).
            pairs += tokens * prior + tokens * (tokens + 1) // 2
        tokens = new_tokens + decodes
        sampled = decodes + len(prefills)
        tp = self.tp
        linear_flops = (
            2.0 * (self._active_layer_params * tokens + self._lm_head_params * sampled) / tp
        )
        weight_bytes = 0.0
        if tokens:
            weight_bytes = self._layer_dense_bytes + self._lm_head_bytes
            if self._is_moe:
                weight_bytes += self._expert_layer_bytes * (1.0 - self._expert_miss**tokens)
        pair_flops = self._pair_flops
        kv_token = self._kv_token_bytes
        return IterationWork(
            tokens=tokens,
            sampled_tokens=sampled,
            decode_sequences=decodes,
            prefill_chunks=len(prefills),
            linear_flops=linear_flops,
            weight_bytes=weight_bytes,
            prefill_attention_flops=pairs * pair_flops,
            prefill_kv_bytes=(prior_tokens + new_tokens) * kv_token,
            decode_attention_flops=decode_context * pair_flops,
            decode_kv_bytes=decode_context * kv_token,
            allreduce_count=2 * m.num_hidden_layers if tp > 1 and tokens else 0,
            allreduce_bytes=float(tokens * m.hidden_size * m.dtype_bytes),
        )

    # --- pricing -------------------------------------------------------------------------

    def price(self, work: IterationWork) -> IterationCost:
        """Seconds per part for ``work`` on this GPU with these constants."""
        c, g = self.constants, self.gpu
        flops_attn = g.peak_flops * c.attention_compute_efficiency
        bw_kv = g.hbm_bandwidth_Bps * c.kv_memory_efficiency
        communication = 0.0
        if work.allreduce_count:
            per_call = allreduce_seconds(work.allreduce_bytes, self.tp, self._link_Bps, c)
            communication = work.allreduce_count * per_call
        overhead = 0.0
        if work.tokens:
            overhead = (
                c.iteration_overhead_s
                + c.per_sequence_overhead_s * work.decode_sequences
                + c.per_prefill_chunk_overhead_s * work.prefill_chunks
            )
        linear = 0.0
        if work.tokens:
            flops = work.linear_flops
            if self._extra_expert_flops:  # experts slower than dense GEMMs (their FLOPs weigh more)
                flops += self._extra_expert_flops * work.tokens
            linear = linear_seconds(flops, work.weight_bytes, self._linear_kernels, c, g)
        return IterationCost(
            linear_s=linear,
            prefill_attention_s=max(
                work.prefill_attention_flops / flops_attn, work.prefill_kv_bytes / bw_kv
            ),
            decode_attention_s=max(
                work.decode_attention_flops / flops_attn, work.decode_kv_bytes / bw_kv
            ),
            communication_s=communication,
            overhead_s=overhead,
        )

    def iteration_cost(
        self, prefills: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> IterationCost:
        """Per-part seconds of one iteration (see :meth:`iteration_time`)."""
        return self.price(self.iteration_work(prefills, decode_contexts))

    def iteration_time(
        self, prefills: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> float:
        """Seconds for one engine iteration on the TP group.

        ``prefills``: one ``(num_tokens, prior_context_tokens)`` per prefill chunk;
        ``decode_contexts``: per decoding sequence, the tokens it attends to (itself
        included). Every decode and one token per prefill chunk are sampled. An empty
        iteration takes 0 s.
        """
        return self.iteration_cost(prefills, decode_contexts).total_s

    def decode_time(self, batch_size: int, total_context: int) -> float:
        """Seconds for a decode-only iteration of ``batch_size`` sequences whose contexts
        sum to ``total_context``; equals ``iteration_time([], contexts)`` exactly."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"batch_size must be an integer >= 0, got {batch_size!r}")
        if not isinstance(total_context, int) or total_context < batch_size:
            raise ValueError(
                f"total_context must be an integer >= batch_size ({batch_size}) since every "
                f"sequence attends at least to itself, got {total_context!r}"
            )
        return self.price(self._work((), batch_size, total_context)).total_s

    def decode_times(self, batch_size: int, total_context: int, steps: int) -> list[float]:
        """Seconds of ``steps`` consecutive decode-only iterations of ``batch_size`` sequences,
        the first with contexts summing to ``total_context``, each later one ``batch_size``
        tokens longer; equals ``decode_time`` step by step (the simulator's fast-forward)."""
        if steps <= 0:
            return []
        return self._decode_times(batch_size, total_context, steps).tolist()

    def decode_ends(
        self, start: float, batch_size: int, total_context: int, steps: int
    ) -> np.ndarray:
        """When each of those ``steps`` iterations ends, from ``start``: bitwise
        ``pearl.sim.worker.iteration_ends(start, decode_times(...))``, in one numpy pass,
        as an array (a fast-forward reads only a few of them: its last, and where a
        command cut it short; about half the steps priced are never run)."""
        ends = np.empty(max(0, steps) + 1)
        ends[0] = start
        self._decode_times_into(ends[1:], batch_size, total_context)
        return np.add.accumulate(ends, out=ends)[1:]

    def _decode_times(self, batch_size: int, total_context: int, steps: int) -> np.ndarray:
        return self._decode_times_into(np.empty(steps), batch_size, total_context)

    def _decode_times_into(
        self, out: np.ndarray, batch_size: int, total_context: int
    ) -> np.ndarray:
        """Fill ``out`` with the decode steps' seconds (hot: every fast-forward; in place,
        the parts fixed for a batch size cached, the same float operations in the same
        order as the plain form ``fixed + attention(context) + communication + overhead``)."""
        fixed = self._decode_fixed.get(batch_size)
        if fixed is None:
            first = self.price(self._work((), batch_size, total_context))
            fixed = self._decode_fixed[batch_size] = (
                first.linear_s + first.prefill_attention_s,
                first.communication_s,
                first.overhead_s,
            )
        before, communication, overhead = fixed
        # Only decode attention changes across the steps; it is linear in the context.
        np.multiply(self._steps_range(len(out)), batch_size, out=out)
        out += total_context  # each step's context
        slope = self._attention_slope
        if slope is not None:  # one bound is the larger at every context
            out *= slope[0]
            out /= slope[1]
        else:
            flops, memory = self._attention_divisors
            out[:] = np.maximum(out * self._pair_flops / flops, out * self._kv_token_bytes / memory)
        out += before
        out += communication
        out += overhead
        return out

    def _steps_range(self, steps: int) -> np.ndarray:
        """``np.arange(steps)`` as floats (a view of a cached range)."""
        if len(self._range) < steps:
            object.__setattr__(
                self, "_range", np.arange(max(steps, 2 * len(self._range)), dtype=np.float64)
            )
        return self._range[:steps]

    def prefill_time(self, tokens: int, prior: int = 0) -> float:
        """Seconds for an iteration holding a single prefill chunk and nothing else."""
        return self.iteration_time([(tokens, prior)], ())

    def kv_bytes(self, tokens: int) -> int:
        """KV-cache bytes of ``tokens`` tokens across the whole TP group (transfer size)."""
        return tokens * self.model.kv_bytes_per_token

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache one worker (TP group) can hold next to its weights."""
        m = self.model
        budget = self.gpu.hbm_bytes * self.constants.kv_memory_fraction
        free = budget - m.weight_bytes / self.tp
        per_token = m.kv_bytes_per_token * self._kv_shard
        return max(0, math.floor(free / per_token))

    # --- training, weight sync, lifecycle ---------------------------------------------

    def train_step_time(
        self, tokens: int, num_gpus: int, sequence_length: int | None = None
    ) -> float:
        """Seconds for one GRPO training step over ``tokens`` tokens on ``num_gpus`` GPUs.

        FLOPs: forward 2 x (active layer params + LM head) per token plus causal attention
        over sequences of ``sequence_length`` tokens (omitted when None); training costs
        3 forwards, plus ``train_extra_forward_passes``; divided by ``num_gpus`` x peak x
        MFU. Plus the exposed part of FSDP traffic and a fixed step overhead.
        """
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"tokens must be an integer >= 1, got {tokens!r}")
        if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
            raise ValueError(f"num_gpus must be an integer >= 1, got {num_gpus!r}")
        m, c, g = self.model, self.constants, self.gpu
        forward = 2.0 * (m.active_layer_params + m.lm_head_params) * tokens
        if sequence_length is not None:
            if sequence_length < 1:
                raise ValueError(f"sequence_length must be >= 1, got {sequence_length!r}")
            sequences = tokens / sequence_length
            pairs = sequences * sequence_length * (sequence_length + 1) / 2
            forward += pairs * m.attention_flops_per_token_pair
        flops = (3.0 + c.train_extra_forward_passes) * forward
        compute = flops / (num_gpus * g.peak_flops * c.train_mfu)
        communication = 0.0
        if num_gpus > 1:
            per_gpu = (
                (num_gpus - 1)
                / num_gpus
                * m.total_params
                * (c.train_param_gather_passes * m.dtype_bytes + c.train_grad_bytes_per_param)
            )
            link = (
                g.nvlink_bandwidth_Bps if num_gpus <= g.gpus_per_node else g.network_bandwidth_Bps
            )
            communication = per_gpu / (link * c.collective_efficiency)
        return compute + (1.0 - c.train_comm_overlap) * communication + c.train_step_overhead_s

    def weight_sync_time(self, num_receivers: int, bandwidth_Bps: float | None = None) -> float:
        """Seconds to broadcast the weights to ``num_receivers`` workers and install them.

        A pipelined (chunked) broadcast is bandwidth-bound by each receiver's link, so the
        time is nearly independent of the receiver count: bytes / (bandwidth x efficiency)
        + one start-up latency per tree level (log2) + the install overhead.
        ``bandwidth_Bps`` defaults to one GPU's network bandwidth.
        """
        if isinstance(num_receivers, bool) or not isinstance(num_receivers, int):
            raise ValueError(f"num_receivers must be an integer, got {num_receivers!r}")
        if num_receivers < 0:
            raise ValueError(f"num_receivers must be >= 0, got {num_receivers}")
        if num_receivers == 0:
            return 0.0
        bandwidth = self.gpu.network_bandwidth_Bps if bandwidth_Bps is None else bandwidth_Bps
        if not bandwidth > 0:
            raise ValueError(f"bandwidth_Bps must be > 0, got {bandwidth_Bps!r}")
        c = self.constants
        levels = math.ceil(math.log2(num_receivers + 1))
        transfer = self.model.weight_bytes / (bandwidth * c.weight_sync_efficiency)
        return transfer + levels * c.weight_sync_hop_latency_s + c.weight_sync_overhead_s

    def worker_latencies(self) -> WorkerLatencies:
        """Lifecycle latencies: the profile's, else scaled to this model
        (:meth:`WorkerLatencies.for_model`)."""
        return (
            self.latencies if self.latencies is not None else WorkerLatencies.for_model(self.model)
        )
