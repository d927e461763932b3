"""Live rollout workers: ``EngineServer`` as a Ray actor (one process, one torch thread),
with a driver-side handle implementing ``pearl.control.interfaces.RolloutWorker``."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from typing import Any

from pearl.control.interfaces import TurnOutput, TurnRequest, WorkerRole
from pearl.engine.config import EngineConfig
from pearl.engine.sequence import Role
from pearl.errors import EngineStateError, KVTransferError
from pearl.live.server import EngineServer, ModelSpec

_ACTOR_CLASS = None


# Ray (2.60) treats 127.0.0.1 as "this node's reachable address" and binds its servers to
# every interface unless clusters are switched off, which makes the node's address the
# loopback one and its servers listen there only. Read when ray is first imported.
LOOPBACK_ONLY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def ensure_ray(num_cpus: int | None = None) -> None:
    """Start a local, single-machine Ray runtime if none is running: no dashboard, every
    server bound to loopback (nothing listens on the machine's other addresses)."""
    for key, value in LOOPBACK_ONLY_ENV.items():
        os.environ.setdefault(key, value)  # Ray's own processes read it at start
    import ray
    from ray._private import ray_constants

    if not ray.is_initialized():
        # This process may have imported ray before the variable was set.
        ray_constants.ENABLE_RAY_CLUSTER = os.environ[
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
        ].lower() not in ("0", "false")
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            logging_level="ERROR",
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )


def _actor_class():
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        import ray

        _ACTOR_CLASS = ray.remote(num_cpus=1)(EngineServer)
    return _ACTOR_CLASS


class LiveWorker:
    """The control plane's handle on one engine actor."""

    def __init__(
        self,
        worker_id: str,
        model: ModelSpec,
        engine_config: EngineConfig,
        role: WorkerRole = WorkerRole.COLOCATED,
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
        self.actor = _actor_class().options(name=None).remote(worker_id, model, config)

    @property
    def role(self) -> WorkerRole:
        return self._role

    async def _call(self, method: str, *args):
        """Call the actor; a stopped (killed, crashed) actor raises ``EngineStateError``, as
        a stopped simulated worker does, so the control plane treats both alike."""
        from ray.exceptions import RayActorError

        try:
            return await getattr(self.actor, method).remote(*args)
        except RayActorError as exc:
            if not self.stopped and self.on_failure is not None and self._failure is None:
                self._failure = self.on_failure()
            raise EngineStateError(
                f"worker {self.worker_id} is stopped ({type(exc).__name__})"
            ) from None

    async def ready(self) -> None:
        await self._call("ping")

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
        import ray

        self.stopped = True
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
        import ray

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
