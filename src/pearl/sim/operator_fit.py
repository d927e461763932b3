"""The cost model's linear layers against measured H100 operator times (Vidur's profiles).

Each row of ``data/vidur_h100_linear.csv`` is one transformer layer's four linear operators
(QKV, output, MLP up(+gate), MLP down) on one GPU of a TP group, summed, for a model, TP
degree and token count. The cost model prices that work as

    time = kernels * t_kernel + (t_compute^p + t_memory^p)^(1/p)
    t_compute = FLOPs / (peak * linear_compute_efficiency)
    t_memory  = weight bytes / (HBM bandwidth * weight_memory_efficiency)

with ``p = linear_roofline_exponent`` (``inf``: the sharp roofline max) and
``t_kernel = linear_kernel_overhead_s`` (:func:`pearl.sim.costmodel.linear_seconds`).
:func:`fit_linear` fits those four constants to a set of rows; the defaults of
:class:`CostConstants` are its fit on the training rows (:data:`TRAIN_MODELS` at
:data:`TRAIN_TP`), and ``benchmarks/costmodel_vs_profiles.py`` checks the held-out rest.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from importlib import resources

import numpy as np

from pearl.sim.costmodel import CostConstants, linear_seconds
from pearl.sim.hardware import H100, GPUSpec

DATA = "vidur_h100_linear.csv"
ALLREDUCE_DATA = "vidur_h100_allreduce.csv"
KERNELS_PER_LAYER = 4
"""QKV, output, MLP up (gate fused), MLP down: one GEMM kernel each."""
DTYPE_BYTES = 2  # the profiles ran in fp16/bf16

TRAIN_MODELS = ("Llama-2-7b-hf", "Llama-2-70b-hf", "CodeLlama-34b-Instruct-hf")
TRAIN_TP = (1, 2)
REGIMES: tuple[tuple[str, int, int], ...] = (
    ("1-64", 1, 64),
    ("65-511", 65, 511),
    ("512-4096", 512, 4096),
)
"""Token-count regimes: decode batches, small prefill chunks and decode+chunk mixes, large
prefill chunks."""


@dataclass(slots=True, frozen=True)
class OperatorRow:
    """One measured layer: model, TP degree, token count and the four linear operators' time."""

    model: str
    tp: int
    tokens: int
    seconds: float
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    gated_mlp: bool

    @property
    def layer_params(self) -> float:
        """Linear-layer parameters of one layer on one GPU of the TP group."""
        h, head_dim = self.hidden, self.hidden // self.heads
        qkv = h * (self.heads + 2 * self.kv_heads) * head_dim
        out = self.heads * head_dim * h
        mlp = h * self.intermediate * (3 if self.gated_mlp else 2)
        return (qkv + out + mlp) / self.tp

    @property
    def flops(self) -> float:
        return 2.0 * self.layer_params * self.tokens

    @property
    def weight_bytes(self) -> float:
        return DTYPE_BYTES * self.layer_params

    @property
    def held_out(self) -> bool:
        """Not used by the fit: another model, or a TP degree the fit never saw."""
        return self.model not in TRAIN_MODELS or self.tp not in TRAIN_TP


def load_rows() -> list[OperatorRow]:
    """The shipped rows (see ``data/README.md`` for source and licence)."""
    text = resources.files("pearl.sim").joinpath("data", DATA).read_text()
    rows = []
    for r in csv.DictReader(text.splitlines()):
        rows.append(
            OperatorRow(
                model=r["model"],
                tp=int(r["tp"]),
                tokens=int(r["tokens"]),
                seconds=float(r["seconds"]),
                hidden=int(r["hidden"]),
                heads=int(r["heads"]),
                kv_heads=int(r["kv_heads"]),
                intermediate=int(r["intermediate"]),
                gated_mlp=r["gated_mlp"] == "True",
            )
        )
    return rows


LINEAR_FIELDS = (
    "linear_compute_efficiency",
    "weight_memory_efficiency",
    "linear_roofline_exponent",
    "linear_kernel_overhead_s",
)
"""The constants :func:`fit_linear` fits; every other constant plays no part here."""


def predict(
    rows: Iterable[OperatorRow], constants: CostConstants, gpu: GPUSpec = H100
) -> np.ndarray:
    """Predicted seconds per row: the cost model's own linear-layer formula."""
    return np.array(
        [linear_seconds(r.flops, r.weight_bytes, KERNELS_PER_LAYER, constants, gpu) for r in rows]
    )


def fit_linear(rows: list[OperatorRow], gpu: GPUSpec = H100) -> CostConstants:
    """:data:`LINEAR_FIELDS` fitted by least squares on log(predicted / measured)."""
    from scipy.optimize import least_squares  # live extra

    measured = np.log([r.seconds for r in rows])

    def unpack(x: np.ndarray) -> CostConstants:
        values = (float(x[0]), float(x[1]), float(np.exp(x[2])), float(np.exp(x[3])))
        return replace(CostConstants(), **dict(zip(LINEAR_FIELDS, values, strict=True)))

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict(rows, unpack(x), gpu)) - measured

    result = least_squares(
        residuals,
        np.array([0.7, 0.8, np.log(2.0), np.log(2e-6)]),
        bounds=([0.05, 0.05, np.log(1.0), np.log(1e-9)], [1.0, 1.0, np.log(50.0), np.log(1e-3)]),
    )
    return unpack(result.x)


def ratio_stats(
    rows: list[OperatorRow], constants: CostConstants, gpu: GPUSpec = H100
) -> dict[str, dict[str, float | int]]:
    """Per token regime: count, median and worst (farthest from 1) predicted / measured."""
    ratios = predict(rows, constants, gpu) / np.array([r.seconds for r in rows])
    out: dict[str, dict[str, float | int]] = {}
    for name, lo, hi in REGIMES:
        sel = np.array([lo <= r.tokens <= hi for r in rows])
        if not sel.any():
            continue
        got = ratios[sel]
        worst = got[np.argmax(np.abs(np.log(got)))]
        out[name] = {"rows": int(sel.sum()), "median": float(np.median(got)), "worst": float(worst)}
    return out


def held_out(rows: list[OperatorRow]) -> list[OperatorRow]:
    return [r for r in rows if r.held_out]


def training(rows: list[OperatorRow]) -> list[OperatorRow]:
    return [r for r in rows if not r.held_out]


HELD_OUT_GROUPS: dict[str, Callable[[OperatorRow], bool]] = {
    "other models (TP1-8)": lambda r: r.model not in TRAIN_MODELS,
    "fitted models at TP4-8": lambda r: r.model in TRAIN_MODELS and r.tp not in TRAIN_TP,
}
"""The held-out rows, by why they are held out."""


def load_allreduce() -> list[tuple[int, int, float]]:
    """The shipped NCCL all-reduce rows: (GPUs, message bytes, seconds) on a DGX H100."""
    text = resources.files("pearl.sim").joinpath("data", ALLREDUCE_DATA).read_text()
    return [
        (int(r["gpus"]), int(r["bytes"]), float(r["seconds"]))
        for r in csv.DictReader(text.splitlines())
    ]
