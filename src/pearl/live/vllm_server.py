"""vLLM as a rollout engine (``rollout.backend: vllm``): every ``RolloutEngine`` part,
run in one worker process.

``VllmServer`` has ``EngineServer``'s methods, so ``pearl.live.worker`` runs either as a Ray
actor: each turn is one vLLM request for the turn's whole context (vLLM's prefix cache keeps
the earlier turns' KV), sampled with the turn's settings, returning the sampled tokens'
log-probabilities after temperature (``logprobs_mode=processed_logprobs``: what the trainer's
importance ratio compares with), and cut short by ``abort_all`` with its partial output. New
weights go through vLLM's own in-place reload (each model's ``load_weights``, then its
kernels' repacking) inside vLLM's worker (``VllmWorkerExtension``, named in the engine's
``worker_extension_cls``), with turns in flight: the scheduler pauses, keeping them, and
they recompute their KV under the new weights; each token's version comes from vLLM's own
per-token weight-version labels. Borrowing's release and restore are vLLM's sleep (level
1) and wake (weights, then KV cache); on the CPU build they free nothing (vLLM's CPU worker
ignores sleep) but pause and resume the engine as on a GPU. Prefill-decode disaggregation
goes through PEARL's KV connector (``pearl.live.vllm_kv_connector``, loaded by vLLM by
path): in the prefill role a turn runs to its first token and the connector saves the
prompt's KV, which ``export_kv`` cuts into ``KVChunk``s by token range; in the decode role
``import_kv`` appends chunks to the session's KV held here and the turn's request loads
what vLLM's prefix cache lacks of it. Its iterations (prefill tokens, decoding requests,
seconds) come from vLLM's per-iteration details through a stat logger of ours and feed the
runtime tracker, so the decision model refits on vLLM as on ours. vLLM is imported only in
the worker process; it is installed in its own venv (``scripts/vllm_env.sh``).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from pearl.control.interfaces import TurnOutput, TurnRequest, TurnTelemetry, VersionSpan
from pearl.control.rollout_engine import EngineCapabilities
from pearl.engine.config import EngineConfig
from pearl.engine.kv_transfer import KVChunk, token_digest
from pearl.errors import EngineStateError, KVPrefixMismatch, KVTransferError
from pearl.live.cluster import actor_location
from pearl.live.server import ModelSpec
from pearl.live.shared_folder import OwnedFolder, remove_abandoned
from pearl.live.vllm_session_kv import SessionKV, model_identity
from pearl.live.vllm_setup import engine_args

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class VllmServer:
    """Serves one vLLM ``AsyncLLM`` to the control plane."""

    capabilities = EngineCapabilities.full("vllm")

    def __init__(
        self,
        worker_id: str,
        model: ModelSpec,
        engine_config: EngineConfig,
        torch_threads: int = 1,
    ) -> None:
        if model.folder is None:
            raise ValueError("the vLLM backend loads a model folder (ModelSpec.folder)")
        try:
            from vllm.v1.engine.async_llm import AsyncLLM  # optional: vLLM backend
        except ImportError as exc:
            raise RuntimeError(
                "rollout.backend=vllm needs vLLM in this environment: run "
                "`bash scripts/vllm_env.sh` and start pearl from .venv-vllm "
                f"({type(exc).__name__}: {exc})"
            ) from None
        self.worker_id = worker_id
        self.version = 0
        self.role = str(getattr(engine_config.role, "value", engine_config.role))
        self.model_id, self._geometry = model_identity(model.folder)
        self._dtype = engine_config.dtype
        self._block_size = engine_config.block_size
        self._file_ids = itertools.count()
        self._prefilled: dict[str, SessionKV] = {}  # prefill role: each session's last prompt
        self._held: dict[str, SessionKV] = {}  # decode role: each session's imported KV
        self._in_use: collections.Counter[str] = collections.Counter()  # files turns use
        self._doomed: set[str] = set()  # files to remove once the turns using them end
        args = engine_args(model.folder, engine_config)
        self._iteration_log: list[tuple[list[tuple[int, int]], list[int], float]] | None = None
        # With stats on, vLLM adds its console logger (throughput every few seconds) only
        # when its loggers module logs at INFO: the run's own log says what matters.
        logging.getLogger("vllm.v1.metrics.loggers").setLevel(logging.WARNING)
        self._kv_folder = _kv_folder(worker_id)
        self._kv_dir = self._kv_folder.path
        try:
            with _scratch_in(self._kv_dir):
                self.engine = AsyncLLM.from_engine_args(args, stat_loggers=[self._iteration_logger])
        except BaseException:
            # No server will be shut down: the folder (and what the engine put in it) goes
            # now. Left, its lock would keep it for as long as this process lives.
            self._kv_folder.remove()
            raise
        self._block_size = self.engine.vllm_config.cache_config.block_size
        self._running: set[str] = set()
        self._contexts: dict[str, int] = {}  # running turns' contexts (prompt + streamed)
        self._finished: collections.deque[int] = collections.deque(maxlen=256)  # recent ones
        # Seconds this server's event loop spent on KV files (export_kv, import_kv).
        self._kv_file_s: collections.Counter[str] = collections.Counter()
        self._asleep = False
        self._pending: tuple[int, dict[str, Any]] | None = None  # weights received asleep

    def _iteration_logger(self, vllm_config: Any, engine_index: int = 0) -> Any:
        """vLLM's stat-logger factory: a ``StatLoggerBase`` that appends each engine
        iteration vLLM reports (``SchedulerStats.iteration_details``) to this server's log."""
        from vllm.v1.metrics.loggers import StatLoggerBase  # optional: vLLM backend

        server = self

        class IterationLogger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
                details = getattr(scheduler_stats, "iteration_details", None)
                if details is not None and not details.is_dummy:
                    server._log_iteration(details)

            def log_engine_initialized(self) -> None:
                pass

        return IterationLogger(vllm_config, engine_index)

    def _log_iteration(self, details: Any) -> None:
        """One vLLM iteration in our engine's log format. vLLM reports its prefill
        requests and their tokens in total (logged as equal chunks from position 0: their
        starts are not reported), its decoding requests by number and its seconds; each
        decode's context is estimated from this server's running turns (prompt plus the
        tokens streamed so far, the longest ones first), then from the turns finished most
        recently (vLLM may report an iteration after the outputs that ended its requests
        reached this process), then the shortest of those repeated (1 if none is known)."""
        if self._iteration_log is None:
            return
        chunks = details.num_ctx_requests
        prefill = []
        if details.num_ctx_tokens and chunks:
            share, extra = divmod(details.num_ctx_tokens, chunks)
            prefill = [(share + (i < extra), 0) for i in range(chunks)]
        n = details.num_generation_requests
        decodes = sorted(self._contexts.values(), reverse=True)[:n]
        decodes += list(itertools.islice(reversed(self._finished), n - len(decodes)))
        decodes += [min(decodes, default=1)] * (n - len(decodes))
        self._iteration_log.append((prefill, decodes, details.elapsed_ms / 1000.0))

    # -- turns ----------------------------------------------------------------------
    async def run_turn(self, turn: TurnRequest) -> TurnOutput:
        """Generate (colocated), prefill (prefill role: the first token, the prompt's KV
        kept for ``export_kv``) or decode (decode role: from the KV ``import_kv`` brought,
        vLLM computing only what it lacks) one turn."""
        from vllm.inputs import TokensPrompt  # optional: vLLM backend

        role = self.role
        submitted = time.monotonic()
        if self._asleep:
            # Released (lent back to the trainer): vLLM would queue it until a wake. Cut
            # short, the router resumes it where the topology now routes.
            return TurnOutput(turn.request_id, turn.session_id, [], [], "abort", self.version)
        kv, connector = self._connector_spec(turn, role)
        params = _sampling_params(turn, role, connector)
        prompt = TokensPrompt(prompt_token_ids=list(turn.token_ids))
        self._running.add(turn.request_id)
        self._contexts[turn.request_id] = len(turn.token_ids) + 1
        if kv is not None:
            self._in_use[kv.path] += 1  # vLLM's engine process reads or writes it meanwhile
        last = None
        first_token_at = None
        try:
            async for out in self.engine.generate(prompt, params, turn.request_id):
                last = out
                if out.outputs and out.outputs[0].token_ids:
                    first_token_at = first_token_at or time.monotonic()
                    n = len(turn.token_ids) + len(out.outputs[0].token_ids)
                    self._contexts[turn.request_id] = n
        finally:
            self._running.discard(turn.request_id)
            self._finished.append(self._contexts.pop(turn.request_id))
            if kv is not None:
                self._unpin(kv)
        tokens_out, logprobs, reason, cached, spans = _completion(turn.request_id, last)
        if role == "prefill" and reason == "length" and turn.max_new_tokens > 1:
            reason = "prefilled"  # the router moves its KV and decodes the rest elsewhere
        if role == "prefill" and kv is not None and self._prefilled.get(turn.session_id) is kv:
            if kv.saved() >= len(turn.token_ids):  # the connector wrote the prompt's rows
                kv.token_ids = list(turn.token_ids)
                if spans:  # weights landed meanwhile: the oldest KV the prompt depends on
                    kv.version = min(kv.version, spans[-1][2])
        return TurnOutput(
            turn.request_id,
            turn.session_id,
            tokens_out,
            logprobs,
            reason,
            spans[-1][1] if spans else self.version,
            TurnTelemetry(
                submitted_at=submitted,
                first_token_at=first_token_at,
                finished_at=time.monotonic(),
                prefill_tokens_computed=len(turn.token_ids) - cached,
                prefill_tokens_cached=cached,
                prefill_worker=self.worker_id if role != "decode" else None,
                decode_worker=self.worker_id if role != "prefill" else None,
            ),
            spans,
        )

    def _connector_spec(self, turn: TurnRequest, role: str) -> tuple[SessionKV | None, dict]:
        """The session's KV file this turn uses and what the connector does with it: in the
        prefill role, load what vLLM's prefix cache lacks of the rows the session's last
        prompt shares with this one (of the same weights: other weights' rows are dropped)
        and write the rows after them; in the decode role, load what the prefix cache lacks
        of the imported rows."""
        sid = turn.session_id
        if role == "prefill":
            kept = self._prefilled.get(sid)
            if kept is None or kept.version != self.version:
                if kept is not None:
                    self._discard(kept)
                kept = SessionKV(self._kv_file(), self._geometry, [], self.version)
                self._prefilled[sid] = kept
            shared = kept.matched(turn.token_ids)
            kept.truncate(shared)
            spec: dict[str, Any] = {"save": kept.path, "from": shared}
            if shared:  # vLLM's prefix cache holds whole blocks (128 tokens on CPU): the rest
                spec.update(load=kept.path, tokens=shared)  # of the shared rows comes from here
            return kept, spec
        held = self._held.get(sid) if role == "decode" else None
        tokens = held.matched(turn.token_ids) if held is not None else 0
        if held is None or not tokens:
            return None, {}
        return held, {"load": held.path, "tokens": tokens}

    def _kv_file(self) -> str:
        return os.path.join(self._kv_dir, f"{next(self._file_ids)}.kv")

    def _discard(self, kv: SessionKV) -> None:
        """Forget a session's KV file; removed at once, or when the turn using it ends."""
        if self._in_use[kv.path]:
            self._doomed.add(kv.path)
        else:
            kv.remove()

    def _unpin(self, kv: SessionKV) -> None:
        self._in_use[kv.path] -= 1
        if self._in_use[kv.path] <= 0:
            del self._in_use[kv.path]
            if kv.path in self._doomed:
                self._doomed.discard(kv.path)
                kv.remove()

    def _forget(self, table: dict[str, SessionKV], session_id: str | None = None) -> None:
        """Discard one session's KV of ``table`` (``_prefilled`` or ``_held``), or all."""
        for sid in [session_id] if session_id is not None else list(table):
            kv = table.pop(sid, None)
            if kv is not None:
                self._discard(kv)

    async def session_length(self, session_id: str) -> int:
        """Prefill role: the tokens of the session's last prompt (vLLM's prefix cache holds
        their full blocks); 0 otherwise."""
        kept = self._prefilled.get(session_id)
        return len(kept.token_ids) if kept is not None else 0

    async def match_session(self, session_id: str, token_ids: list[int]) -> int:
        """Decode role: keep the longest prefix of the session's imported KV that
        ``token_ids`` starts with, drop the rest; return its length."""
        held = self._held.get(session_id)
        if held is None:
            return 0
        held.truncate(held.matched(token_ids))
        return len(held.token_ids)

    async def release_session(self, session_id: str) -> None:
        self._forget(self._prefilled, session_id)
        self._forget(self._held, session_id)

    async def export_kv(self, session_id: str, start: int, end: int) -> KVChunk:
        """The KV of tokens ``[start, end)`` of the session's last prompt (prefill role)."""
        kept = self._prefilled.get(session_id)
        if kept is None:
            raise KVTransferError(f"worker {self.worker_id} holds no KV for session {session_id!r}")
        if not 0 <= start < end <= len(kept.token_ids):
            raise KVTransferError(
                f"session {session_id!r}: range [{start}, {end}) is not within the "
                f"{len(kept.token_ids)} tokens held"
            )
        t0 = time.perf_counter()
        keys, values = kept.read(start, end)
        self._kv_file_s["export"] += time.perf_counter() - t0
        return KVChunk(
            model_id=self.model_id,
            dtype=self._dtype,
            block_size=self._block_size,
            weight_version=self.version,
            session_id=session_id,
            start=start,
            end=end,
            token_ids=tuple(kept.token_ids[start:end]),
            prefix_digest=token_digest(kept.token_ids[:start]),
            keys=keys,
            values=values,
            cacheable=kept.version == self.version,
            kv_version=kept.version,
        )

    async def import_kv(self, chunk: KVChunk) -> tuple[int, int]:
        """Append a chunk to the KV held for its session (decode role); returns (tokens
        added, bytes received). KV of weights other than this worker's is dropped, not
        held: vLLM never decodes on KV of other weights, so the decode recomputes it."""
        chunk.validate_shape()
        sid = chunk.session_id
        if chunk.model_id != self.model_id:
            raise KVTransferError(
                f"KV chunk of session {sid!r} is for model {chunk.model_id!r}, worker "
                f"{self.worker_id} serves {self.model_id!r}"
            )
        if chunk.dtype != self._dtype or chunk.keys.dtype != np.float32:
            raise KVTransferError(
                f"KV chunk of session {sid!r} has dtype {chunk.dtype!r}/{chunk.keys.dtype}, "
                f"worker {self.worker_id} runs {self._dtype} (carried as float32 arrays)"
            )
        expected = (self._geometry[0], chunk.num_tokens, *self._geometry[1:])
        if chunk.keys.shape != expected:
            raise KVTransferError(
                f"KV chunk of session {sid!r} has shape {chunk.keys.shape}, expected {expected}"
            )
        held = self._held.get(sid)
        if held is not None and held.version != self.version:
            self._forget(self._held, sid)  # of older weights: recomputed, never decoded on
            held = None
        if chunk.oldest_version != self.version:
            self._forget(self._held, sid)
            return 0, chunk.nbytes
        have = len(held.token_ids) if held is not None else 0
        prefix = held.token_ids[: chunk.start] if held is not None else []
        if chunk.start > have or token_digest(prefix) != chunk.prefix_digest:
            raise KVPrefixMismatch(
                f"KV chunk of session {sid!r} starts at token {chunk.start}; worker "
                f"{self.worker_id} holds {have} tokens that it does not continue"
            )
        overlap = have - chunk.start
        if held is not None and list(chunk.token_ids[:overlap]) != held.token_ids[chunk.start :]:
            raise KVPrefixMismatch(
                f"KV chunk of session {sid!r} disagrees with the tokens held from {chunk.start}"
            )
        if overlap >= chunk.num_tokens:
            return 0, chunk.nbytes
        t0 = time.perf_counter()
        if held is None:  # the chunk starts at 0 (checked above)
            held = self._held[sid] = SessionKV(self._kv_file(), self._geometry, [], self.version)
        held.append(
            list(chunk.token_ids[overlap:]), chunk.keys[:, overlap:], chunk.values[:, overlap:]
        )
        self._kv_file_s["import"] += time.perf_counter() - t0
        return chunk.num_tokens - overlap, chunk.nbytes

    async def set_role(self, role: str) -> list[TurnOutput]:
        """Switch role; turns in flight are aborted (each ``run_turn`` returns its partial
        output, which the router resumes on the new topology) and the KV kept for the old
        role is dropped."""
        if role not in ("colocated", "prefill", "decode"):
            raise ValueError(f"unknown role {role!r}: colocated, prefill or decode")
        if role != self.role:
            await self.abort_all()
            self._forget(self._prefilled)
            self._forget(self._held)
            self.role = role
        return []

    async def abort_all(self) -> list[TurnOutput]:
        """Abort every turn in flight; each ``run_turn`` returns its partial output."""
        running = list(self._running)
        if running:
            await self.engine.abort(running)
        return []

    async def release_device(self) -> None:
        """Free the worker's device memory between borrowing rounds: vLLM's sleep level 1
        (KV cache discarded, weights offloaded to host memory, so a wake with no newer
        weights serves at once; a wake with newer ones reloads them over the offloaded
        copy). It needs ``enable_sleep_mode`` on GPUs; vLLM's CPU worker frees nothing (its
        sleep is a no-op: only the scheduler pauses and the caches clear), which is what
        this CPU build can do: the slot lent here is the trainer's core, not memory. Turns
        in flight are aborted first and one arriving asleep comes back at once, cut short
        (the router resumes them where it now routes): vLLM would keep them queued until a
        wake, which a give-back never brings."""
        if not self._asleep:
            self._asleep = True  # turns arriving from now on come back cut short
            await self.abort_all()
            await self.engine.sleep(level=1)
            await self.abort_all()  # one whose request reached vLLM after the first abort

    async def restore_device(self) -> None:
        """Wake from ``release_device``: the weights first, the newest weights installed
        if some arrived while asleep, then the KV cache (vLLM resumes scheduling once all
        its memory is back)."""
        if not self._asleep:
            return
        await self.engine.wake_up(tags=["weights"])
        while self._pending is not None:  # newer ones may arrive during an install
            version, arrays = self._pending
            self._pending = None
            await self._install(version, arrays)
        await self.engine.wake_up(tags=["kv_cache"])
        if await self.engine.is_sleeping():
            await self.engine.wake_up()  # whatever else vLLM put to sleep
        self._asleep = False

    async def load_weights(self, weights: tuple[int, dict[str, Any]]) -> int:
        """Install the trainer's ``(version, numpy weights)`` with turns in flight: vLLM's
        scheduler is paused (``mode="keep"``: requests stay queued), the weights reloaded,
        every running request reset (preempted: it recomputes its KV under the new weights
        when it resumes, so unlike our engine no token is sampled on KV of older weights),
        the prefix cache emptied and vLLM's weight-version label set (it tags each output
        token with the label of the step that sampled it), then generation resumes. While
        asleep (``release_device``) they are kept and installed at the wake."""
        version, arrays = weights
        if self._asleep:
            self._pending = (version, arrays)
            self.version = version
            return version
        await self.engine.pause_generation(mode="keep", clear_cache=False)
        try:
            await self._install(version, arrays)
        finally:
            await self.engine.resume_generation()
        return version

    async def _install(self, version: int, arrays: dict[str, Any]) -> None:
        """Reload the weights in vLLM's worker, reset what holds KV of the old ones, label
        the version (the scheduler is paused or asleep)."""
        from safetensors.numpy import save_file  # live extra

        # Handed to vLLM's worker process as a file (its RPC carries small messages, not a
        # model's tensors), in this server's KV folder: a worker killed mid-install leaves
        # it there, and the next server started on the host removes the folder.
        with tempfile.TemporaryDirectory(prefix="weights-", dir=self._kv_dir) as folder:
            path = os.path.join(folder, f"v{version}.safetensors")
            save_file({n: a for n, a in arrays.items()}, path)
            await self.engine.collective_rpc("pearl_load_weights", args=(path,))
        if not await self.engine.reset_prefix_cache(reset_running_requests=True):
            raise EngineStateError(
                f"vLLM did not reset its prefix cache after weights v{version}: later "
                "requests would start from KV of the old weights"
            )
        await self.engine.update_weight_version(str(version))
        self.version = version
        self._forget(self._held)  # imported KV of the old weights: decodes recompute it

    async def stats(self) -> dict[str, Any]:
        """What runs and how vLLM was sized (its scheduler's token budget and sequence
        limit, its KV blocks): what a simulated twin of this worker copies."""
        config = self.engine.vllm_config
        return {
            "backend": "vllm",
            "running": len(self._running),
            "weight_version": self.version,
            "role": self.role,
            "block_size": config.cache_config.block_size,
            "num_kv_blocks": config.cache_config.num_gpu_blocks,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "kv_file_s": dict(self._kv_file_s),
        }

    async def ping(self) -> str:
        return self.worker_id

    async def where(self) -> dict:

        return actor_location()

    async def log_iterations(self, enabled: bool = True) -> list:
        """Start (or stop) logging vLLM's iterations; returns the log so far (the format of
        ``EngineServer.log_iterations``, decode contexts estimated: ``_log_iteration``)."""
        log, self._iteration_log = self._iteration_log or [], [] if enabled else None
        return log

    def shutdown(self) -> None:
        self.engine.shutdown()
        self._kv_folder.remove()


KV_FOLDER_PREFIX = "pearl-kv-"


def _kv_folder(worker_id: str, where: str | None = None) -> OwnedFolder:
    """A new folder for the files that cross between this process and vLLM's engine
    process (sessions' KV, weights being installed, its IPC sockets), in memory-backed
    /dev/shm where there is one with room, locked by this process while it lives. Folders
    left by servers that are gone (killed workers never shut down) are removed first, so
    restarted workers do not fill the host's shared memory; a live server's, in this
    container or another sharing /dev/shm, is kept (``pearl.live.shared_folder``)."""
    where = where or _shared_dir()
    remove_abandoned(where, KV_FOLDER_PREFIX)
    return OwnedFolder.create(where, KV_FOLDER_PREFIX, worker_id)


@contextlib.contextmanager
def _scratch_in(folder: str) -> Iterator[None]:
    """While vLLM's engine starts: its IPC sockets (``VLLM_RPC_BASE_PATH``) and its process
    group's file store (``tempfile``, in the engine process it starts now) go in
    ``folder``, which goes with the server (``shutdown``, or the next server once this
    process is gone), instead of the temporary directory, where a killed engine left them."""
    names = ("TMPDIR", "VLLM_RPC_BASE_PATH")
    saved, saved_tempdir = {n: os.environ.get(n) for n in names}, tempfile.tempdir
    os.environ.update(dict.fromkeys(names, folder))
    tempfile.tempdir = None  # read TMPDIR again (a forked engine process inherits this)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tempfile.tempdir = saved_tempdir


SHARED_MIN_FREE_BYTES = 4 << 30  # sessions' KV files and a model's weights in transit


def _shared_dir(where: str = "/dev/shm") -> str:
    """Memory-backed /dev/shm where there is one with room (containers often mount 64 MB),
    else the temporary directory."""
    if os.path.isdir(where) and shutil.disk_usage(where).free >= SHARED_MIN_FREE_BYTES:
        return where
    return tempfile.gettempdir()


def sampled_logprobs(request_id: str, tokens: list[int], logprobs: Any) -> list[float]:
    """Each sampled token's log-probability from vLLM's per-position ``{token: Logprob}``
    maps; a token missing from its map (or a missing map) raises: a behaviour
    log-probability is never invented."""
    positions = list(logprobs or [])
    if len(positions) != len(tokens):
        raise EngineStateError(
            f"vLLM returned {len(positions)} log-probability entries for the {len(tokens)} "
            f"tokens of request {request_id!r}"
        )
    out = []
    for i, (token, entry) in enumerate(zip(tokens, positions, strict=True)):
        if not entry or token not in entry:
            raise EngineStateError(
                f"vLLM returned no log-probability for sampled token {token} at position {i} "
                f"of request {request_id!r}"
            )
        out.append(float(entry[token].logprob))
    return out


def version_spans(spans: Any) -> tuple[VersionSpan, ...]:
    """vLLM's per-token ``WeightVersionSpan`` labels as ``VersionSpan``s. vLLM recomputes a
    running request's KV after each update (``load_weights``), so a token's KV is always
    its sampling weights' (``kv == weights``). Its label before the first update is
    ``"default"``: the weights the server started with, version 0."""
    out = []
    for span in spans or ():
        if span.end <= span.start:
            continue
        version = 0 if span.version == "default" else int(span.version)
        out.append((span.start, version, version))
    return tuple(out)


def _sampling_params(turn: TurnRequest, role: str, connector: dict):
    """vLLM's sampling parameters for a turn: one token in the prefill role, the sampled
    token's log-probability, no detokenizing, and what the KV connector does with it."""
    from vllm import SamplingParams  # optional: vLLM backend

    return SamplingParams(
        temperature=turn.temperature,
        top_p=turn.top_p,
        top_k=turn.top_k if turn.top_k > 0 else -1,
        seed=turn.seed,
        max_tokens=1 if role == "prefill" else turn.max_new_tokens,
        ignore_eos=turn.ignore_eos,
        stop_token_ids=list(turn.stop_token_ids),
        logprobs=0,  # the sampled token's
        detokenize=False,
        extra_args={"kv_transfer_params": {"pearl": connector}} if connector else None,
    )


def _completion(
    request_id: str, last
) -> tuple[list[int], list[float], str, int, tuple[VersionSpan, ...]]:
    """What vLLM's last output of a request says: its tokens, their log-probabilities,
    the finish reason (``abort`` when it produced nothing), the prompt tokens served from
    the prefix cache, and the weights versions that sampled the tokens."""
    if last is None or not last.outputs:
        return [], [], "abort", 0, ()
    completion = last.outputs[0]
    tokens = list(completion.token_ids)
    return (
        tokens,
        sampled_logprobs(request_id, tokens, completion.logprobs),
        _FINISH.get(str(completion.finish_reason), "abort"),
        last.num_cached_tokens or 0,
        version_spans(completion.weight_versions),
    )
