"""Runs one scheduled iteration on a torch model over the paged KV cache."""

from __future__ import annotations

import torch

from pearl.engine.decode_kv import DecodeKV, DecodePlan
from pearl.engine.sampler import sample
from pearl.engine.scheduler import PrefillChunk, SchedulerOutput
from pearl.engine.sequence import Sequence
from pearl.models.attention import (
    AttentionMetadata,
    DecodeGroup,
    GatherWorkspace,
    PrefillSegment,
    chunk_causal_mask,
)
from pearl.models.decoder import DecoderForCausalLM


class ModelRunner:
    """Owns the model and the KV cache tensor; turns a ``SchedulerOutput`` into sampled tokens."""

    def __init__(
        self,
        model: DecoderForCausalLM,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = device
        self.generator = torch.Generator().manual_seed(seed)
        self.kv_cache: torch.Tensor | None = None
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.decode_kv: DecodeKV | None = None  # contiguous K/V rows of decoding sequences
        self.allocate_kv_cache()
        self.workspace = GatherWorkspace()
        self.last_logits: torch.Tensor | None = None  # logits of the last iteration's samplers
        self.keep_logits = False

    # -- device state -------------------------------------------------------------
    def allocate_kv_cache(self) -> None:
        cfg = self.model.config
        shape = (
            cfg.num_hidden_layers,
            2,
            cfg.num_key_value_heads,
            self.num_blocks,
            self.block_size,
            cfg.head_dim,
        )
        dtype = next(self.model.parameters()).dtype  # the KV cache stores the model's dtype
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        self.kv_caches = [
            (self.kv_cache[i, 0], self.kv_cache[i, 1]) for i in range(cfg.num_hidden_layers)
        ]
        self.decode_kv = DecodeKV(self.kv_cache, self.block_size)

    def free_kv_cache(self) -> None:
        self.kv_cache = None
        self.workspace = GatherWorkspace()
        self.kv_caches = []
        self.decode_kv = None

    @property
    def kv_cache_bytes(self) -> int:
        return 0 if self.kv_cache is None else self.kv_cache.numel() * self.kv_cache.element_size()

    # -- one iteration ----------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[int], list[float]]:
        """Compute the batch's KV, then sample a token for every sequence that samples."""
        input_ids, positions, meta, sample_rows = self._prepare(out)
        caches = self.kv_caches
        if meta.decode_rows is not None:
            assert self.decode_kv is not None
            caches = [
                (k, v, kr, vr)
                for (k, v), (kr, vr) in zip(caches, self.decode_kv.layer_views, strict=True)
            ]
        try:
            hidden = self.model(input_ids, positions, caches, meta)
        except BaseException:
            if self.decode_kv is not None:
                self.decode_kv.reset()  # rows may hold part of this iteration's writes
            raise
        samplers = out.sampling_sequences()
        if not samplers:
            return [], []
        logits = self.model.compute_logits(hidden[sample_rows])
        if self.keep_logits:
            self.last_logits = logits.clone()
        params = [s.sampling for s in samplers]
        positions_sampled = [s.num_tokens for s in samplers]
        return sample(logits, params, positions_sampled, self.generator)

    def _prepare(self, out: SchedulerOutput):
        bs = self.block_size
        dev = self.device
        ids: list[int] = []
        pos: list[int] = []
        slot_tables: list[int] = []  # block id of each new token
        slot_offsets: list[int] = []
        sample_rows: list[int] = []
        segments = self._add_prefills(
            out.prefills, ids, pos, slot_tables, slot_offsets, sample_rows
        )
        num_prefill = len(ids)
        groups: list[DecodeGroup] = []
        plan = None
        if out.decodes and self.decode_kv is not None:
            plan = self.decode_kv.plan(out.decodes)
        if out.decodes:
            order = self._add_decodes(
                out.decodes, plan, ids, pos, slot_tables, slot_offsets, sample_rows
            )
            if plan is None:
                groups = self._decode_groups(out.decodes, order)
        slot_mapping = torch.tensor(slot_tables, dtype=torch.long) * bs + torch.tensor(
            slot_offsets, dtype=torch.long
        )
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(dev),
            prefills=segments,
            num_prefill_tokens=num_prefill,
            decode_groups=groups,
            workspace=self.workspace,
            decode_rows=None if plan is None else plan.rows,
        )
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        positions = torch.tensor(pos, dtype=torch.long, device=dev)
        return input_ids, positions, meta, torch.tensor(sample_rows, dtype=torch.long, device=dev)

    def _add_prefills(
        self,
        prefills: list[PrefillChunk],
        ids: list[int],
        pos: list[int],
        slot_tables: list[int],
        slot_offsets: list[int],
        sample_rows: list[int],
    ) -> list[PrefillSegment]:
        """Append the prefill chunks' tokens, positions, slots and sampling rows to the lists;
        return one attention segment per chunk, in order."""
        bs = self.block_size
        dev = self.device
        segments: list[PrefillSegment] = []
        for chunk in prefills:
            seq, start, end = chunk.seq, chunk.start, chunk.end
            if self.decode_kv is not None:
                self.decode_kv.forget(seq)  # recomputed after preemption: refill its row
            q0 = len(ids)
            ids.extend(seq.token_ids[start:end])
            pos.extend(range(start, end))
            table = seq.block_table
            for p in range(start, end):
                slot_tables.append(table[p // bs])
                slot_offsets.append(p % bs)
            if start == 0:
                segments.append(PrefillSegment(q0, len(ids), end, None, None))
            else:
                blocks = torch.tensor(table[: -(-end // bs)], dtype=torch.long, device=dev)
                mask = chunk_causal_mask(end - start, end, dev)
                segments.append(PrefillSegment(q0, len(ids), end, blocks, mask))
            if chunk.samples:
                sample_rows.append(len(ids) - 1)
        return segments

    def _add_decodes(
        self,
        decodes: list[Sequence],
        plan: DecodePlan | None,
        ids: list[int],
        pos: list[int],
        slot_tables: list[int],
        slot_offsets: list[int],
        sample_rows: list[int],
    ) -> list[int]:
        """Append one token per decode (after the prefill tokens already in ``ids``) and its
        sampling row; return the row order (``order[r]`` indexes ``decodes``)."""
        bs = self.block_size
        num_prefill = len(ids)
        if plan is not None:
            # Decode row r reads row r of the contiguous K/V rows (no per-layer gather).
            order = plan.order
        else:
            # Fallback: gather each group's blocks in every layer. Rows go in ascending
            # context length so each group pads little.
            order = sorted(range(len(decodes)), key=lambda i: decodes[i].num_tokens)
        # Sampling rows map back to the scheduler's order.
        row_of = [0] * len(order)
        for row, i in enumerate(order):
            seq = decodes[i]
            p = seq.num_tokens - 1
            ids.append(seq.token_ids[p])
            pos.append(p)
            slot_tables.append(seq.block_table[p // bs])
            slot_offsets.append(p % bs)
            row_of[i] = row
        sample_rows.extend(num_prefill + row_of[i] for i in range(len(decodes)))
        return order

    def _decode_groups(self, decodes: list[Sequence], order: list[int]) -> list[DecodeGroup]:
        """Fallback without contiguous K/V rows: group the decodes (in ``order``, ascending
        context) into low-padding runs, each with its padded block tables and context mask."""
        bs = self.block_size
        dev = self.device
        groups: list[DecodeGroup] = []
        for start, end in _length_groups([decodes[i].num_tokens for i in order]):
            seqs = [decodes[i] for i in order[start:end]]
            max_blocks = -(-seqs[-1].num_tokens // bs)
            tables = [
                s.block_table[:max_blocks] + [0] * (max_blocks - len(s.block_table[:max_blocks]))
                for s in seqs
            ]
            ctx = torch.tensor([s.num_tokens for s in seqs], dtype=torch.long, device=dev)
            mask = (torch.arange(max_blocks * bs, device=dev).unsqueeze(0) < ctx.unsqueeze(1))[
                :, None, None, :
            ]
            groups.append(
                DecodeGroup(start, end, torch.tensor(tables, dtype=torch.long, device=dev), mask)
            )
        return groups

    # -- KV transfer ------------------------------------------------------------------
    def read_kv(self, seq: Sequence, start: int, end: int) -> torch.Tensor:
        """KV of tokens ``[start, end)`` as ``[layers, 2, end - start, kv_heads, head_dim]``."""
        slots = self._slots(seq.block_table, start, end)
        cfg = self.model.config
        flat = self.kv_cache.view(
            cfg.num_hidden_layers, 2, cfg.num_key_value_heads, -1, cfg.head_dim
        )
        return flat[:, :, :, slots].permute(0, 1, 3, 2, 4).contiguous().cpu()

    def write_kv(self, seq: Sequence, start: int, kv: torch.Tensor) -> None:
        """Write ``kv [layers, 2, n, kv_heads, head_dim]`` into the slots of tokens ``[start, start+n)``."""
        slots = self._slots(seq.block_table, start, start + kv.shape[2])
        if self.decode_kv is not None:
            self.decode_kv.forget(seq)
        cfg = self.model.config
        flat = self.kv_cache.view(
            cfg.num_hidden_layers, 2, cfg.num_key_value_heads, -1, cfg.head_dim
        )
        flat[:, :, :, slots] = kv.permute(0, 1, 3, 2, 4).to(device=flat.device, dtype=flat.dtype)

    def _slots(self, table: list[int], start: int, end: int) -> torch.Tensor:
        bs = self.block_size
        return torch.tensor(
            [table[p // bs] * bs + p % bs for p in range(start, end)],
            dtype=torch.long,
            device=self.device,
        )


def _length_groups(lengths: list[int], max_padding: float = 0.25) -> list[tuple[int, int]]:
    """Split ascending ``lengths`` into runs whose padded size (rows x longest) stays within
    ``1 + max_padding`` of their real size, so attention cost tracks the sum of contexts."""
    groups = []
    start, total = 0, 0
    for i, n in enumerate(lengths):
        if i > start and (i - start + 1) * n > (1 + max_padding) * (total + n):
            groups.append((start, i))
            start, total = i, 0
        total += n
    groups.append((start, len(lengths)))
    return groups
