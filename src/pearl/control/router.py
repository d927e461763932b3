"""Dispatch turns to rollout workers with session affinity.

Colocated: a session's turns go to one worker (which holds its KV) until that worker
leaves or changes role. Disaggregated: the turn is prefilled on a prefill worker
(sticky too: it holds the session's earlier context, so later turns are appends),
its new KV is moved to the session's decode worker, which decodes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict

from pearl.control.interfaces import KVMover, RolloutWorker, TurnOutput, TurnRequest, WorkerRole
from pearl.errors import EngineStateError, KVPrefixMismatch, KVTransferError

INTERRUPTED = ("abort", "handed_back")  # finish reasons of a turn cut short by a topology change
REBALANCE_GAP = 2  # sessions more than the least-loaded worker before a session moves
RETRY_BACKOFF_S = (0.01, 1.0)  # first and largest wait between attempts to find KV memory


class NoWorkerAvailable(RuntimeError):
    """The router has no active worker for the role a turn needs."""


class Router:
    """Routes turns over the current topology; ``set_topology`` changes it between turns."""

    def __init__(
        self,
        kv_mover: KVMover | None = None,
        max_wait_s: float = 3600.0,
        restart_interrupted: bool = False,
    ) -> None:
        self.kv_mover = kv_mover
        # An interrupted turn resumes from the tokens it generated (False) or is re-issued
        # from its start, its partial output dropped (True: ROLL's re-issue after an abort).
        self.restart_interrupted = restart_interrupted
        self.tokens_discarded = 0
        # While a reconfiguration leaves no worker for a role, turns wait this long for one.
        self.max_wait_s = max_wait_s
        self._topology_changed = asyncio.Event()
        self.colocated: list[RolloutWorker] = []
        self.prefill: list[RolloutWorker] = []
        self.decode: list[RolloutWorker] = []
        self._home: dict[tuple[WorkerRole, str], RolloutWorker] = {}  # (role, session) -> worker
        self._sessions_on: dict[str, int] = defaultdict(int)  # worker id -> sessions homed there
        # The least sessions homed on a worker of each pool, valid while no count changed
        # (counts change twice a trajectory; a turn asks: O(workers) per turn otherwise).
        self._least: dict[WorkerRole, int] = {}
        self._inflight_prefill_tokens: dict[str, int] = defaultdict(int)
        self.turns_routed = 0
        self.transfer_retries = 0
        self.turns_resumed = 0
        self.sessions_moved = 0

    @property
    def disaggregated(self) -> bool:
        return bool(self.prefill)

    def set_topology(
        self,
        colocated: list[RolloutWorker] | None = None,
        prefill: list[RolloutWorker] | None = None,
        decode: list[RolloutWorker] | None = None,
    ) -> None:
        """Replace the set of active workers per role; homes on departed workers are forgotten."""
        colocated, prefill, decode = colocated or [], prefill or [], decode or []
        if bool(prefill) != bool(decode):
            raise ValueError(
                "a disaggregated topology needs at least one prefill and one decode worker"
            )
        if colocated and prefill:
            raise ValueError("a topology is either colocated or disaggregated, not both")
        if prefill and self.kv_mover is None:
            raise ValueError("a disaggregated topology needs a KV mover")
        self.colocated, self.prefill, self.decode = list(colocated), list(prefill), list(decode)
        self._topology_changed.set()
        self._topology_changed = asyncio.Event()
        active = {
            WorkerRole.COLOCATED: {w.worker_id for w in colocated},
            WorkerRole.PREFILL: {w.worker_id for w in prefill},
            WorkerRole.DECODE: {w.worker_id for w in decode},
        }
        for key, worker in list(self._home.items()):
            if worker.worker_id not in active[key[0]]:
                del self._home[key]
                self._sessions_on[worker.worker_id] -= 1
        self._least.clear()

    def home_of(self, session_id: str, role: WorkerRole) -> RolloutWorker | None:
        return self._home.get((role, session_id))

    def _pick(self, role: WorkerRole, session_id: str, pool: list[RolloutWorker]) -> RolloutWorker:
        worker = self._home.get((role, session_id))
        if worker is not None:
            if not self._overloaded(role, worker, pool):
                return worker
            # Workers joined (or others are far less loaded): this session moves at a turn
            # boundary, trading its cached KV for balance. Its old KV ages out of that cache.
            del self._home[(role, session_id)]
            self._sessions_on[worker.worker_id] -= 1
            self._least.clear()
            self.sessions_moved += 1
        if not pool:
            raise NoWorkerAvailable(f"no active {role.value} worker for session {session_id!r}")

        def load(w: RolloutWorker) -> tuple[int, int]:
            # Prefill: least queued prefill work; decode/colocated: fewest sessions homed.
            queued = self._inflight_prefill_tokens[w.worker_id] if role is WorkerRole.PREFILL else 0
            return queued, self._sessions_on[w.worker_id]

        worker = min(pool, key=load)  # ties: the first in pool order, so runs are deterministic
        self._home[(role, session_id)] = worker
        self._sessions_on[worker.worker_id] += 1
        self._least.clear()
        return worker

    def _overloaded(self, role: WorkerRole, home: RolloutWorker, pool: list[RolloutWorker]) -> bool:
        """True if ``home`` holds at least ``REBALANCE_GAP`` more sessions than the least
        loaded worker of its pool (how sessions reach workers that joined mid-batch)."""
        if len(pool) < 2:
            return False
        least = self._least.get(role)
        if least is None:
            least = self._least[role] = min(self._sessions_on[w.worker_id] for w in pool)
        return self._sessions_on[home.worker_id] - least >= REBALANCE_GAP

    async def run_turn(self, turn: TurnRequest) -> TurnOutput:
        """Run one turn on the current topology and return its output.

        If the worker running it is shrunk away or changes role mid-turn (its output comes
        back aborted or handed back), the turn continues on the current topology from the
        tokens already generated: no generated token is lost, only the context is
        re-prefilled (mostly from the prefix cache if the session stays on a worker).
        """
        self.turns_routed += 1
        out = await self._run_once(turn)
        resumed = 0
        while self.restart_interrupted and out.finish_reason in INTERRUPTED:
            resumed += 1
            self.turns_resumed += 1
            self.tokens_discarded += len(out.token_ids)
            submitted = out.telemetry.submitted_at
            out = await self._run_once(
                dataclasses.replace(turn, request_id=f"{turn.request_id}/restart{resumed}")
            )
            out.telemetry.submitted_at = submitted
            out = dataclasses.replace(out, request_id=turn.request_id)
        while out.finish_reason in INTERRUPTED and len(out.token_ids) < turn.max_new_tokens:
            resumed += 1
            self.turns_resumed += 1
            rest = await self._run_once(
                dataclasses.replace(
                    turn,
                    request_id=f"{turn.request_id}/resume{resumed}",
                    token_ids=turn.token_ids + out.token_ids,
                    max_new_tokens=turn.max_new_tokens - len(out.token_ids),
                )
            )
            rest.telemetry.submitted_at = out.telemetry.submitted_at
            rest.telemetry.first_token_at = (
                out.telemetry.first_token_at or rest.telemetry.first_token_at
            )
            rest.telemetry.preemptions += out.telemetry.preemptions
            out = out.joined(rest, request_id=turn.request_id, session_id=turn.session_id)
        return out

    async def _wait_for_workers(self, session_id: str) -> None:
        """Wait (up to ``max_wait_s``) while a reconfiguration leaves the topology empty."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while not (self.colocated or (self.prefill and self.decode)):
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise NoWorkerAvailable(f"no active rollout worker for session {session_id!r}")
            try:
                await asyncio.wait_for(self._topology_changed.wait(), remaining)
            except TimeoutError:
                pass

    async def _run_once(self, turn: TurnRequest) -> TurnOutput:
        """Run ``turn`` once on the current topology (colocated, or prefill -> KV move ->
        decode); an output cut short by a topology change is returned as is."""
        while True:
            await self._wait_for_workers(turn.session_id)
            if not self.disaggregated:
                worker = self._pick(WorkerRole.COLOCATED, turn.session_id, self.colocated)
                out = await worker.generate(turn)  # no await between the pick and the dispatch
                if out.finish_reason == "prefilled":
                    # The worker became a prefill worker while the turn was on its way there
                    # and stopped it at its first token: resume the rest on the new topology.
                    return dataclasses.replace(out, finish_reason="handed_back")
                return out
            p = self._pick(WorkerRole.PREFILL, turn.session_id, self.prefill)
            try:
                new_tokens = len(turn.token_ids) - await p.session_length(turn.session_id)
            except EngineStateError:
                new_tokens = len(turn.token_ids)  # p stopped meanwhile; the check below re-picks
            if p in self.prefill:  # still a prefill worker after the await: dispatch now
                break
        return await self._run_disaggregated(turn, p, new_tokens)

    async def _run_disaggregated(
        self, turn: TurnRequest, p: RolloutWorker, new_tokens: int
    ) -> TurnOutput:
        """Prefill ``turn`` on ``p`` (``new_tokens`` of it not yet cached there), move its KV
        to a decode worker and decode the rest there; returns the joined output."""
        self._inflight_prefill_tokens[p.worker_id] += new_tokens
        try:
            first = await p.prefill(turn)
        finally:
            self._inflight_prefill_tokens[p.worker_id] -= new_tokens
        if first.finish_reason != "prefilled":
            return first  # finished at the prefill worker, or cut short (the caller resumes it)
        decoded = await self._move_and_decode(turn, p, first)
        if decoded is None:
            return dataclasses.replace(first, finish_reason="handed_back")
        rest, moved, seconds = decoded
        return self._join_prefill_decode(turn, p, first, rest, moved, seconds)

    async def _move_and_decode(
        self, turn: TurnRequest, p: RolloutWorker, first: TurnOutput
    ) -> tuple[TurnOutput, int, float] | None:
        """Move the prefilled KV from ``p`` to a decode worker and decode the rest of the turn;
        returns (decode output, KV bytes moved, transfer seconds), or None to hand it back."""
        rest = moved = seconds = None
        d: RolloutWorker | None = None
        mismatched = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        waits = 0
        while rest is None:
            if d is None or d not in self.decode:
                if not self.decode:
                    # The topology switched away from disaggregation: hand the first token
                    # back; the caller resumes the turn on the new topology.
                    return None
                d = self._pick(WorkerRole.DECODE, turn.session_id, self.decode)
            try:
                # The decode worker keeps what it holds of this context (all of it for a pure
                # append; the common prefix if the agent edited the context) and receives
                # exactly the tokens it lacks.
                end = len(turn.token_ids)
                held = await d.match_session(turn.session_id, turn.token_ids)
                assert self.kv_mover is not None  # set_topology refuses prefill workers without one
                moved, seconds = await self.kv_mover.move(
                    p, d, turn.session_id, turn.token_ids, held, end
                )
                if d not in self.decode:
                    continue  # d left or switched role during the transfer: pick again
                rest = await d.decode(
                    dataclasses.replace(
                        turn,
                        request_id=f"{turn.request_id}/d",
                        token_ids=turn.token_ids + first.token_ids,
                        max_new_tokens=turn.max_new_tokens - 1,
                    )
                )
            except KVPrefixMismatch:
                # What d held changed between the match and the import (never expected):
                # resend the whole context once, then fail loudly rather than spin.
                self.transfer_retries += 1
                if mismatched:
                    raise
                mismatched = True
                await d.release_session(turn.session_id)
            except (KVTransferError, EngineStateError):
                self.transfer_retries += 1
                if p not in self.prefill:
                    # The prefill worker left (stopped, failed, or changed role) before its KV
                    # was moved: hand the first token back; the caller resumes the turn,
                    # prefilling it again where the topology now allows.
                    return None
                if d not in self.decode:
                    continue  # the worker left or changed role: pick another at once
                await self._wait_for_kv_memory(turn, d, deadline, waits)
                waits += 1
        assert moved is not None and seconds is not None  # the move precedes the decode
        return rest, moved, seconds

    async def _wait_for_kv_memory(
        self, turn: TurnRequest, d: RolloutWorker, deadline: float, waits: int
    ) -> None:
        """Back off before retry ``waits`` of a decode on ``d`` that found no KV memory;
        raises NoWorkerAvailable once the loop time reaches ``deadline``."""
        # Out of KV memory on the decode side (the import did not fit, or memory
        # pressure unpinned the imported KV before the decode was admitted): wait,
        # as a decode server's transfer queue does, for running decodes to free it.
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline:
            raise NoWorkerAvailable(
                f"session {turn.session_id!r}: decode worker {d.worker_id} had no KV "
                f"memory for the turn's {len(turn.token_ids)} tokens for "
                f"{self.max_wait_s:g} s"
            ) from None
        low, high = RETRY_BACKOFF_S
        await asyncio.sleep(min(high, low * 2 ** min(waits, 16), deadline - loop.time()))

    def _join_prefill_decode(
        self,
        turn: TurnRequest,
        p: RolloutWorker,
        first: TurnOutput,
        rest: TurnOutput,
        moved: int,
        seconds: float,
    ) -> TurnOutput:
        """The turn's output: ``first`` (from prefill worker ``p``) then ``rest`` (decoded),
        with the prefill and KV-move figures folded into ``rest``'s telemetry."""
        t = rest.telemetry
        t.submitted_at = first.telemetry.submitted_at
        t.first_token_at = first.telemetry.first_token_at
        t.prefill_tokens_computed = first.telemetry.prefill_tokens_computed
        t.prefill_tokens_cached = first.telemetry.prefill_tokens_cached
        t.kv_bytes_moved = moved
        t.kv_transfer_s = seconds
        t.prefill_worker = p.worker_id
        t.preemptions += first.telemetry.preemptions
        return first.joined(
            rest, request_id=turn.request_id, session_id=turn.session_id, telemetry=t
        )

    async def end_session(self, session_id: str) -> None:
        """Release the session's KV on every worker that holds it and forget its homes."""
        for role in (WorkerRole.COLOCATED, WorkerRole.PREFILL, WorkerRole.DECODE):
            worker = self._home.pop((role, session_id), None)
            if worker is not None:
                self._sessions_on[worker.worker_id] -= 1
                self._least.clear()
                try:
                    await worker.release_session(session_id)
                except EngineStateError:
                    pass  # the worker stopped meanwhile: its KV is gone anyway
