"""Iteration scheduler: continuous batching with chunked prefill, role-aware, in two modes.

Pure Python (no torch, no clock): the live engine and the simulator both drive it.
In ``mixed`` mode each iteration picks decodes first (one token each, stall-free),
then fills the remaining token budget with prefill chunks of running and newly
admitted sequences; in ``sglang`` mode (SGLang's default scheduler) a prefill batch
runs alone whenever one can be formed, else all running sequences decode.
``postprocess`` applies the sampled tokens and finishes sequences. When KV blocks run out, pinned sessions are unpinned (least recently
used first) and then the most recently admitted sequences are preempted: their KV
is dropped and they are recomputed later, so no request is ever lost.

Compiled for simulations (``pearl.native``): its dataclasses take no ``slots=True``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from collections.abc import Sequence as Sequence_
from dataclasses import dataclass, field
from enum import StrEnum

from pearl.engine.block_manager import KVBlocks, OutOfBlocks
from pearl.engine.kv_transfer import token_digest
from pearl.engine.sequence import (
    FinishReason,
    Request,
    RequestOutput,
    Role,
    Sequence,
    SequenceStatus,
)
from pearl.errors import (
    EngineStateError,
    KVOutOfMemory,
    KVPrefixMismatch,
    KVTransferError,
    RequestError,
)
from pearl.token_runs import TokenIds, TokenRuns, list_common_prefix


class InFlight(StrEnum):
    """What a role change does with requests the new role cannot run."""

    DRAIN = "drain"  # finish them in the old role first
    HAND_BACK = "hand_back"  # abort them and return their partial outputs


class SchedulingMode(StrEnum):
    """How an iteration is composed (both are real engines' defaults)."""

    MIXED = "mixed"
    """Decode-first: every running decode, then prefill chunks fill the token budget
    (``max_num_batched_tokens``) in the same forward pass (Sarathi-style chunked prefill)."""
    SGLANG = "sglang"
    """SGLang's default: a prefill batch runs alone whenever one can be formed (at most
    ``min(chunked_prefill_size, max_prefill_tokens)`` tokens, stalling every running decode
    of the worker for its duration); otherwise all running sequences decode. No mixing."""


SGLANG_RESERVED_DECODE_TOKENS = 512
"""KV tokens an ``sglang``-mode engine keeps free per request when it admits a KV import:
SGLang's ``--num-reserved-decode-tokens`` default (512), which its PD decode server's
preallocation queue checks before taking a transfer (docs/regime.md, Sources)."""


@dataclass
class SchedulerConfig:
    """Batching limits, the iteration composition and the worker's role. Built by
    ``EngineConfig.scheduler_config``, which holds the defaults of the engine's fields."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    role: Role
    # Decode role only: run appends of at most this many tokens locally (0 = import only).
    local_prefill_max_tokens: int
    mode: SchedulingMode
    # ``sglang`` mode only (SGLang's --chunked-prefill-size and --max-prefill-tokens).
    chunked_prefill_size: int
    max_prefill_tokens: int
    eos_token_ids: tuple[int, ...] = ()
    # False: no request starts from the prefix cache (SGLang's --disable-radix-cache); a
    # request still starts from its session's pinned KV, which its caller asked to keep.
    prefix_cache: bool = True
    # ``sglang`` mode, decode role: KV tokens kept free per request when an import is
    # admitted (SGLang's --num-reserved-decode-tokens).
    reserved_decode_tokens: int = SGLANG_RESERVED_DECODE_TOKENS

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1 or self.max_model_len < 2:
            raise ValueError(
                "max_num_batched_tokens and max_num_seqs must be >= 1 and max_model_len >= 2, "
                f"got {self.max_num_batched_tokens}, {self.max_num_seqs}, {self.max_model_len}"
            )
        if self.chunked_prefill_size < 1 or self.max_prefill_tokens < 1:
            raise ValueError(
                "chunked_prefill_size and max_prefill_tokens must be >= 1, got "
                f"{self.chunked_prefill_size}, {self.max_prefill_tokens}"
            )
        self.role = Role(self.role)
        try:
            self.mode = SchedulingMode(self.mode)
        except ValueError:
            raise ValueError(
                f"scheduling mode {self.mode!r} is not one of: "
                f"{', '.join(m.value for m in SchedulingMode)}"
            ) from None


@dataclass
class PrefillChunk:
    """Compute the KV of ``seq.token_ids[start:end]``; sample a token if ``end`` is the last."""

    seq: Sequence
    start: int
    end: int

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    @property
    def samples(self) -> bool:
        return self.end == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    """One iteration's work: prefill chunks (flattened first), then one token per decode."""

    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.prefills) + len(self.decodes)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes

    def sampling_sequences(self) -> list[Sequence]:
        """Sequences that get a new token this iteration, in flat-batch order."""
        return [c.seq for c in self.prefills if c.samples] + self.decodes


class Scheduler:
    """Owns the waiting queue, the running set and the pinned sessions of one engine."""

    def __init__(self, config: SchedulerConfig, block_manager: KVBlocks) -> None:
        self.config = config
        self.blocks = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # ordered by arrival
        self.sessions: OrderedDict[str, Sequence] = OrderedDict()  # pinned KV, LRU first
        # Sessions imported for a turn that has not started from them yet, on an sglang-mode
        # decode engine (a PD decode server's KV in transfer): memory pressure unpins every
        # other session first, as SGLang's decode server keeps the KV it preallocated for a
        # transfer. Cleared when the turn starts, is aborted, or the session is released.
        self._claimed: set[str] = set()
        self._arrivals = 0
        self.num_preemptions = 0
        self._finished_early: list[RequestOutput] = []  # finished while scheduling
        self._preempted_now: set[int] = set()
        # The engine's current weights (its owner sets the starting ones and reports each
        # update, ``new_weights``; every iteration's postprocess states them too): the
        # prefix cache holds only KV they computed (an update empties it, and imported KV
        # of older weights never enters it).
        self.weight_version = 0

    # -- queries ------------------------------------------------------------------
    @property
    def role(self) -> Role:
        return self.config.role

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def num_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def find(self, request_id: str) -> Sequence | None:
        for seq in self.running:
            if seq.request_id == request_id:
                return seq
        for seq in self.waiting:
            if seq.request_id == request_id:
                return seq
        return None

    def session_length(self, session_id: str) -> int:
        """Tokens of ``session_id`` whose KV this engine holds pinned (0 if none)."""
        seq = self.sessions.get(session_id)
        return seq.num_computed_tokens if seq is not None else 0

    def match_session(self, session_id: str, token_ids: Sequence_[int]) -> int:
        """Tokens of ``token_ids`` whose KV this engine holds pinned for the session.

        An agent may edit its context between turns (thinking stripped, an observation
        truncated), so the held tokens can diverge from the new context. Then the session
        keeps only their longest common prefix, rounded down to whole blocks (a block's
        KV and prefix-cache hash stay consistent), and the rest is dropped: an import of
        ``token_ids[kept:]`` continues it. Returns the tokens kept.
        """
        pinned = self.sessions.get(session_id)
        if pinned is None:
            return 0
        held = pinned.num_computed_tokens
        # A list or TokenRuns as is. Typed TokenIds (Any): compiled (pearl.native), mypyc checked the
        # narrowed ``list | TokenRuns`` of an ``isinstance(x, (list, TokenRuns))`` as a list.
        ids: TokenIds = token_ids
        if not isinstance(ids, TokenRuns) and not isinstance(ids, list):
            ids = list(ids)
        common = _common_prefix_length(pinned.token_ids, ids, held)
        if common == held:
            return held
        bs = self.blocks.block_size
        keep = common // bs * bs
        if keep == 0:
            self.release_session(session_id)
            return 0
        self.blocks.truncate(pinned, keep // bs)
        del pinned.token_ids[keep:]
        pinned.num_computed_tokens = keep
        return keep

    def session_tokens(self, session_id: str) -> TokenIds:
        seq = self.sessions.get(session_id)
        return seq.token_ids[: seq.num_computed_tokens] if seq is not None else []

    # -- intake -------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue ``seq``; raises ``RequestError``/``EngineStateError`` and changes nothing
        if it can never run here."""
        cfg = self.config
        if seq.num_tokens < 1:
            raise RequestError(f"request {seq.request_id!r}: the prompt is empty")
        if seq.num_tokens >= cfg.max_model_len:
            raise RequestError(
                f"request {seq.request_id!r}: prompt of {seq.num_tokens} tokens does not fit the "
                f"context limit max_model_len={cfg.max_model_len} (prompt must be shorter)"
            )
        capacity = self.blocks.num_blocks * self.blocks.block_size
        if seq.num_tokens + 1 > capacity:
            raise RequestError(
                f"request {seq.request_id!r}: {seq.num_tokens} tokens exceed the KV cache "
                f"capacity of {capacity} tokens"
            )
        if self.find(seq.request_id) is not None:
            raise RequestError(f"request id {seq.request_id!r} is already in flight")
        key = seq.session_id
        if key is not None and any(s.session_id == key for s in self._in_flight()):
            raise RequestError(f"session {key!r} already has a request in flight on this engine")
        if cfg.role is Role.DECODE:
            held = self._attachable_length(seq)
            missing = seq.num_tokens - held - 1
            if missing > cfg.local_prefill_max_tokens:
                raise EngineStateError(
                    f"request {seq.request_id!r}: decode-role engine holds KV for {held} of "
                    f"{seq.num_tokens} tokens of session {key!r}; import KV for tokens "
                    f"[{held}, {seq.num_tokens - 1}) first (local prefill allows "
                    f"{cfg.local_prefill_max_tokens} tokens)"
                )
        self._arrivals += 1
        seq.arrival = self._arrivals
        self.waiting.append(seq)

    def _in_flight(self) -> Iterable[Sequence]:
        yield from self.running
        yield from self.waiting

    def _attachable_length(self, seq: Sequence) -> int:
        pinned = self.sessions.get(seq.session_id) if seq.session_id is not None else None
        if pinned is None:
            return 0
        n = pinned.num_computed_tokens
        if n >= seq.num_tokens:
            return 0
        hint = seq.attach_hint
        if hint is not None and hint[0] is pinned and hint[1] == n:
            return n  # matched before (admission check); a pinned prefix never changes
        held = pinned.token_ids
        if len(held) != n:  # a sampled token whose KV was never computed is not held
            held = held[:n]
        if seq.token_ids[:n] != held:
            return 0
        seq.attach_hint = (pinned, n)
        return n

    # -- scheduling ---------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> SchedulerOutput:
        """Pick this iteration's decodes and prefill chunks (see ``SchedulingMode``)."""
        if self.config.mode is SchedulingMode.SGLANG:
            return self._schedule_prefill_first(now)
        out = SchedulerOutput()
        scheduled: set[int] = set()
        self._preempted_now = set()
        budget = self.config.max_num_batched_tokens
        if self.config.role is not Role.PREFILL:
            budget = self._schedule_decodes(budget, out, scheduled)
        budget = self._continue_prefills(budget, out, scheduled)
        self._admit_waiting(now, budget, out, scheduled)
        return out

    def _schedule_decodes(self, budget: int, out: SchedulerOutput, scheduled: set[int]) -> int:
        """Decodes first: every running sequence with exactly one uncomputed token, while the
        token budget lasts (preempting for memory). Returns the budget left."""
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING or seq.num_uncomputed_tokens != 1:
                continue
            if self._reserve(seq, seq.num_tokens, scheduled):
                out.decodes.append(seq)
                scheduled.add(id(seq))
                budget -= 1
        return budget

    def _continue_prefills(self, budget: int, out: SchedulerOutput, scheduled: set[int]) -> int:
        """Continue the running sequences' chunked prefills; returns the budget left."""
        prefill_role = self.config.role is Role.PREFILL
        for seq in list(self.running):
            if budget == 0:
                break
            if id(seq) in scheduled or seq.status is not SequenceStatus.RUNNING:
                continue
            if seq.num_uncomputed_tokens > 1 or prefill_role:
                budget -= self._schedule_prefill(seq, budget, out, scheduled)
        return budget

    def _admit_waiting(
        self, now: float, budget: int, out: SchedulerOutput, scheduled: set[int]
    ) -> None:
        """Admit waiting sequences in order while the budget, the sequence cap and memory
        allow: a sequence with one token left decodes, the others start a prefill chunk."""
        cfg = self.config
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            if id(seq) in self._preempted_now:
                break  # just preempted for memory: do not thrash it back in
            pinned = None
            if not seq.block_table:
                pinned = self._attach_kv(seq)
            if seq.num_uncomputed_tokens == 1 and cfg.role is not Role.PREFILL:
                ok = self._reserve(seq, seq.num_tokens, scheduled, may_preempt=False)
                if ok:
                    out.decodes.append(seq)
                    budget -= 1
            else:
                chunk = min(seq.num_uncomputed_tokens, budget)
                ok = self._reserve(
                    seq, seq.num_computed_tokens + chunk, scheduled, may_preempt=False
                )
                if ok:
                    out.prefills.append(
                        PrefillChunk(seq, seq.num_computed_tokens, seq.num_computed_tokens + chunk)
                    )
                    budget -= chunk
            if not ok:
                # Out of memory: the head waits; a session it attached is pinned again (an
                # imported turn keeps its KV), KV from the prefix cache goes (full blocks
                # stay cached).
                self._detach_head(seq, pinned)
                break
            self._admit_head(now)
            scheduled.add(id(seq))

    def _schedule_prefill_first(self, now: float) -> SchedulerOutput:
        """``sglang`` mode: a prefill-only batch if one can be formed, else a decode batch."""
        cfg = self.config
        out = SchedulerOutput()
        scheduled: set[int] = set()
        self._preempted_now = set()
        budget = min(cfg.chunked_prefill_size, cfg.max_prefill_tokens)
        role = cfg.role

        # 1. A chunked prefill in progress continues first.
        prefill_role = role is Role.PREFILL
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is SequenceStatus.RUNNING and (
                prefill_role or len(seq.token_ids) - seq.num_computed_tokens != 1
            ):
                budget -= self._schedule_prefill(seq, budget, out, scheduled)

        # 2. Admit waiting sequences: prefills into this batch; sequences whose KV is all
        #    there (imported, or cached) join the running set and decode with the others.
        self._admit_waiting_prefill_first(now, budget, out, scheduled)
        if out.prefills or prefill_role:
            return out
        # 3. No prefill to run: every running sequence decodes one token.
        self._decode_all_running(out, scheduled)
        return out

    def _admit_waiting_prefill_first(
        self, now: float, budget: int, out: SchedulerOutput, scheduled: set[int]
    ) -> None:
        """``sglang`` mode's admission: prefill chunks while the budget lasts; a sequence
        whose KV is all there joins the running set to decode with the others."""
        cfg = self.config
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            if id(seq) in self._preempted_now:
                break
            pinned = None
            if not seq.block_table:
                pinned = self._attach_kv(seq)
            if seq.num_uncomputed_tokens == 1 and cfg.role is not Role.PREFILL:
                ok = self._reserve(seq, seq.num_tokens, scheduled, may_preempt=False)
            elif budget == 0:
                self._detach_head(seq, pinned)  # waits for the next batch, its KV pinned
                break
            else:
                chunk = min(seq.num_uncomputed_tokens, budget)
                end = seq.num_computed_tokens + chunk
                ok = self._reserve(seq, end, scheduled, may_preempt=False)
                if ok:
                    out.prefills.append(PrefillChunk(seq, seq.num_computed_tokens, end))
                    scheduled.add(id(seq))
                    budget -= chunk
            if not ok:
                self._detach_head(seq, pinned)
                break
            self._admit_head(now)

    def _decode_all_running(self, out: SchedulerOutput, scheduled: set[int]) -> None:
        """A decode batch: every running sequence with one token to compute (memory allowing)."""
        bs, decodes, running = self.blocks.block_size, out.decodes, SequenceStatus.RUNNING
        for seq in list(self.running):  # hot in the simulator: the checks and _reserve inlined
            n = len(seq.token_ids)
            if seq.status is not running or n - seq.num_computed_tokens != 1:
                continue
            if len(seq.block_table) * bs >= n or self._reserve(seq, n, scheduled):
                decodes.append(seq)
                scheduled.add(id(seq))

    def _admit_head(self, now: float) -> None:
        """Move the head of the waiting queue (its KV reserved) into the running set."""
        seq = self.waiting.popleft()
        if seq.session_id is not None:
            self._claimed.discard(seq.session_id)  # its imported KV is in use now
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        if seq.telemetry.started_at is None:
            seq.telemetry.started_at = now

    def _schedule_prefill(
        self, seq: Sequence, budget: int, out: SchedulerOutput, scheduled: set[int]
    ) -> int:
        chunk = min(seq.num_uncomputed_tokens, budget)
        end = seq.num_computed_tokens + chunk
        if not self._reserve(seq, end, scheduled):
            return 0
        out.prefills.append(PrefillChunk(seq, seq.num_computed_tokens, end))
        scheduled.add(id(seq))
        return chunk

    def _attach_kv(self, seq: Sequence) -> Sequence | None:
        """Start ``seq`` from its pinned session's KV, else from the prefix cache; returns the
        session's pinned sequence when ``seq`` took its KV (for ``_detach_head``)."""
        pinned = self.sessions.get(seq.session_id) if seq.session_id is not None else None
        if pinned is not None and seq.attach_hint is None:
            # Keeps all of it for an append; for an edited context the block-aligned common
            # prefix (what the prefix cache would find, without hashing every block again).
            assert seq.session_id is not None  # it has a pinned session
            kept = self.match_session(seq.session_id, seq.token_ids)
            if 0 < kept < seq.num_tokens:
                seq.attach_hint = (pinned, kept)
        held = self._attachable_length(seq)
        # Used up: kept, the hint's pinned sequence (and through its own hint every earlier
        # turn of the session, with their contexts) would stay in memory as long as this one.
        seq.attach_hint = None
        if held:
            assert seq.session_id is not None  # held KV is a pinned session's
            pinned = self.sessions.pop(seq.session_id)
            seq.block_table = pinned.block_table
            seq.num_hashed_blocks = pinned.num_hashed_blocks
            seq.cacheable = pinned.cacheable
            seq.kv_version = pinned.kv_version
            seq.num_computed_tokens = held
            pinned.block_table = []
            self.blocks.cache_queries += seq.num_tokens
            self.blocks.cache_hits += held
            seq.telemetry.prefill_tokens_cached += held
            return pinned
        else:
            if seq.session_id is not None:
                self.release_session(seq.session_id)
            if self.config.prefix_cache:
                held = self.blocks.attach_prefix(seq)
            else:
                self.blocks.cache_queries += seq.num_tokens  # looked up, nothing served
            if held:  # every update empties the cache: what it holds, these weights computed
                seq.kv_version = self.weight_version
        seq.telemetry.prefill_tokens_cached += held
        return None

    def _detach_head(self, seq: Sequence, pinned: Sequence | None) -> None:
        """The waiting head ``seq`` could not be admitted: give back what it attached. KV it
        took from its session (``pinned``, returned by ``_attach_kv``) is pinned again (still
        claimed if it was imported for this turn); prefix-cache blocks are released."""
        if pinned is None or seq.session_id is None:
            self.blocks.release(seq)
            return
        held = seq.num_computed_tokens
        pinned.block_table, seq.block_table = seq.block_table, []
        pinned.num_hashed_blocks = seq.num_hashed_blocks
        seq.num_hashed_blocks = 0
        seq.num_computed_tokens = 0
        seq.cacheable = True
        seq.kv_version = None
        seq.telemetry.prefill_tokens_cached -= held
        self.blocks.cache_queries -= seq.num_tokens
        self.blocks.cache_hits -= held
        self.sessions[seq.session_id] = pinned

    def _reserve(
        self, seq: Sequence, num_tokens: int, scheduled: set[int], may_preempt: bool = True
    ) -> bool:
        """Make ``seq``'s block table cover ``num_tokens``; unpin sessions, then preempt
        later arrivals not yet scheduled this iteration. False if ``seq`` must wait."""
        if len(seq.block_table) * self.blocks.block_size >= num_tokens:
            return True  # already covered (most decode steps)
        while True:
            try:
                self.blocks.allocate(seq, num_tokens)
                return True
            except OutOfBlocks:
                pass
            unclaimed = self._unclaimed_session()
            if unclaimed is not None:
                self.release_session(unclaimed)
                continue
            if self.sessions and not self.running:
                # Only claimed KV is left and nothing runs to free any: the newest claim goes
                # (its turn prefills it again), or no turn would ever start.
                self.release_session(next(reversed(self.sessions)))
                continue
            if not may_preempt:
                return False
            victim = next(
                (s for s in reversed(self.running) if id(s) not in scheduled and s is not seq), None
            )
            if victim is None and self.sessions:
                # Only claimed KV is left: the newest claim goes (its turn prefills it again).
                self.release_session(next(reversed(self.sessions)))
                continue
            if victim is None:
                if seq.status is SequenceStatus.RUNNING and len(self.running) == 1:
                    # Alone and still out of blocks: the KV cache is smaller than this sequence.
                    self._finish(seq, FinishReason.LENGTH, pin=False)
                    self._finished_early.append(seq.to_output(FinishReason.LENGTH))
                else:
                    self._preempt(seq)
                return False
            self._preempt(victim)

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.release(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        seq.telemetry.preemptions += 1
        self.num_preemptions += 1
        self._preempted_now.add(id(seq))
        self.waiting.appendleft(seq)

    # -- results ------------------------------------------------------------------
    def postprocess(
        self,
        out: SchedulerOutput,
        sampled_tokens: list[int],
        sampled_logprobs: list[float],
        weight_version: int,
        now: float = 0.0,
    ) -> list[RequestOutput]:
        """Apply one iteration's results, computed by weights ``weight_version``; return
        the requests that finished (or were prefilled)."""
        self.weight_version = weight_version
        finished = self._finished_early
        self._finished_early = []
        for chunk in out.prefills:
            seq = chunk.seq
            seq.num_computed_tokens = chunk.end
            seq.telemetry.prefill_tokens_computed += chunk.num_tokens
            if seq.kv_version is None:
                seq.kv_version = weight_version
            self.blocks.commit(seq)
        bs = self.blocks.block_size
        for seq in out.decodes:
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                seq.telemetry.prefill_tokens_computed += 1  # a prompt's last token, run as a decode
            if seq.kv_version is None:
                seq.kv_version = weight_version
            seq.num_computed_tokens += 1
            if seq.num_computed_tokens // bs > seq.num_hashed_blocks:  # a block just filled
                self.blocks.commit(seq)
        samplers = out.sampling_sequences()
        assert len(samplers) == len(sampled_tokens) == len(sampled_logprobs)
        cfg = self.config
        for seq, token, logprob in zip(samplers, sampled_tokens, sampled_logprobs, strict=True):
            spans = seq.version_spans
            kv = seq.kv_version
            if not spans or spans[-1][1] != weight_version or spans[-1][2] != kv:
                assert kv is not None  # it computed KV in this iteration
                spans.append((len(seq.token_ids) - seq.num_prompt_tokens, weight_version, kv))
            seq.token_ids.append(token)
            seq.output_logprobs.append(logprob)
            seq.weight_version = weight_version
            if seq.telemetry.first_token_at is None:
                seq.telemetry.first_token_at = now
            sp = seq.sampling
            reason: FinishReason | None = None
            if token in sp.stop_token_ids or (not sp.ignore_eos and token in cfg.eos_token_ids):
                reason = FinishReason.STOP
            elif seq.num_output_tokens >= sp.max_new_tokens or seq.num_tokens >= cfg.max_model_len:
                reason = FinishReason.LENGTH
            elif cfg.role is Role.PREFILL:
                reason = FinishReason.PREFILLED
            if reason is not None:
                seq.telemetry.finished_at = now
                pin = seq.request.pin_session or cfg.role is Role.PREFILL
                self._finish(seq, reason, pin=pin)
                finished.append(seq.to_output(reason))
        return finished

    def _finish(self, seq: Sequence, reason: FinishReason, pin: bool) -> None:
        seq.status = SequenceStatus.FINISHED
        if seq in self.running:
            self.running.remove(seq)
        key = seq.session_id or seq.request_id
        if pin and seq.num_computed_tokens > 0:
            if key in self.sessions:
                self.release_session(key)
            self.sessions[key] = seq
        else:
            self.blocks.release(seq)

    # -- control ------------------------------------------------------------------
    def abort(
        self, request_id: str, reason: FinishReason = FinishReason.ABORT
    ) -> RequestOutput | None:
        """Stop a request, free its KV and return its partial output (None if unknown)."""
        seq = self.find(request_id)
        if seq is None:
            return None
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        if seq.session_id is not None:
            self._claimed.discard(seq.session_id)  # its imported KV waits for no turn now
        self.blocks.release(seq)
        seq.status = SequenceStatus.FINISHED
        return seq.to_output(reason)

    def release_session(self, session_id: str) -> bool:
        """Unpin a session's KV (full blocks stay in the prefix cache until evicted)."""
        seq = self.sessions.pop(session_id, None)
        self._claimed.discard(session_id)
        if seq is None:
            return False
        self.blocks.release(seq)
        return True

    def import_session(
        self,
        session_id: str,
        start: int,
        token_ids: Sequence_[int],
        prefix: str | Sequence_[int],
        now: float = 0.0,
        cacheable: bool = True,
        kv_version: int | None = None,
    ) -> tuple[Sequence | None, int]:
        """Extend the pinned KV of ``session_id`` with tokens ``[start, start + len(token_ids))``
        computed elsewhere; reserve their blocks and mark them computed. ``prefix`` is the
        tokens ``[0, start)`` the chunk continues, or their ``token_digest``.

        Returns the pinned sequence (``None`` for an empty chunk of a session not held) and
        how many leading tokens of the chunk were already held (their KV is kept). The
        caller writes the KV of the rest. ``cacheable=False`` (KV the sender computed, in
        part, with older weights) keeps the session's blocks out of the prefix cache;
        ``kv_version`` is the oldest weights version in the chunk's KV (None: this engine's
        current weights).
        Raises ``KVPrefixMismatch`` if the chunk does not continue what is held
        (``match_session`` first), ``KVOutOfMemory`` if its blocks do not fit now; either
        way nothing changes.
        """
        if any(s.session_id == session_id for s in self._in_flight()):
            raise KVTransferError(
                f"session {session_id!r} has a request in flight on this engine; import between turns"
            )
        pinned = self.sessions.get(session_id)
        overlap = self._check_continues(session_id, pinned, start, token_ids, prefix)
        if overlap >= len(token_ids):
            return pinned, overlap
        if pinned is None:
            # Its token ids of the chunk's kind (a list, or the simulator's TokenRuns).
            empty: TokenIds = token_ids[:0] if isinstance(token_ids, TokenRuns) else []
            pinned = Sequence(
                Request(f"kv-import:{session_id}", empty, session_id=session_id), 0, now
            )
            pinned.status = SequenceStatus.FINISHED
        else:
            self.sessions.pop(session_id)
        held = start + overlap
        end = start + len(token_ids)
        self._reserve_import(session_id, pinned, held, end)
        del pinned.token_ids[held:]  # a sampled-but-uncomputed last token is dropped
        pinned.token_ids.extend(token_ids[overlap:])
        pinned.num_computed_tokens = end
        pinned.telemetry.kv_tokens_imported += end - held
        if kv_version is None:
            kv_version = self.weight_version
        # KV older than this engine's weights (computed before an update the sender had
        # not had) continues its session but never enters the prefix cache.
        pinned.cacheable = pinned.cacheable and cacheable and kv_version >= self.weight_version
        if pinned.kv_version is None or kv_version < pinned.kv_version:
            pinned.kv_version = kv_version
        self.blocks.commit(pinned)
        self.sessions[session_id] = pinned
        if self._decode_server():
            self._claimed.add(session_id)
        return pinned, overlap

    def _check_continues(
        self,
        session_id: str,
        pinned: Sequence | None,
        start: int,
        token_ids: Sequence_[int],
        prefix: str | Sequence_[int],
    ) -> int:
        """How many leading tokens of a chunk starting at ``start`` the session holds
        already; raises ``KVPrefixMismatch`` unless the chunk continues what it holds."""
        held = pinned.num_computed_tokens if pinned is not None else 0
        held_tokens: TokenIds = (
            pinned.token_ids if pinned is not None else []
        )  # first `held` computed
        if start > held:
            raise KVPrefixMismatch(
                f"session {session_id!r}: engine holds {held} tokens but the chunk starts at {start}; "
                f"export from token {held}"
            )
        if isinstance(prefix, str):
            prefix_matches = token_digest(held_tokens[:start]) == prefix
        else:
            ids: TokenIds = prefix  # a list or TokenRuns compares as is
            if not isinstance(ids, TokenRuns) and not isinstance(ids, list):
                ids = list(ids)
            held_head = held_tokens if len(held_tokens) == start else held_tokens[:start]
            prefix_matches = len(ids) == start and held_head == ids
        if not prefix_matches:
            raise KVPrefixMismatch(
                f"session {session_id!r}: the chunk's prefix tokens [0, {start}) differ from the tokens held here"
            )
        overlap = held - start
        if overlap > 0 and list(held_tokens[start:held]) != list(
            token_ids[: min(overlap, len(token_ids))]
        ):
            raise KVPrefixMismatch(
                f"session {session_id!r}: the chunk's token ids differ from the held tokens [{start}, {held})"
            )
        return overlap

    def _reserve_import(self, session_id: str, pinned: Sequence, held: int, end: int) -> None:
        """Blocks for ``pinned`` (out of the sessions table) up to ``end`` tokens, unpinning
        other sessions if needed; raises ``KVOutOfMemory`` with ``pinned`` put back (if it
        held any) when they do not fit. In ``sglang`` mode the import must also leave
        ``SGLANG_RESERVED_DECODE_TOKENS`` free per request on this engine (its own included),
        as SGLang's decode server admits a transfer only with that room for decoding."""
        reserve = 0
        if self._decode_server():
            # One per request on this engine: running, waiting, imported for a turn not yet
            # submitted, and this one (a waiting turn's claimed session is not counted twice).
            waiting = {q.session_id for q in self.waiting}
            requests = len(self.running) + len(self.waiting) + 1
            requests += sum(1 for sid in self._claimed if sid not in waiting)
            tokens = self.config.reserved_decode_tokens * requests
            reserve = -(-tokens // self.blocks.block_size)
        while True:
            try:
                if reserve and (
                    -(-end // self.blocks.block_size) - len(pinned.block_table) + reserve
                    > self.blocks.num_free_blocks
                ):
                    raise OutOfBlocks(f"no room for {reserve} blocks of decode growth")
                self.blocks.allocate(pinned, end)
                return
            except OutOfBlocks as exc:
                unclaimed = self._unclaimed_session()
                if unclaimed is None:  # what is left is KV other transfers claimed
                    if held:
                        self.sessions[session_id] = pinned
                    raise KVOutOfMemory(
                        f"session {session_id!r}: no KV memory for {end - held} more tokens ({exc})"
                    ) from exc
                self.release_session(unclaimed)

    def _decode_server(self) -> bool:
        """Whether this engine runs as SGLang's PD decode server (sglang mode, decode role):
        it claims imported KV and admits an import only with room to decode."""
        return self.config.mode is SchedulingMode.SGLANG and self.config.role is Role.DECODE

    def _unclaimed_session(self) -> str | None:
        """The least recently used pinned session no imported turn waits for, if any."""
        if not self._claimed:
            return next(iter(self.sessions), None)
        if not self._decode_server():  # the role changed: its claims no longer hold
            self._claimed.clear()
            return next(iter(self.sessions), None)
        return next((sid for sid in self.sessions if sid not in self._claimed), None)

    def new_weights(self, version: int, flush: bool = False) -> None:
        """Weights ``version`` were installed between two iterations: from now on a prefix
        hit or an import is labelled with them (not with the last iteration's), and the
        cache's old KV goes (``flush_prefix_cache`` with ``flush``, else
        ``invalidate_cached_kv``)."""
        self.weight_version = version
        if flush:
            self.flush_prefix_cache()
        else:
            self.invalidate_cached_kv()

    def invalidate_cached_kv(self) -> None:
        """New weights landed: no later request may attach KV the old ones computed. The
        prefix cache is emptied; in-flight sequences and pinned sessions keep their KV (they
        continue under the new weights) but never register a block in the cache again. A
        waiting sequence that holds no KV yet stays cacheable: all of its KV, the new
        weights compute (the batch's first prompts, waiting when an update lands, share
        their prefix again)."""
        self.blocks.reset_prefix_cache()
        for seq in self._in_flight():
            if seq.block_table or seq.num_computed_tokens:
                seq.cacheable = False
        for seq in self.sessions.values():
            seq.cacheable = False

    def flush_prefix_cache(self) -> None:
        """Forget all reusable KV (pinned sessions and the prefix cache), as an engine that
        flushes its cache on a weight update does: every continuing session re-prefills.
        In-flight sequences keep their KV but never register it (``invalidate_cached_kv``)."""
        for sid in list(self.sessions):
            self.release_session(sid)
        self.invalidate_cached_kv()

    def incompatible_with(self, role: Role) -> list[Sequence]:
        """In-flight sequences that ``role`` cannot run."""
        bad = []
        for seq in self._in_flight():
            if role is Role.PREFILL and seq.num_output_tokens > 0:
                bad.append(seq)  # it is decoding
            elif role is Role.DECODE:
                held = seq.num_computed_tokens if seq.block_table else self._attachable_length(seq)
                if seq.num_tokens - held - 1 > self.config.local_prefill_max_tokens:
                    bad.append(seq)  # it still needs a prefill
        return bad

    def hand_back(self, seqs: list[Sequence]) -> list[RequestOutput]:
        return [o for s in list(seqs) if (o := self.abort(s.request_id, FinishReason.HANDED_BACK))]

    def all_block_tables(self) -> list[list[int]]:
        """Block tables of everything holding KV (for invariant checks)."""
        tables = [s.block_table for s in self._in_flight() if s.block_table]
        return tables + [s.block_table for s in self.sessions.values()]


def _common_prefix_length(a: Sequence_[int], b: Sequence_[int], limit: int | None = None) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (at most ``limit``).

    Both must be the same sequence type (list vs list, compared by C-speed slices:
    ``list_common_prefix``), or two ``TokenRuns`` (compared by runs).
    """
    if isinstance(a, TokenRuns) and isinstance(b, TokenRuns):
        return a.common_prefix(b, limit)
    n = min(len(a), len(b)) if limit is None else min(limit, len(a), len(b))
    return list_common_prefix(a, b, n)  # type: ignore[arg-type]
