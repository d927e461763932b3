"""Device and dtype settings (``cpu``/``cuda``/``cuda:N``; ``float32``/``bfloat16``) as
torch's objects, checked where they are used: in the process that will run on them."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    """An engine or trainer dtype setting as torch's dtype."""
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


def torch_device(name: str) -> torch.device:
    """A device setting, checked against what this process can use."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"device {name!r} is not cpu, cuda or cuda:N ({exc})") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r} is not cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {name!r}: torch.cuda.is_available() is False in this process (a CPU "
            "build of torch, no GPU, or a Ray actor that did not ask for one: "
            "cluster.worker_resources / cluster.trainer_resources {GPU: 1})"
        )
    return device
