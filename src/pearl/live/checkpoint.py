"""The trainer's checkpoints on disk: a model folder engines can load, the optimizer's
moments beside it, LoRA's adapters in PEFT's format. No pickle: safetensors and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from pearl.durable_files import disk_full_error, folder_written_whole
from pearl.errors import CheckpointError
from pearl.models.loader import save_state


def write_checkpoint(
    folder: Path,
    config: Any,
    weights: dict[str, torch.Tensor],
    moments: dict[str, torch.Tensor],
    meta: dict[str, Any],
    adapter: tuple[dict[str, torch.Tensor], str] | None = None,
) -> None:
    """``GRPOTrainer.save``'s files from a snapshot: a model folder engines can load, with
    the optimizer in a subfolder (and LoRA's adapters in ``adapter/``, PEFT's format);
    whole or not at all (``<folder>.tmp``, fsync'd, then renamed; removed on failure).
    A full disk raises the ``OSError`` (the run says which disk); anything else
    ``CheckpointError``."""
    try:
        with folder_written_whole(folder) as tmp:
            save_state(config, weights, tmp)
            (tmp / "optimizer").mkdir()
            save_file(moments, str(tmp / "optimizer" / "moments.safetensors"))
            (tmp / "optimizer" / "trainer.json").write_text(json.dumps(meta, indent=1))
            if adapter is not None:
                (tmp / "adapter").mkdir()
                save_file(adapter[0], str(tmp / "adapter" / "adapter_model.safetensors"))
                (tmp / "adapter" / "adapter_config.json").write_text(adapter[1])
    except Exception as exc:  # disk full, no permission, a file where a folder should be
        what = f"checkpoint {folder} (weights v{meta['version']}) could not be written"
        full = disk_full_error(exc)
        if full is not None:  # safetensors' own error says it only in words: an OSError
            error = OSError(full.errno, f"{what}: {full.strerror}", full.filename or str(folder))
            raise error from exc
        raise CheckpointError(f"{what}: {type(exc).__name__}: {exc}") from exc


def read_checkpoint(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A checkpoint's counters (``trainer.json``) and optimizer moments; ``CheckpointError``
    naming the folder where they are missing or unreadable."""
    try:
        meta = json.loads((folder / "optimizer" / "trainer.json").read_text())
        moments = load_file(str(folder / "optimizer" / "moments.safetensors"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder}: not a trainer checkpoint ({exc})") from None
    return meta, moments
