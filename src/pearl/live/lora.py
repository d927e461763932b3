"""LoRA for the trainer: low-rank adapters on the decoder's linear layers (Hu et al. 2021,
arXiv:2106.09685), the base weights frozen.

Our own layers rather than peft's injection: the trainer's model is ours (prefix-tree
forward, FSDP2 per decoder layer), and peft wraps each target in modules of its own
(``base_layer``, ``lora_A.default``) whose names the weight publishing, checkpoints and
FSDP wrapping would have to undo. Here a target ``nn.Linear`` becomes a ``LoRALinear``
that keeps its ``weight`` (same name, same tensor, frozen) and adds ``lora_A`` [r, in] and
``lora_B`` [out, r]: ``y = x W^T + b + (alpha / r) x A^T B^T``, with B zero at the start
(peft's initialization: A Kaiming-uniform, so the first step's model is the base model).

The rollout engines get merged weights (``W + (alpha / r) B A``) under the base names;
checkpoints hold those as a loadable model folder and the adapters in PEFT's file format
(``adapter/adapter_model.safetensors`` + ``adapter_config.json``), which
``peft.PeftModel.from_pretrained`` loads onto the Hugging Face model (tested).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a decoder layer (peft's ``all-linear`` for these models)."""


@dataclass(slots=True, frozen=True)
class LoRAConfig:
    rank: int
    alpha: float = 32.0
    target_modules: tuple[str, ...] = ALL_LINEAR

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha <= 0 or not self.target_modules:
            raise ValueError(f"LoRA: rank >= 1, alpha > 0 and a target module needed, got {self}")
        unknown = set(self.target_modules) - set(ALL_LINEAR)
        if unknown:
            raise ValueError(
                f"LoRA target_modules {sorted(unknown)} are not linear layers of a decoder "
                f"layer; valid: {', '.join(ALL_LINEAR)}"
            )

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class LoRALinear(nn.Linear):
    """An ``nn.Linear`` with a frozen weight and a trainable low-rank update."""

    lora_A: nn.Parameter
    lora_B: nn.Parameter

    @classmethod
    def wrap(cls, base: nn.Linear, config: LoRAConfig, generator: torch.Generator) -> LoRALinear:
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = base.in_features, base.out_features
        layer.weight = base.weight
        layer.weight.requires_grad_(False)
        layer.bias = base.bias
        if layer.bias is not None:
            layer.bias.requires_grad_(False)
        a = torch.empty(config.rank, base.in_features)
        bound = 1 / math.sqrt(base.in_features)  # kaiming_uniform_(a=sqrt(5)), as nn.Linear
        a.uniform_(-bound, bound, generator=generator)
        layer.lora_A = nn.Parameter(a.to(base.weight.device))
        layer.lora_B = nn.Parameter(base.weight.new_zeros(base.out_features, config.rank))
        layer.scale = config.scale
        layer.enabled = True
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if not self.enabled:
            return out
        return out + (x @ self.lora_A.to(x.dtype).T) @ (self.lora_B.to(x.dtype).T * self.scale)

    def delta(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The update to ``weight`` the adapters ``a``, ``b`` (whole tensors) make."""
        return (b @ a) * self.scale


def apply_lora(model: nn.Module, config: LoRAConfig, seed: int = 0) -> list[str]:
    """Freeze ``model`` and put adapters on its decoder layers' ``target_modules``; returns
    the adapted modules' names. Only the adapters are trainable afterwards."""
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    adapted = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in config.target_modules and _plain_linear(child):
                setattr(module, child_name, LoRALinear.wrap(child, config, generator))
                adapted.append(f"{name}.{child_name}" if name else child_name)
    if not adapted:
        raise ValueError(f"LoRA: no module named {config.target_modules} in the model")
    return adapted


def _plain_linear(module: nn.Module) -> bool:
    """A linear layer without an adapter yet (the models' ``Linear`` is an ``nn.Linear``)."""
    return isinstance(module, nn.Linear) and not isinstance(module, LoRALinear)


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The base model (the KL reference of a LoRA run: no second copy of the weights)."""
    layers = list(lora_layers(model).values())
    for layer in layers:
        layer.enabled = False
    try:
        yield
    finally:
        for layer in layers:
            layer.enabled = True


def merged_weights(
    model: nn.Module, full: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The model's weights under the base names with every adapter merged in (what the
    engines and the checkpoint's model folder get); ``full``: the named parameters as whole
    tensors (gathered, when sharded), else the model's own."""
    tensors = full or {n: p.detach() for n, p in model.named_parameters()}
    out = {n: t for n, t in tensors.items() if not n.endswith((".lora_A", ".lora_B"))}
    for name, layer in lora_layers(model).items():
        a, b = tensors[f"{name}.lora_A"], tensors[f"{name}.lora_B"]
        out[f"{name}.weight"] = out[f"{name}.weight"] + layer.delta(a, b).to(out[f"{name}.weight"])
    return out


def adapter_files(
    config: LoRAConfig, tensors: dict[str, torch.Tensor], base_model: str, modules: Sequence[str]
) -> tuple[dict[str, torch.Tensor], str]:
    """The adapters in PEFT's layout: tensors keyed ``base_model.model.<module>.lora_A.weight``
    and the ``adapter_config.json`` text."""
    weights = {
        f"base_model.model.{m}.lora_{ab}.weight": tensors[f"{m}.lora_{ab}"].contiguous()
        for m in modules
        for ab in "AB"
    }
    meta = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "target_modules": sorted(config.target_modules),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
    }
    return weights, json.dumps(meta, indent=1)


def read_adapters(folder: Path) -> dict[str, torch.Tensor]:
    """``adapter_files``' tensors back under the model's parameter names."""
    from safetensors.torch import load_file  # live extra

    raw = load_file(str(folder / "adapter_model.safetensors"))
    prefix = "base_model.model."
    return {
        k[len(prefix) :].removesuffix(".weight"): v for k, v in raw.items() if k.startswith(prefix)
    }
