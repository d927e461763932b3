"""PEARL's KV connector for vLLM: a prefill worker saves a request's prompt KV, a decode
worker loads a session's KV before decoding, token-exact.

vLLM loads this class by path (``kv_connector_module_path`` = this module,
``kv_connector`` = ``PearlConnector``; ``VllmServer`` configures it). What to do comes with
each request, in ``kv_transfer_params`` (``sampling_params.extra_args``):

- ``{"pearl": {"save": path, "from": s}}`` (prefill role): once the request's prompt is
  computed, the KV of its tokens ``[s, prompt length)`` is written to the session's file
  at ``path`` (``pearl.live.vllm_session_kv``: one row per token), which then ends there;
  rows ``[0, s)`` are the session's earlier prompt's, which this one extends.
- ``{"pearl": {"load": path, "tokens": n}}`` (decode role): the session's file at ``path``
  holds KV of the request's first ``n`` tokens; the scheduler counts what its prefix cache
  lacks of them as externally computed and the worker copies those rows alone into the
  request's blocks before the step's forward (a synchronous load: vLLM computes the rest,
  at least the last token).

A request loads at most once: one reset by a weights update (or preempted) recomputes its
KV under the weights it runs, so no token attends to KV the connector brought from other
weights. Both halves run in vLLM's engine process (scheduler side) and its worker
(worker side); they share nothing but the metadata vLLM passes each step and the files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from pearl.live.vllm_session_kv import read_rows, write_rows

PARAMS = "pearl"  # the key of our part of ``kv_transfer_params``


@dataclass(slots=True)
class _Copy:
    """KV of tokens ``[start, end)`` of one request between its blocks and a file."""

    path: str
    block_ids: list[int]
    start: int
    end: int


@dataclass
class PearlConnectorMetadata(KVConnectorMetadata):
    loads: list[_Copy] = field(default_factory=list)
    saves: list[_Copy] = field(default_factory=list)


@dataclass(slots=True)
class _Saving:
    path: str
    start: int  # the first token whose KV is written
    prompt_tokens: int
    block_ids: list[int] = field(default_factory=list)


def _params(request: Any) -> dict[str, Any]:
    params = getattr(request, "kv_transfer_params", None) or {}
    return params.get(PARAMS) or {}


class PearlConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._block_size = vllm_config.cache_config.block_size
        # scheduler side
        self._planned: dict[str, _Copy] = {}  # loads matched, awaiting their blocks
        self._to_load: dict[str, _Copy] = {}  # loads with blocks, for the next step
        self._loaded: set[str] = set()  # requests that loaded once (never again)
        self._saving: dict[str, _Saving] = {}
        # worker side: each layer's (keys, values) views [blocks, kv_heads, block, head_dim]
        # (``_cpu_views`` on CPU: keys [blocks, kv_heads, head_dim, block])
        self._layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._keys_transposed = False

    # -- scheduler side ---------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int):
        spec = _params(request)
        rid = request.request_id
        if "load" not in spec or rid in self._loaded:
            return 0, False
        # vLLM computes at least the last token itself.
        held = min(int(spec["tokens"]), request.num_tokens - 1)
        if held <= num_computed_tokens or not os.path.exists(spec["load"]):
            return 0, False
        self._planned[rid] = _Copy(spec["load"], [], num_computed_tokens, held)
        return held - num_computed_tokens, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        plan = self._planned.pop(request.request_id, None)
        if plan is not None and num_external_tokens > 0:
            plan.start = plan.end - num_external_tokens  # what vLLM counted as loaded
            self._to_load[request.request_id] = plan

    def on_new_request(self, request: Any) -> None:
        spec = _params(request)
        if "save" in spec:
            start = int(spec.get("from", 0))
            self._saving[request.request_id] = _Saving(
                spec["save"], start, request.num_prompt_tokens
            )

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = PearlConnectorMetadata()
        computed: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            blocks = list(new.block_ids[0])
            computed[new.req_id] = new.num_computed_tokens
            load = self._to_load.pop(new.req_id, None)
            if load is not None:
                load.block_ids = blocks
                meta.loads.append(load)
                self._loaded.add(new.req_id)
            if new.req_id in self._saving:
                self._saving[new.req_id].block_ids = blocks
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            computed[rid] = cached.num_computed_tokens[i]
            saving = self._saving.get(rid)
            new_blocks = cached.new_block_ids[i]
            if saving is None or new_blocks is None:
                continue
            if rid in cached.resumed_req_ids:  # a resumed request lists all its blocks
                saving.block_ids = list(new_blocks[0])
            else:
                saving.block_ids.extend(new_blocks[0])
        for rid, saving in list(self._saving.items()):
            if rid not in computed:
                continue
            done = computed[rid] + scheduler_output.num_scheduled_tokens.get(rid, 0)
            if done >= saving.prompt_tokens:
                meta.saves.append(
                    _Copy(saving.path, saving.block_ids, saving.start, saving.prompt_tokens)
                )
                del self._saving[rid]
        return meta

    def request_finished(self, request: Any, block_ids: list[int]):
        rid = request.request_id
        self._saving.pop(rid, None)
        self._planned.pop(rid, None)
        self._to_load.pop(rid, None)
        self._loaded.discard(rid)
        return False, None

    # -- worker side ------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.platforms import current_platform  # optional: vLLM backend

        def layer_index(name: str) -> int:
            found = re.findall(r"\d+", name)
            if not found:
                raise ValueError(f"PEARL's KV connector: no layer index in {name!r}")
            return int(found[0])

        self._layers = []
        for name in sorted(kv_caches, key=layer_index):
            cache = kv_caches[name]
            if cache.ndim != 4:
                raise ValueError(
                    f"PEARL's KV connector reads per-layer caches [blocks, kv_heads, block, "
                    f"2 * head_dim]; layer {name!r} has shape {tuple(cache.shape)}"
                )
            blocks, heads, block, content = cache.shape
            head_dim = content // 2
            if current_platform.is_cpu():
                self._layers.append(_cpu_views(name, cache, head_dim))
                self._keys_transposed = True
            else:
                # Each token's row holds its key, then its value (``flash_attn.py``).
                self._layers.append((cache[..., :head_dim], cache[..., head_dim:]))

    def _slots(self, copy: _Copy) -> tuple[torch.Tensor, torch.Tensor]:
        """Kernel block and offset of each token ``[start, end)`` of ``copy``; vLLM's
        kernels may split a scheduler block into several of their own."""
        kernel_block = self._layers[0][1].shape[2]
        per_block = self._block_size // kernel_block
        pos = torch.arange(copy.start, copy.end)
        table = torch.tensor(copy.block_ids, dtype=torch.long)
        within = pos % self._block_size
        blocks = table[pos // self._block_size] * per_block + within // kernel_block
        return blocks, within % kernel_block

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, PearlConnectorMetadata)
        for load in meta.loads:
            rows = torch.from_numpy(read_rows(load.path, load.start, load.end, self._row_shape()))
            blocks, offsets = self._slots(load)
            for i, (k, v) in enumerate(self._layers):
                keys, values = rows[:, i, 0], rows[:, i, 1]
                _token_rows(k, blocks, offsets, self._keys_transposed, keys.to(k.device, k.dtype))
                _token_rows(v, blocks, offsets, False, values.to(v.device, v.dtype))

    def _row_shape(self) -> tuple[int, int, int, int]:
        """A token's row in a session's file: [layers, 2 (keys, values), kv_heads, head_dim]."""
        values = self._layers[0][1]  # [blocks, kv_heads, block, head_dim]
        return (len(self._layers), 2, values.shape[1], values.shape[3])

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # loads complete in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any):
        return None  # saves happen in wait_for_save, after the whole forward

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, PearlConnectorMetadata)
        for save in meta.saves:
            if save.end <= save.start:
                continue
            blocks, offsets = self._slots(save)
            t = self._keys_transposed
            rows = torch.stack(  # [tokens, layers, 2, kv_heads, head_dim]
                [
                    torch.stack(
                        [
                            _token_rows(k, blocks, offsets, t),
                            _token_rows(v, blocks, offsets, False),
                        ],
                        dim=1,
                    )
                    for k, v in self._layers
                ],
                dim=1,
            )
            # The server reads the rows once the request has returned its token.
            write_rows(save.path, save.start, rows.float().cpu().numpy())


def _cpu_views(name: str, cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, values) of one layer of vLLM's CPU cache ``[blocks, kv_heads, block,
    2 * head_dim]``. Its attention (``cpu_attn.py``, ISA "vec": x86 without AMX, or AMX
    with float32) stores each block's keys head_dim-major (``[head_dim, block]``, for its
    vectorized q.k) and then its values token-major (``[block, head_dim]``); the keys'
    layout was measured against our engine's (``tests/live/test_vllm_backend.py``). Other
    CPU kernels (AMX with bfloat16, ARM, ...) lay keys out otherwise: refused."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # optional: vLLM backend

    blocks, heads, block, _ = cache.shape
    isa = _get_attn_isa(cache.dtype, block, head_dim)
    if isa != "vec":
        raise ValueError(
            f"PEARL's KV connector reads vLLM's CPU KV layout of ISA 'vec' (keys "
            f"head_dim-major, values token-major per block); layer {name!r} runs ISA "
            f"{isa!r} (dtype {cache.dtype}), whose layout it does not know"
        )
    flat = cache.view(blocks, heads, 2 * block * head_dim)
    keys = flat[..., : block * head_dim].view(blocks, heads, head_dim, block)
    values = flat[..., block * head_dim :].view(blocks, heads, block, head_dim)
    return keys, values


def _token_rows(
    cache: torch.Tensor,
    blocks: torch.Tensor,
    offsets: torch.Tensor,
    head_dim_major: bool,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Read (or, given ``rows``, write) the ``[tokens, kv_heads, head_dim]`` rows of the
    tokens at ``(blocks, offsets)`` in a keys or values view ``[blocks, kv_heads, block,
    head_dim]``, or a head_dim-major one ``[blocks, kv_heads, head_dim, block]``."""
    if rows is None:
        return cache[blocks, :, :, offsets] if head_dim_major else cache[blocks, :, offsets]
    if head_dim_major:
        cache[blocks, :, :, offsets] = rows
    else:
        cache[blocks, :, offsets] = rows
    return rows
