"""Build models from a config and load Hugging Face folders (config.json + *.safetensors)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch

from pearl.errors import CheckpointError, ConfigError
from pearl.models.config import ModelConfig
from pearl.models.decoder import DecoderForCausalLM
from pearl.models.llama import LlamaForCausalLM
from pearl.models.qwen3 import Qwen3ForCausalLM

MODEL_CLASSES: dict[str, type[DecoderForCausalLM]] = {
    "qwen3": Qwen3ForCausalLM,
    "llama": LlamaForCausalLM,
}


def build_model(
    cfg: ModelConfig, seed: int | None = 0, device: str | torch.device = "cpu"
) -> DecoderForCausalLM:
    """A model with random weights (normal, std 0.02, as HF initializes), in float32."""
    if cfg.model_type not in MODEL_CLASSES:
        raise ConfigError(
            f"model_type {cfg.model_type!r} is not supported; supported: {sorted(MODEL_CLASSES)}"
        )
    gen = torch.Generator().manual_seed(seed if seed is not None else 0)
    model = MODEL_CLASSES[cfg.model_type](cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
    return model.to(device).eval()


def expected_tensor_shapes(model: DecoderForCausalLM) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint must supply (tied lm_head optional)."""
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def load_state_dict(
    model: DecoderForCausalLM, state: Mapping[str, torch.Tensor], source: str = "state dict"
) -> None:
    """Copy ``state`` into ``model`` after checking names, shapes and that every value is
    finite; nothing is changed on error."""
    expected = expected_tensor_shapes(model)
    tied = model.config.tie_word_embeddings
    missing = [n for n in expected if n not in state and not (tied and n == "lm_head.weight")]
    if missing:
        raise CheckpointError(
            f"{source}: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}"
        )
    ignorable = ("rotary_emb.inv_freq",)
    unexpected = [n for n in state if n not in expected and not n.endswith(ignorable)]
    if tied:
        unexpected = [n for n in unexpected if n != "lm_head.weight"]
    if unexpected:
        raise CheckpointError(
            f"{source}: unexpected tensors {unexpected[:5]} for model_type {model.config.model_type!r}"
        )
    for name, shape in expected.items():
        if name in state and tuple(state[name].shape) != shape:
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(state[name].shape)}, the config implies {shape}"
            )
    for name in expected:
        tensor = state.get(name)
        if tensor is not None and tensor.is_floating_point():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                raise CheckpointError(
                    f"{source}: tensor {name!r} has {bad} non-finite values (NaN or inf); "
                    f"such weights would serve garbage"
                )
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, param in params.items():
            if name in state:
                param.copy_(state[name].to(dtype=param.dtype, device=param.device))


def read_safetensors_folder(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a folder's ``*.safetensors`` files (sharded checkpoints included)."""
    from safetensors import SafetensorError  # live extra
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({folder / f for f in weight_map.values()})
        absent = [str(f) for f in files if not f.is_file()]
        if absent:
            raise CheckpointError(f"{index}: shards listed but not present: {absent}")
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors files")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{file}: cannot read safetensors ({exc})") from exc
    return state


def load_model(folder: str | Path, device: str | torch.device = "cpu") -> DecoderForCausalLM:
    """Load a Hugging Face model folder into a float32 PEARL model."""
    folder = Path(folder)
    cfg = ModelConfig.from_folder(folder)
    model = MODEL_CLASSES[cfg.model_type](cfg)
    load_state_dict(model, read_safetensors_folder(folder), source=str(folder))
    return model.to(device).eval()


def save_model(model: DecoderForCausalLM, folder: str | Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` (used by tests and the demo)."""
    state = {n: p.detach().contiguous().cpu() for n, p in model.named_parameters()}
    save_state(model.config, state, folder)


def save_state(config: ModelConfig, state: dict[str, torch.Tensor], folder: str | Path) -> None:
    """Write a model folder from a config and a state dict (e.g. a snapshot taken earlier)."""
    from safetensors.torch import save_file  # live extra

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2))
    save_file(state, str(folder / "model.safetensors"))
