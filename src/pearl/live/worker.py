"""Live rollout workers: ``EngineServer`` as a Ray actor (one process, one torch thread),
with a driver-side handle implementing ``pearl.control.interfaces.RolloutWorker``."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from pearl.control.interfaces import TurnOutput, TurnRequest, WorkerRole
from pearl.engine.config import EngineConfig
from pearl.engine.sequence import Role
from pearl.errors import EngineStateError, KVTransferError
from pearl.live.cluster import Placement, process_death
from pearl.live.server import EngineServer, ModelSpec

_ACTOR_CLASSES: dict[str, Any] = {}
BACKENDS = ("pearl", "vllm")  # rollout.backend: our engine, or vLLM's (live/vllm_server.py)


def server_class(backend: str) -> type:
    """The engine server a worker process runs for ``backend``."""
    if backend == "pearl":
        return EngineServer
    if backend == "vllm":
        from pearl.live.vllm_server import VllmServer  # optional: vLLM backend

        return VllmServer
    raise ValueError(f"rollout backend {backend!r} is not one of {', '.join(BACKENDS)}")


def _actor_class(backend: str = "pearl"):
    if backend not in _ACTOR_CLASSES:
        import ray  # after ensure_ray's environment

        _ACTOR_CLASSES[backend] = ray.remote(server_class(backend))
    return _ACTOR_CLASSES[backend]


class LiveWorker:
    """The control plane's handle on one engine actor."""

    def __init__(
        self,
        worker_id: str,
        model: ModelSpec,
        engine_config: EngineConfig,
        role: WorkerRole = WorkerRole.COLOCATED,
        placement: Placement | None = None,
        backend: str = "pearl",
    ):
        self.worker_id = worker_id
        self._role = role
        self.requested_version = 0
        # Called (once) when the actor is found dead without kill(): returns a future that
        # completes once the control plane has taken the worker out (set by the world).
        self.on_failure = None
        self.stopped = False  # kill() was called: a deliberate stop, not a failure
        self._failure = None
        # Where sync_weights finds the newest weights: an ObjectRef of the trainer's
        # (version, weights) in Ray's object store (set by the training run).
        self.weights_source = None
        config = dataclasses.replace(engine_config, role=Role(role.value))
        options = (placement or Placement()).worker_options()
        self.actor = _actor_class(backend).options(**options).remote(worker_id, model, config)
        self.location: dict[str, Any] | None = None  # its node, once ready() has answered
        self._ready: asyncio.Future | None = None

    @property
    def role(self) -> WorkerRole:
        return self._role

    async def _call(self, method: str, *args):
        """Call the actor; a stopped (killed, crashed) actor raises ``EngineStateError``, as
        a stopped simulated worker does, so the control plane treats both alike."""
        try:
            return await getattr(self.actor, method).remote(*args)
        except Exception as exc:
            if not process_death(exc):
                raise
            if not self.stopped and self.on_failure is not None and not self._failure_handled():
                self._failure = self.on_failure()
            raise EngineStateError(
                f"worker {self.worker_id} is stopped ({type(exc).__name__})"
            ) from None

    def _failure_handled(self) -> bool:
        """The death was reported and is being (or was) handled. A report answered False
        (the worker was not in service yet: it died while joining, and was admitted before
        anyone noticed) is made again, now that it serves."""
        failure = self._failure
        if failure is None:
            return False
        if not failure.done() or failure.cancelled() or failure.exception() is not None:
            return True
        return failure.result() is not False

    async def ready(self, timeout_s: float | None = None) -> None:
        """Wait until the actor runs (placed on a node, engine loaded); note where it runs.
        ``EngineStateError`` if it died first, or (then stopped) if Ray found it no place
        within ``timeout_s``."""
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._call("where"))
        try:
            self.location = await asyncio.wait_for(asyncio.shield(self._ready), timeout_s)
        except TimeoutError:
            self.kill()
            raise EngineStateError(
                f"worker {self.worker_id} did not start within {timeout_s:g} s: no node has a "
                "free CPU slot with the resources it asks for (cluster.worker_resources)"
            ) from None

    async def _run_turn(self, turn: TurnRequest) -> TurnOutput:
        """A turn; if the actor is stopped before it answers (a shrink stopped it while the
        call was in flight, ahead of the abort), the turn comes back aborted with nothing
        generated, and the router resumes it on the current topology."""
        try:
            return await self._call("run_turn", turn)
        except EngineStateError:
            if self._failure is not None:  # it died: resume once it is out of the topology
                await asyncio.shield(self._failure)
            return TurnOutput(
                turn.request_id, turn.session_id, [], [], "abort", self.requested_version
            )

    async def generate(self, turn: TurnRequest) -> TurnOutput:
        return await self._run_turn(turn)

    async def prefill(self, turn: TurnRequest) -> TurnOutput:
        return await self._run_turn(turn)

    async def decode(self, turn: TurnRequest) -> TurnOutput:
        return await self._run_turn(turn)

    async def session_length(self, session_id: str) -> int:
        return await self._call("session_length", session_id)

    async def match_session(self, session_id: str, token_ids: list[int]) -> int:
        return await self._call("match_session", session_id, token_ids)

    async def release_session(self, session_id: str) -> None:
        await self._call("release_session", session_id)

    async def set_role(self, role: WorkerRole) -> list[TurnOutput]:
        outs = await self._call("set_role", role.value)
        self._role = role
        return outs

    async def abort_all(self) -> list[TurnOutput]:
        return await self._call("abort_all")

    async def release_device(self) -> None:
        await self._call("release_device")

    async def restore_device(self) -> None:
        await self._call("restore_device")

    async def sync_weights(self, version: int, seconds: float = 0.0) -> None:
        """Fetch the trainer's weights ``version`` from the object store (the actor reads
        them directly; they never pass through the driver) and install them."""
        if self.weights_source is None:
            raise RuntimeError(f"worker {self.worker_id} has no weights source to sync from")
        self.requested_version = version
        try:
            installed = await self._call("load_weights", self.weights_source())
        except EngineStateError:
            if self._failure is not None:
                return  # it died: its replacement loads the newest weights before admission
            raise
        if installed < version:
            raise RuntimeError(
                f"worker {self.worker_id}: asked for weights v{version}, the store holds v{installed}"
            )
        # The store may already hold a newer version (a step ended meanwhile): it is what
        # this worker now serves.
        self.requested_version = installed

    async def stats(self) -> dict[str, Any]:
        return await self._call("stats")

    def kill(self) -> None:
        import ray  # after ensure_ray's environment

        self.stopped = True
        ray.kill(self.actor)

    def crash(self) -> None:
        """Kill the actor as a crash would (chaos testing): the worker is not marked
        stopped, so its next call reports the death to the control plane, which must
        notice it."""
        import ray  # after ensure_ray's environment

        ray.kill(self.actor)


class LiveKVMover:
    """Moves KV between engine actors through Ray's object store (numpy arrays, no copy
    through the driver: the decode actor fetches the prefill actor's chunk directly)."""

    def __init__(self) -> None:
        self.bytes_moved = 0
        self.transfers = 0

    async def move(self, src, dst, session_id, token_ids, start, end):
        if end <= start:
            return 0, 0.0
        import ray  # after ensure_ray's environment

        t0 = time.monotonic()
        chunk_ref = src.actor.export_kv.remote(session_id, start, end)
        try:
            _, nbytes = await dst.actor.import_kv.remote(chunk_ref)
        except (KVTransferError, EngineStateError):
            raise  # the engine's own refusal (e.g. no KV memory), raised through Ray
        except ray.exceptions.RayError as exc:  # an actor died: the router decides what next
            raise EngineStateError(
                f"KV move {src.worker_id} -> {dst.worker_id} of session {session_id!r}: {exc}"
            ) from exc
        self.bytes_moved += nbytes
        self.transfers += 1
        return nbytes, time.monotonic() - t0
