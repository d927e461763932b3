"""The cost model's iteration prices against kernels timed on one GPU (issue 60, item 5).

    python scripts/gpu_costmodel.py --out results/gpu_costmodel.json    # one H100 (not yet run)
    .venv/bin/python scripts/gpu_costmodel.py --tiny                     # CPU: tiny shapes, seconds

What it measures. Random weights at one GPU's share of a TP2 worker (``--tp``, the paper
regime's; the shard rule is the cost model's: query heads, KV heads, MLP and expert widths
and the LM head's vocabulary split ``tp`` ways, KV heads replicated when fewer than ``tp``)
of Qwen3-8B and Qwen3-30B-A3B, every dimension read from the simulator's model catalog
(``pearl.sim.shapes``). A stack of ``--layers`` decoder layers (8 by default) is timed, and
an iteration of the whole model is estimated as

    whole model = stack x (model layers / measured layers) + LM head (timed alone)

(the embedding lookup and final sampling are not timed). For each model:

* decode: one iteration of 1, 2, 4, 8, 16, 32 sequences at 16K tokens of context each,
  replayed as a CUDA graph (as SGLang runs decode);
* a prefill chunk of 8,192 tokens after 0, 8K and 16K tokens of prior context;
* prefills of 256-2,048 tokens with no prior context.

Prefills are timed eagerly (as SGLang runs them) and, on a GPU, also as a CUDA graph: the
difference is the launch overhead of the unfused MoE stand-in below. Every row is printed
beside ``CostModel.iteration_cost`` for the same work (same tokens, contexts, model and TP),
priced with the GPU catalog entry of the device (``--gpu``; H800's kernel prices equal
H100's, only NVLink differs) and the constants of ``--config`` (the paper regime's).
Compared: the kernels the script runs, i.e. the cost model's ``linear_s`` + attention. Not
measured: TP all-reduces (one GPU) and the engine's fixed ``overhead_s``; both are printed.

A layer: RMSNorm, fused QKV projection, per-head q/k RMSNorm (Qwen3), attention through
``torch.nn.functional.scaled_dot_product_attention`` at the real head counts (GQA; decode
folds each KV head's query group into one query block, as GQA decode kernels do; a chunk
after prior context uses the lower-right causal mask), output projection, RMSNorm, then a
SwiGLU MLP (fused gate/up) or the MoE block. RoPE is skipped (elementwise on q and k, a few
microseconds per layer). KV caches are contiguous per sequence, not paged: an upper bound
on a paged kernel's read efficiency.

The MoE block is an unfused stand-in: a router GEMM, softmax, top-k (renormalized, as
Qwen3-MoE), then for each expert that received tokens a gather of its tokens, a gate/up
GEMM, SwiGLU, a down GEMM and a weighted scatter-add. Routing is computed once before
timing (a host sync) so that the timed work, CUDA graphs included, runs each touched
expert's GEMMs over exactly its routed tokens with no sync; the router and top-k still run
in every timed pass. A fused kernel (SGLang's Triton fused_moe) does the same FLOPs and
reads the same touched experts, in one or two launches per layer instead of ~5 per expert,
with the tokens sorted by expert and padded to GEMM blocks: it removes the launch gaps that
the eager prefill rows show (the CUDA-graph rows do not have them) and runs fewer, fuller
GEMMs at small token counts per expert; its padding adds some FLOPs.

What to do with the result. Each row has the measured and priced seconds per part, and the
fraction of peak FLOP/s and of HBM bandwidth the measured part reached. Refit, with
``pearl.sim.operator_fit`` or by hand, the fields of ``pearl.sim.costmodel.CostConstants``
the rows inform: decode attention -> ``kv_memory_efficiency``; prefill-chunk attention ->
``attention_compute_efficiency``; the rest of decode (weights and touched experts read per
iteration, 1-32 sequences) -> ``weight_memory_efficiency`` and ``linear_kernel_overhead_s``;
the rest of prefill -> ``linear_compute_efficiency`` and ``linear_roofline_exponent`` (and,
for Qwen3-30B-A3B, whether the MoE prefill needs its own efficiency, issue 60 item 2).
``iteration_overhead_s``, ``per_prefill_chunk_overhead_s`` and the all-reduce constants
need an engine and two GPUs; this script does not inform them.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from pearl.apps.sim_build import build_cost_model
from pearl.config.simulate import load_simulate_config
from pearl.sim.costmodel import CostModel, IterationWork
from pearl.sim.hardware import GPU_CATALOG, GPUSpec, get_gpu
from pearl.sim.shapes import CATALOG_CONFIGS, ModelShape, load_model_shape

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("Qwen3-8B", "Qwen3-30B-A3B")


@dataclass(slots=True, frozen=True)
class Plan:
    """What to time: layers in the stack, the work shapes, warm-ups and timed repeats."""

    layers: int
    decode_batches: tuple[int, ...]
    decode_context: int
    chunk_tokens: int
    chunk_priors: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    warmup: int
    repeats: int


GPU_PLAN = Plan(
    8, (1, 2, 4, 8, 16, 32), 16384, 8192, (0, 8192, 16384), (256, 512, 1024, 2048), 3, 10
)
TINY_PLAN = Plan(2, (1, 2, 4), 64, 32, (0, 32, 64), (8, 16, 32), 1, 3)
"""Seconds on a CPU core: the same code paths at shapes a test can afford."""


def tiny_shape(name: str, dtype_bytes: int) -> ModelShape:
    """The catalog model ``name`` shrunk (hidden 64, 4 layers, head dim 16, 2 KV heads, the
    same query group size; MoE: 8 experts, top-2), for a CPU run of the same code."""
    config = dict(CATALOG_CONFIGS[name])
    group = config["num_attention_heads"] // config["num_key_value_heads"]
    config |= {
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 2 * group,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 1024,
    }
    if config.get("num_experts"):
        config |= {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
    return ModelShape.from_hf_config(
        config, f"{name} (tiny)", source=f"tiny {name}", dtype_bytes=dtype_bytes
    )


@dataclass(slots=True, frozen=True)
class GpuShard:
    """One GPU's share of a decoder layer at tensor parallelism ``tp`` (the cost model's
    rule: heads and MLP/expert widths split ``tp`` ways, KV heads replicated below ``tp``)."""

    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    mlp_intermediate: int
    """Dense MLP width on this GPU (0 for an MoE layer)."""
    experts: int
    top_k: int
    expert_intermediate: int
    """One routed expert's width on this GPU (Qwen3-30B-A3B at TP2: 384)."""
    vocab: int
    """LM head columns on this GPU."""
    model_layers: int
    rms_eps: float

    @classmethod
    def of(cls, shape: ModelShape, tp: int) -> GpuShard:
        if shape.moe_layers not in (0, shape.num_hidden_layers):
            raise ValueError(
                f"{shape.name}: {shape.moe_layers} of {shape.num_hidden_layers} layers are MoE; "
                "the stack scales one kind of layer to the whole model (all dense or all MoE)"
            )
        moe = shape.is_moe
        return cls(
            hidden=shape.hidden_size,
            q_heads=math.ceil(shape.num_attention_heads / tp),
            kv_heads=math.ceil(shape.num_key_value_heads / tp),
            head_dim=shape.head_dim,
            mlp_intermediate=0 if moe else math.ceil(shape.intermediate_size / tp),
            experts=shape.num_experts if moe else 0,
            top_k=shape.num_experts_per_tok if moe else 0,
            expert_intermediate=math.ceil(shape.moe_intermediate_size / tp) if moe else 0,
            vocab=math.ceil(shape.vocab_size / tp),
            model_layers=shape.num_hidden_layers,
            rms_eps=shape.rms_norm_eps,
        )

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.q_heads // self.kv_heads


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prior: int) -> torch.Tensor:
    """Attention of ``q`` [B, Hq, T, D] over caches ``k``, ``v`` [B, Hkv, prior + T, D]
    (causal within the T new tokens); returns [B, Hq, T, D]."""
    batch, q_heads, tokens, dim = q.shape
    kv_heads = k.shape[1]
    if tokens == 1:  # decode: a KV head's query group is one block of queries, no mask
        folded = q.reshape(batch, kv_heads, q_heads // kv_heads, dim)
        return F.scaled_dot_product_attention(folded, k, v).reshape(batch, q_heads, 1, dim)
    if prior == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    mask = causal_lower_right(tokens, prior + tokens)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def attention_backends(q: torch.Tensor, k: torch.Tensor, prior: int) -> dict[str, bool] | None:
    """Which fused SDPA kernels accept :func:`attend`'s call for these shapes (CUDA only): a
    row whose attention ran on none of them timed the math fallback, not a real kernel."""
    if q.device.type != "cuda":
        return None
    from torch.backends import cuda

    tokens = q.shape[2]
    if tokens == 1:  # the folded decode call: no mask, equal head counts
        q = q.reshape(q.shape[0], k.shape[1], -1, q.shape[3])
    params = cuda.SDPAParams(q, k, k, None, 0.0, tokens > 1, tokens > 1)
    return {
        "flash": cuda.can_use_flash_attention(params),
        "cudnn": cuda.can_use_cudnn_attention(params),
        "efficient": cuda.can_use_efficient_attention(params),
    }


ExpertPlan = list[tuple[int, torch.Tensor, torch.Tensor]]
"""Per touched expert: its index, its tokens' rows, and their (row, slot) positions in the
flattened top-k weights."""


class LayerStack:
    """``layers`` decoder layers of random weights at one GPU's shard shape."""

    def __init__(self, shard: GpuShard, layers: int, device: torch.device, dtype: torch.dtype):
        self.shard, self.layers, self.device, self.dtype = shard, layers, device, dtype
        s = shard
        qkv = (s.q_heads + 2 * s.kv_heads) * s.head_dim
        self.weights = []
        for _ in range(layers):
            w = {
                "qkv": self._random(s.hidden, qkv),
                "o": self._random(s.q_heads * s.head_dim, s.hidden),
                "norm1": torch.ones(s.hidden, device=device, dtype=dtype),
                "norm2": torch.ones(s.hidden, device=device, dtype=dtype),
                "q_norm": torch.ones(s.head_dim, device=device, dtype=dtype),
                "k_norm": torch.ones(s.head_dim, device=device, dtype=dtype),
            }
            if s.experts:
                w["router"] = self._random(s.hidden, s.experts)
                w["gate_up"] = self._random(s.experts, s.hidden, 2 * s.expert_intermediate)
                w["down"] = self._random(s.experts, s.expert_intermediate, s.hidden)
            else:
                w["gate_up"] = self._random(s.hidden, 2 * s.mlp_intermediate)
                w["down"] = self._random(s.mlp_intermediate, s.hidden)
            self.weights.append(w)
        self.final_norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = self._random(s.hidden, s.vocab)

    def _random(self, *shape: int) -> torch.Tensor:
        fan_in = shape[-2]
        return torch.randn(*shape, device=self.device, dtype=self.dtype) * fan_in**-0.5

    def caches(self, batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Random K and V caches of ``batch`` sequences x ``length`` tokens, per layer."""
        s = self.shard
        return [
            tuple(
                torch.randn(
                    batch, s.kv_heads, length, s.head_dim, device=self.device, dtype=self.dtype
                )
                for _ in range(2)
            )
            for _ in range(self.layers)
        ]  # type: ignore[misc]

    def forward(
        self,
        x: torch.Tensor,
        caches: list[tuple[torch.Tensor, torch.Tensor]],
        batch: int,
        prior: int,
        plans: list[ExpertPlan] | None,
    ) -> tuple[torch.Tensor, list[ExpertPlan]]:
        """The stack on ``x`` [batch x T, hidden]: every sequence writes T new tokens' KV
        after ``prior`` cached ones. MoE layers dispatch by ``plans`` (None: route, sync,
        and return the plans for a timed pass)."""
        s = self.shard
        tokens = x.shape[0] // batch
        new_plans: list[ExpertPlan] = []
        for i, w in enumerate(self.weights):
            h = F.rms_norm(x, (s.hidden,), w["norm1"], s.rms_eps)
            qkv = (h @ w["qkv"]).view(batch, tokens, s.q_heads + 2 * s.kv_heads, s.head_dim)
            q, k, v = qkv.split([s.q_heads, s.kv_heads, s.kv_heads], dim=2)
            q = F.rms_norm(q, (s.head_dim,), w["q_norm"], s.rms_eps)
            k = F.rms_norm(k, (s.head_dim,), w["k_norm"], s.rms_eps)
            k_cache, v_cache = caches[i]
            k_cache = k_cache[:batch, :, : prior + tokens]
            v_cache = v_cache[:batch, :, : prior + tokens]
            k_cache[:, :, prior:].copy_(k.transpose(1, 2))
            v_cache[:, :, prior:].copy_(v.transpose(1, 2))
            out = attend(q.transpose(1, 2), k_cache, v_cache, prior)
            x = x + out.transpose(1, 2).reshape(batch * tokens, -1) @ w["o"]
            h = F.rms_norm(x, (s.hidden,), w["norm2"], s.rms_eps)
            if s.experts:
                plan = None if plans is None else plans[i]
                mlp, plan = self._moe(h, w, plan)
                new_plans.append(plan)
            else:
                gate, up = (h @ w["gate_up"]).chunk(2, dim=-1)
                mlp = (F.silu(gate) * up) @ w["down"]
            x = x + mlp
        return x, new_plans

    def _moe(
        self, h: torch.Tensor, w: dict[str, torch.Tensor], plan: ExpertPlan | None
    ) -> tuple[torch.Tensor, ExpertPlan]:
        s = self.shard
        probs = torch.softmax((h @ w["router"]).float(), dim=-1)
        top_weights, top_ids = torch.topk(probs, s.top_k, dim=-1)
        top_weights = (top_weights / top_weights.sum(-1, keepdim=True)).to(h.dtype).reshape(-1)
        if plan is None:  # route once, on the host, for the timed passes
            flat = top_ids.reshape(-1).cpu()
            plan = []
            for expert in torch.unique(flat).tolist():
                positions = (flat == expert).nonzero().flatten()
                plan.append((expert, (positions // s.top_k).to(h.device), positions.to(h.device)))
        out = torch.zeros_like(h)
        for expert, rows, positions in plan:
            xe = h.index_select(0, rows)
            gate, up = (xe @ w["gate_up"][expert]).chunk(2, dim=-1)
            ye = (F.silu(gate) * up) @ w["down"][expert]
            out.index_add_(0, rows, ye * top_weights.index_select(0, positions).unsqueeze(1))
        return out, plan

    def attention_only(
        self,
        caches: list[tuple[torch.Tensor, torch.Tensor]],
        q: torch.Tensor,
        batch: int,
        prior: int,
    ) -> None:
        """Only the attention kernels of the stack (``q``: [batch, Hq, T, D])."""
        tokens = q.shape[2]
        for k_cache, v_cache in caches:
            attend(
                q, k_cache[:batch, :, : prior + tokens], v_cache[:batch, :, : prior + tokens], prior
            )

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and this GPU's LM-head columns for the sampled rows ``x``."""
        return (
            F.rms_norm(x, (self.shard.hidden,), self.final_norm, self.shard.rms_eps) @ self.lm_head
        )


class Timer:
    """Median seconds of a callable: eagerly, or replayed as a CUDA graph (GPU only)."""

    def __init__(self, device: torch.device, warmup: int, repeats: int):
        self.cuda = device.type == "cuda"
        self.warmup, self.repeats = warmup, repeats

    def eager(self, fn: Callable[[], Any]) -> float:
        for _ in range(self.warmup):
            fn()
        return self._median(fn)

    def graph(self, fn: Callable[[], Any]) -> float | None:
        """Replay time of ``fn`` captured as a CUDA graph; None without CUDA."""
        if not self.cuda:
            return None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capture, as torch's docs advise
            for _ in range(self.warmup):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        seconds = self._median(graph.replay)
        del graph
        return seconds

    def _median(self, fn: Callable[[], Any]) -> float:
        times = []
        for _ in range(self.repeats):
            if self.cuda:
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def priced(cost: CostModel, work: IterationWork) -> dict[str, float]:
    """The cost model's seconds for ``work``: per part, the kernels this script runs
    (``kernels_s``) and the parts it does not (all-reduces, fixed overheads)."""
    c = cost.price(work)
    attention = c.prefill_attention_s + c.decode_attention_s
    return {
        "linear_s": c.linear_s,
        "attention_s": attention,
        "kernels_s": c.linear_s + attention,
        "communication_s": c.communication_s,
        "overhead_s": c.overhead_s,
        "total_s": c.total_s,
    }


def reached(work: IterationWork, measured: dict[str, float], gpu: GPUSpec) -> dict[str, float]:
    """Fractions of peak FLOP/s and HBM bandwidth the measured parts reached, on the cost
    model's own count of FLOPs and bytes (what a refit of its efficiencies divides)."""
    attention_flops = work.prefill_attention_flops + work.decode_attention_flops
    attention_bytes = work.prefill_kv_bytes + work.decode_kv_bytes
    rest = measured["rest_model_s"]
    attention = measured["attention_model_s"]
    return {
        "attention_of_peak_flops": attention_flops / attention / gpu.peak_flops,
        "attention_of_hbm_bandwidth": attention_bytes / attention / gpu.hbm_bandwidth_Bps,
        "linear_of_peak_flops": work.linear_flops / rest / gpu.peak_flops,
        "linear_of_hbm_bandwidth": work.weight_bytes / rest / gpu.hbm_bandwidth_Bps,
    }


def measure_model(
    shape: ModelShape,
    cost: CostModel,
    plan: Plan,
    timer: Timer,
    device: torch.device,
    dtype: torch.dtype,
) -> list[dict[str, Any]]:
    """Every row of ``plan`` for one model: measured seconds beside the cost model's."""
    shard = GpuShard.of(shape, cost.tp)
    stack = LayerStack(shard, plan.layers, device, dtype)
    scale = shard.model_layers / plan.layers
    rows = []

    def row(
        kind: str, label: str, batch: int, tokens: int, prior: int, caches: list, graph: bool
    ) -> dict[str, Any]:
        x = torch.randn(batch * tokens, shard.hidden, device=device, dtype=dtype)
        with torch.no_grad():
            _, plans = stack.forward(x, caches, batch, prior, None)  # routes MoE layers once
            q = torch.randn(
                batch, shard.q_heads, tokens, shard.head_dim, device=device, dtype=dtype
            )
            sampled = x[: batch if tokens == 1 else 1]

            def run_stack() -> None:
                stack.forward(x, caches, batch, prior, plans)

            def run_attention() -> None:
                stack.attention_only(caches, q, batch, prior)

            def run_head() -> None:
                stack.head(sampled)

            use_graph = graph and timer.cuda
            measure = timer.graph if use_graph else timer.eager
            stack_s = measure(run_stack)
            attention_s = measure(run_attention)
            head_s = measure(run_head)
            stack_graph_s = None
            if not graph and timer.cuda:  # a prefill: also without the launch gaps
                stack_graph_s = timer.graph(run_stack)
        assert stack_s is not None and attention_s is not None and head_s is not None
        whole = stack_s * scale + head_s
        measured = {
            "stack_s": stack_s,
            "attention_s": attention_s,
            "lm_head_s": head_s,
            "whole_model_s": whole,
            "attention_model_s": attention_s * scale,
            "rest_model_s": whole - attention_s * scale,
        }
        if stack_graph_s is not None:
            measured["whole_model_graph_s"] = stack_graph_s * scale + head_s
        if kind == "decode":
            work = cost.iteration_work([], [prior + 1] * batch)
        else:
            work = cost.iteration_work([(tokens, prior)], [])
        price = priced(cost, work)
        touched = [len(p) for p in plans]
        k_cache = caches[0][0][:batch, :, : prior + tokens]
        return {
            "kind": kind,
            "label": label,
            "sequences": batch,
            "new_tokens_per_sequence": tokens,
            "prior_context": prior,
            "timing": "cuda_graph" if use_graph else "eager",
            "attention_backends": attention_backends(q, k_cache, prior),
            "measured": measured,
            "price": price,
            "work": asdict(work),
            "ratio": whole / price["kernels_s"],
            "attention_ratio": measured["attention_model_s"] / price["attention_s"],
            "linear_ratio": measured["rest_model_s"] / price["linear_s"],
            "reached": reached(work, measured, cost.gpu),
            "experts_touched": None
            if not shard.experts
            else {
                "measured_mean": statistics.mean(touched),
                "cost_model": cost.expected_experts_touched(batch * tokens),
            },
        }

    context = plan.decode_context
    caches = stack.caches(max(plan.decode_batches), context)
    for batch in plan.decode_batches:
        label = f"decode {batch} seq @ {context}"
        rows.append(row("decode", label, batch, 1, context - 1, caches, graph=True))
    del caches
    caches = stack.caches(1, max(plan.chunk_priors) + plan.chunk_tokens)
    for prior in plan.chunk_priors:
        label = f"chunk {plan.chunk_tokens} after {prior}"
        rows.append(row("prefill_chunk", label, 1, plan.chunk_tokens, prior, caches, graph=False))
    for tokens in plan.prefill_tokens:
        rows.append(row("prefill", f"prefill {tokens}", 1, tokens, 0, caches, graph=False))
    del caches
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def detect_gpu(device: torch.device) -> str:
    """The catalog entry for this device (by name), H100 when none matches."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).upper()
    for key in sorted(GPU_CATALOG, key=len, reverse=True):
        if key.upper().split("-")[0] in name:
            return key
    return "H100"


def print_table(model: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{model}: measured (scaled to the whole model) vs CostModel price, per GPU")
    print(
        f"{'work':<26}{'timing':>11}{'measured ms':>13}{'price ms':>10}{'ratio':>8}"
        f"{'attn':>8}{'linear':>8}{'+comm+ovh ms':>14}{'experts':>10}"
    )
    for r in rows:
        experts = r["experts_touched"]
        shown = (
            "" if experts is None else f"{experts['measured_mean']:.0f}/{experts['cost_model']:.0f}"
        )
        print(
            f"{r['label']:<26}{r['timing']:>11}{r['measured']['whole_model_s'] * 1e3:>13.3f}"
            f"{r['price']['kernels_s'] * 1e3:>10.3f}{r['ratio']:>8.2f}{r['attention_ratio']:>8.2f}"
            f"{r['linear_ratio']:>8.2f}{r['price']['total_s'] * 1e3:>14.3f}{shown:>10}"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu_costmodel.json"))
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (automatic without CUDA)")
    parser.add_argument(
        "--models", default=",".join(MODELS), help="catalog models, comma-separated"
    )
    parser.add_argument("--layers", type=int, default=None, help="layers in the timed stack")
    parser.add_argument("--tp", type=int, default=None, help="tensor parallelism (config's)")
    parser.add_argument("--gpu", default=None, help="GPU catalog entry to price with (detected)")
    parser.add_argument(
        "--config",
        default=str(ROOT / "configs" / "headline_paper.yaml"),
        help="config whose cost constants price the work (the paper regime's)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tiny = args.tiny or device.type != "cuda"
    if device.type == "cpu":
        torch.set_num_threads(1)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    plan = TINY_PLAN if tiny else GPU_PLAN
    if args.layers is not None:
        plan = replace(plan, layers=args.layers)
    cfg = load_simulate_config(args.config, [])
    constants = build_cost_model(cfg).constants
    tp = args.tp or cfg.cluster.tp
    gpu = get_gpu(args.gpu or detect_gpu(device))
    timer = Timer(device, plan.warmup, plan.repeats)
    element = torch.tensor([], dtype=dtype).element_size()
    print(
        f"gpu_costmodel: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}, "
        f"{dtype}, {'tiny shapes' if tiny else 'full shapes'}, {plan.layers} layers timed, "
        f"TP{tp} shard, priced as {gpu.name} with {Path(args.config).name}'s constants"
    )
    torch.manual_seed(0)
    models = []
    for name in args.models.split(","):
        shape = tiny_shape(name, element) if tiny else load_model_shape(name, dtype_bytes=element)
        cost = CostModel(gpu, shape, tp=tp, constants=constants)
        rows = measure_model(shape, cost, plan, timer, device, dtype)
        print_table(shape.name, rows)
        models.append(
            {
                "model": shape.name,
                "layers_measured": plan.layers,
                "layers_total": shape.num_hidden_layers,
                "scale": shape.num_hidden_layers / plan.layers,
                "per_gpu_shard": asdict(GpuShard.of(shape, tp)),
                "rows": rows,
            }
        )
    result = {
        "script": "scripts/gpu_costmodel.py",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "tiny": tiny,
        "cuda_graphs": device.type == "cuda",
        "plan": asdict(plan),
        "pricing": {
            "gpu": gpu.name,
            "tp": tp,
            "config": str(args.config),
            "constants": asdict(constants),
        },
        "models": models,
        "wall_s": time.perf_counter() - started,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"\nratio = measured / price of the same kernels (linear + attention); attn, linear: per "
        f"part; +comm+ovh: the full price, with the all-reduces and fixed overheads not "
        f"measured here; experts: touched per MoE layer, measured/cost model. Wrote {out} "
        f"({result['wall_s']:.1f} s)"
    )
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
