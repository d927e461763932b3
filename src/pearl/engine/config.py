"""The engine's configuration: one dataclass for the live engine and the simulated one
(pure Python, importable without torch)."""

from __future__ import annotations

from dataclasses import dataclass

from pearl.engine.scheduler import SchedulerConfig, SchedulingMode
from pearl.engine.sequence import Role


@dataclass(slots=True, frozen=True)
class EngineConfig:
    """Capacity and batching of one engine: the live engine's (``LLMEngine``) and, with a
    few simulation-only fields added, the simulated worker's (``pearl.sim.worker``)."""

    block_size: int = 16
    num_kv_blocks: int = 1024
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    role: Role = Role.COLOCATED
    local_prefill_max_tokens: int = 0
    scheduling: SchedulingMode | str = "mixed"  # "mixed" or "sglang"
    chunked_prefill_size: int = 8192  # sglang mode
    max_prefill_tokens: int = 16384  # sglang mode
    model_id: str | None = None  # default: derived from the model config
    device: str = "cpu"  # cpu, cuda or cuda:N (torch's names)
    dtype: str = "float32"  # weights and KV cache: float32 or bfloat16 (logits stay float32)
    seed: int = 0
    # Drop pinned sessions too when new weights land with turns in flight (SGLang's
    # update_weights flush_cache=True): continuing sessions re-prefill. The prefix cache is
    # emptied on every update either way (no request starts from the old weights' KV).
    flush_cache_on_weight_update: bool = False
    # On the CPU, multiply through oneDNN with each weight reordered once for its GEMM
    # kernel (``pearl.models.layers.Linear``): faster decode, the linear weights' memory
    # twice. Ignored on other devices.
    prepack_weights: bool = True

    def scheduler_config(
        self, max_model_len: int, role: Role, eos_token_ids: tuple[int, ...] = ()
    ) -> SchedulerConfig:
        """The scheduler's limits for this engine in ``role`` (both worlds build it here)."""
        return SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_model_len=max_model_len,
            role=role,
            local_prefill_max_tokens=self.local_prefill_max_tokens,
            eos_token_ids=eos_token_ids,
            mode=SchedulingMode(self.scheduling),
            chunked_prefill_size=self.chunked_prefill_size,
            max_prefill_tokens=self.max_prefill_tokens,
        )
