"""The rollout worker's inference engine: schedule -> run -> postprocess, plus KV transfer,
role changes, abort, sleep/wake and versioned weight loading."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pearl.engine.block_manager import BlockManager
from pearl.engine.config import EngineConfig
from pearl.engine.kv_transfer import KVChunk, token_digest
from pearl.engine.model_runner import ModelRunner
from pearl.engine.scheduler import InFlight, Scheduler, SchedulerOutput
from pearl.engine.sequence import Request, RequestOutput, Role, Sequence
from pearl.errors import EngineStateError, KVTransferError, RequestError
from pearl.models.config import ModelConfig
from pearl.models.decoder import DecoderForCausalLM
from pearl.models.devices import torch_device, torch_dtype
from pearl.models.layers import Linear, prepack
from pearl.models.loader import build_model, load_model, load_state_dict


@dataclass(slots=True)
class EngineStats:
    """Counters since the engine started (times in seconds of the engine's clock)."""

    iterations: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    scheduler_time: float = 0.0  # schedule + postprocess
    model_time: float = 0.0  # input preparation + forward + sampling
    preemptions: int = 0
    cache_hit_tokens: int = 0
    cache_query_tokens: int = 0
    free_blocks: int = 0
    num_blocks: int = 0
    pinned_sessions: int = 0
    running: int = 0
    waiting: int = 0
    weight_version: int = 0
    role: str = ""
    asleep: bool = False


def model_fingerprint(model: DecoderForCausalLM, samples: int = 64) -> str:
    """Identifies a model by its config and its weights: every parameter's name, shape and
    ``samples`` values spread over it (two checkpoints that differ anywhere in training
    differ there; hashing all of a model's bytes would take seconds per worker start)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(json.dumps(model.config.to_hf_dict(), sort_keys=True).encode())
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            flat = param.detach().reshape(-1)
            h.update(f"{name}:{tuple(param.shape)}".encode())
            if flat.numel():
                index = spread_indices(flat.numel(), samples)
                h.update(flat[index].to(torch.float64).cpu().numpy().tobytes())
    return h.hexdigest()


def spread_indices(n: int, k: int) -> torch.Tensor:
    """``min(k, n)`` indices spread evenly over ``range(n)``, first and last included, in
    integer arithmetic (float32 ``linspace`` rounds ``n - 1`` up to ``n`` past 2**24)."""
    k = min(k, n)
    return torch.arange(k, dtype=torch.int64) * (n - 1) // max(k - 1, 1)


class LLMEngine:
    """One worker's engine. Not thread-safe: one caller drives ``step``."""

    def __init__(
        self,
        model: DecoderForCausalLM,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        weight_version: int = 0,
    ) -> None:
        config = config or EngineConfig()
        self.config = config
        self.model_config = model.config
        # KV is exchanged only between engines of the same model: the same config and the
        # same initial weights (a folder name alone would match different checkpoints).
        self.model_id = config.model_id or f"{model.config.model_type}-{model_fingerprint(model)}"
        self.device = torch_device(config.device)
        self.dtype = torch_dtype(config.dtype)
        self.clock = clock
        self.weight_version = weight_version
        # Called after every non-empty iteration with its schedule and its seconds
        # (schedule + forward + postprocess), e.g. to log batch shapes against time.
        self.on_iteration: Callable[[SchedulerOutput, float], None] | None = None
        max_len = config.max_model_len or model.config.context_limit
        if max_len > model.config.context_limit:
            raise RequestError(
                f"max_model_len {max_len} exceeds the model's max_position_embeddings "
                f"{model.config.context_limit}"
            )
        self.blocks = BlockManager(config.num_kv_blocks, config.block_size)
        self.scheduler = Scheduler(
            config.scheduler_config(max_len, Role(config.role), model.config.eos_token_id),
            self.blocks,
        )
        self.scheduler.weight_version = weight_version
        model = model.to(self.device, self.dtype)
        if config.prepack_weights and self.device.type == "cpu":
            prepack(model)
        self.runner = ModelRunner(
            model,
            config.num_kv_blocks,
            config.block_size,
            self.device,
            config.seed,
        )
        self._host_weights: dict[str, torch.Tensor] | None = None
        self._asleep = False
        self._stats = EngineStats()

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_model_config(
        cls, cfg: ModelConfig, config: EngineConfig | None = None, seed: int = 0, **kw
    ) -> LLMEngine:
        """An engine over a randomly initialized model (tests, demos)."""
        return cls(build_model(cfg, seed=seed), config, **kw)

    @classmethod
    def from_folder(cls, folder: str | Path, config: EngineConfig | None = None, **kw) -> LLMEngine:
        """An engine over a Hugging Face model folder (config.json + *.safetensors)."""
        return cls(load_model(folder), config, **kw)

    @property
    def model(self) -> DecoderForCausalLM:
        return self.runner.model

    @property
    def role(self) -> Role:
        return self.scheduler.role

    # -- requests -------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request; invalid input raises ``RequestError`` and leaves the engine unchanged."""
        self._check_awake()
        vocab = self.model_config.vocab_size
        ids = request.prompt_token_ids
        if not isinstance(ids, list) or not ids:
            raise RequestError(
                f"request {request.request_id!r}: prompt_token_ids must be a non-empty list of ints"
            )
        for i, tok in enumerate(ids):
            if not isinstance(tok, int) or isinstance(tok, bool) or not (0 <= tok < vocab):
                raise RequestError(
                    f"request {request.request_id!r}: token {tok!r} at position {i} is outside the "
                    f"vocabulary [0, {vocab})"
                )
        request.sampling.validate(vocab)
        self.scheduler.add(Sequence(request, 0, self.clock()))

    def step(self) -> list[RequestOutput]:
        """Run one iteration; return the requests that finished in it."""
        self._check_awake()
        t0 = time.perf_counter()
        out = self.scheduler.schedule(self.clock())
        t1 = time.perf_counter()
        tokens: list[int] = []
        logprobs: list[float] = []
        if not out.is_empty:
            tokens, logprobs = self.runner.execute(out)
        t2 = time.perf_counter()
        finished = self.scheduler.postprocess(
            out, tokens, logprobs, self.weight_version, self.clock()
        )
        t3 = time.perf_counter()
        if not out.is_empty:
            s = self._stats
            s.iterations += 1
            s.prefill_tokens += sum(c.num_tokens for c in out.prefills)
            s.decode_tokens += len(out.decodes)
            s.scheduler_time += (t1 - t0) + (t3 - t2)
            s.model_time += t2 - t1
            if self.on_iteration is not None:
                self.on_iteration(out, t3 - t0)
        return finished

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def run(self, max_steps: int | None = None) -> list[RequestOutput]:
        """Step until every queued request finished; return their outputs in finish order."""
        outputs: list[RequestOutput] = []
        steps = 0
        while self.scheduler.has_work():
            outputs.extend(self.step())
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        return outputs

    def generate(self, requests: list[Request]) -> dict[str, RequestOutput]:
        """Add requests, run to completion, return outputs by request id. If any request is
        invalid none stays queued: the error names it and the engine is as before."""
        added: list[str] = []
        try:
            for r in requests:
                self.add_request(r)
                added.append(r.request_id)
        except Exception:
            for request_id in added:  # not yet scheduled: nothing computed is lost
                self.scheduler.abort(request_id)
            raise
        return {o.request_id: o for o in self.run()}

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and return its partial output (None if not in flight)."""
        return self.scheduler.abort(request_id)

    def abort_all(self) -> list[RequestOutput]:
        ids = [s.request_id for s in list(self.scheduler.running) + list(self.scheduler.waiting)]
        return [o for rid in ids if (o := self.abort(rid)) is not None]

    # -- sessions and KV transfer ---------------------------------------------------
    def session_length(self, session_id: str) -> int:
        """Tokens of the session whose KV this engine holds pinned."""
        return self.scheduler.session_length(session_id)

    def match_session(self, session_id: str, token_ids: list[int]) -> int:
        """Keep the longest block-aligned prefix of the session's pinned KV that
        ``token_ids`` starts with, drop the rest; return its length (see ``Scheduler``)."""
        return self.scheduler.match_session(session_id, token_ids)

    def release_session(self, session_id: str) -> bool:
        return self.scheduler.release_session(session_id)

    def export_kv(self, session_id: str, start: int = 0, end: int | None = None) -> KVChunk:
        """The KV of a pinned session's tokens ``[start, end)`` (default: all it holds)."""
        self._check_awake()
        seq = self.scheduler.sessions.get(session_id)
        if seq is None:
            raise KVTransferError(f"engine holds no pinned KV for session {session_id!r}")
        held = seq.num_computed_tokens
        end = held if end is None else end
        if not (0 <= start < end <= held):
            raise KVTransferError(
                f"session {session_id!r}: range [{start}, {end}) is not within the {held} tokens held"
            )
        kv = self.runner.read_kv(seq, start, end)
        return KVChunk(
            model_id=self.model_id,
            dtype=self.config.dtype,  # the arrays carry it as float32 (numpy has no bfloat16)
            block_size=self.config.block_size,
            weight_version=self.weight_version,
            session_id=session_id,
            start=start,
            end=end,
            token_ids=tuple(seq.token_ids[start:end]),
            prefix_digest=token_digest(seq.token_ids[:start]),
            keys=kv[:, 0].float().cpu().numpy(),
            values=kv[:, 1].float().cpu().numpy(),
            cacheable=seq.cacheable,
            kv_version=seq.kv_version,
        )

    def import_kv(self, chunk: KVChunk) -> int:
        """Append a chunk to the KV this engine holds for its session; return tokens added.

        The chunk may overlap what is held (the overlap's token ids must agree; the held
        KV is kept). Anything inconsistent raises ``KVTransferError`` and changes nothing.
        """
        self._check_awake()
        chunk.validate_shape()
        cfg = self.model_config
        sid = chunk.session_id
        if chunk.model_id != self.model_id:
            raise KVTransferError(
                f"KV chunk of session {sid!r} is for model {chunk.model_id!r}, this engine serves {self.model_id!r}"
            )
        if chunk.dtype != self.config.dtype or chunk.keys.dtype.name != "float32":
            raise KVTransferError(
                f"KV chunk of session {sid!r} has dtype {chunk.dtype!r}/{chunk.keys.dtype}, this "
                f"engine stores {self.config.dtype} (carried as float32 arrays)"
            )
        if chunk.weight_version != self.weight_version:
            raise KVTransferError(
                f"KV chunk of session {sid!r} was computed with weight version {chunk.weight_version}, "
                f"this engine runs version {self.weight_version}"
            )
        if chunk.oldest_version > chunk.weight_version:
            raise KVTransferError(
                f"KV chunk of session {sid!r} claims KV of weights v{chunk.oldest_version}, "
                f"newer than its exporter's v{chunk.weight_version}"
            )
        expected = (cfg.num_hidden_layers, chunk.num_tokens, cfg.num_key_value_heads, cfg.head_dim)
        if chunk.keys.shape != expected:
            raise KVTransferError(
                f"KV chunk of session {sid!r} has shape {chunk.keys.shape}, expected {expected}"
            )
        bad = next((t for t in chunk.token_ids if not 0 <= t < cfg.vocab_size), None)
        if bad is not None:
            raise KVTransferError(
                f"KV chunk of session {sid!r} holds token id {bad}, outside the vocabulary "
                f"[0, {cfg.vocab_size})"
            )
        if chunk.end >= self.scheduler.config.max_model_len:
            raise KVTransferError(
                f"KV chunk of session {sid!r} ends at {chunk.end}, beyond max_model_len"
            )
        seq, overlap = self.scheduler.import_session(
            sid,
            chunk.start,
            chunk.token_ids,
            chunk.prefix_digest,
            self.clock(),
            chunk.cacheable,
            chunk.oldest_version,
        )
        if overlap >= chunk.num_tokens:
            return 0
        kv = np.stack([chunk.keys[:, overlap:], chunk.values[:, overlap:]], axis=1)
        self.runner.write_kv(seq, chunk.start + overlap, torch.from_numpy(kv))
        return chunk.num_tokens - overlap

    # -- roles ----------------------------------------------------------------------
    def set_role(self, role: Role, in_flight: InFlight = InFlight.DRAIN) -> list[RequestOutput]:
        """Switch to ``role``. In-flight work the new role cannot run is drained (finished in
        the old role) or handed back (aborted, partial outputs returned). A sleeping engine
        has nothing in flight and may switch too: the intra-scale toggle sets a borrowed
        worker's role before it restores the worker's device state."""
        role, in_flight = Role(role), InFlight(in_flight)
        outputs: list[RequestOutput] = []
        if in_flight is InFlight.HAND_BACK:
            outputs = self.scheduler.hand_back(self.scheduler.incompatible_with(role))
        else:
            while self.scheduler.incompatible_with(role):
                outputs.extend(self.step())
        self.scheduler.config.role = role
        return outputs

    # -- device state ---------------------------------------------------------------
    @property
    def asleep(self) -> bool:
        return self._asleep

    def sleep(self, keep_weights_on_host: bool = True) -> None:
        """Release device state: KV cache (and pinned sessions, prefix cache) and weights.

        With ``keep_weights_on_host`` the weights are copied to host memory and ``wake``
        restores them; otherwise ``load_weights`` must run before ``wake``. Requires no
        request in flight (abort or drain first).
        """
        self._check_awake()
        if self.scheduler.has_work():
            raise EngineStateError(
                f"cannot sleep with {self.scheduler.num_requests()} requests in flight; abort or drain them first"
            )
        for sid in list(self.scheduler.sessions):
            self.scheduler.release_session(sid)
        self.blocks.reset_prefix_cache()
        self.runner.free_kv_cache()
        params = dict(self.model.named_parameters())
        if keep_weights_on_host:
            self._host_weights = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}
        else:
            self._host_weights = None
        for p in params.values():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        for module in self.model.modules():
            if isinstance(module, Linear):
                module.drop_packed()  # rebuilt from the restored weights after wake
        self._asleep = True

    def wake(self) -> None:
        """Restore the weights and reallocate the KV cache."""
        if not self._asleep:
            return
        if self._host_weights is None:
            raise EngineStateError(
                "weights were discarded at sleep; call load_weights(state_dict, version) first"
            )
        self._restore_parameters(self._host_weights)
        self._host_weights = None
        self.runner.allocate_kv_cache()
        self._asleep = False

    def load_weights(
        self, state_dict: Mapping[str, torch.Tensor], version: int, in_flight: bool = False
    ) -> None:
        """Swap in new weights tagged ``version``; the prefix cache and pinned sessions are
        dropped. Works asleep (the weights become the ones ``wake`` restores) or awake with
        no request in flight. With ``in_flight`` the update lands between two iterations
        while requests run (an RL weight update mid-rollout): their KV and the pinned
        sessions are kept and they continue under the new weights, their later tokens
        tagged ``version``; the prefix cache is emptied and the kept KV never enters it
        again, so no later request starts from KV the old weights computed. A bad state dict
        raises and changes nothing."""
        if not isinstance(version, int) or version < 0:
            raise RequestError(f"weight version must be a non-negative int, got {version!r}")
        if in_flight and not self._asleep:
            load_state_dict(self.model, state_dict, source=f"weights v{version}")
            self.weight_version = version
            # Sessions continue on their KV; no new request gets the old weights' KV.
            self.scheduler.new_weights(version, self.config.flush_cache_on_weight_update)
            return
        if self.scheduler.has_work():
            raise EngineStateError(
                f"cannot load weights with {self.scheduler.num_requests()} requests in flight; abort or drain first"
            )
        if self._asleep:
            # Validate against a shape-only copy of the model, then keep on host for wake.
            probe = type(self.model)(self.model_config)
            load_state_dict(probe, state_dict, source=f"weights v{version}")
            self._host_weights = {n: p.detach().clone() for n, p in probe.named_parameters()}
        else:
            load_state_dict(self.model, state_dict, source=f"weights v{version}")
            self.scheduler.new_weights(version, flush=True)  # idle: sessions and cache go
        self.weight_version = self.scheduler.weight_version = version

    def _restore_parameters(self, weights: Mapping[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.data = weights[name].to(self.device, self.dtype)  # a probe's are float32
        if self.model_config.tie_word_embeddings:
            self.model.lm_head.weight = self.model.model.embed_tokens.weight

    def _check_awake(self) -> None:
        if self._asleep:
            raise EngineStateError("engine is asleep; call wake() first")

    # -- telemetry ------------------------------------------------------------------
    def stats(self) -> EngineStats:
        s = self._stats
        s.preemptions = self.scheduler.num_preemptions
        s.cache_hit_tokens = self.blocks.cache_hits
        s.cache_query_tokens = self.blocks.cache_queries
        s.free_blocks = self.blocks.num_free_blocks
        s.num_blocks = self.blocks.num_blocks
        s.pinned_sessions = len(self.scheduler.sessions)
        s.running = len(self.scheduler.running)
        s.waiting = len(self.scheduler.waiting)
        s.weight_version = self.weight_version
        s.role = self.role.value
        s.asleep = self._asleep
        return s
