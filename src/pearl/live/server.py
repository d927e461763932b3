"""An engine inside one worker process: commands are served between engine iterations.

``EngineServer`` is a plain class so it can be tested in-process; ``pearl.live.worker``
runs it as a Ray actor. Its ``async`` methods run on the actor's event loop. Each engine
iteration runs in a helper thread while the loop holds the engine lock, so the loop stays
free to receive calls (Ray needs several loop passes to start an incoming call: with the
iteration on the loop itself, each pass waited for a whole iteration, ~5 iterations per
call). A call that touches the engine takes the lock, so a new turn, a KV import or a role
change still lands exactly between two iterations, as in the simulator.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from pearl.control.interfaces import TurnOutput, TurnRequest
from pearl.control.rollout_engine import EngineCapabilities
from pearl.engine.config import EngineConfig
from pearl.engine.iteration_timing import get_grid, profile_engine
from pearl.engine.kv_transfer import KVChunk
from pearl.engine.scheduler import InFlight
from pearl.engine.sequence import RequestOutput, Role
from pearl.engine_turns import engine_request, turn_output
from pearl.live.cluster import actor_location
from pearl.models.config import ModelConfig


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """Which weights a worker loads: a Hugging Face folder, or a random model from a config."""

    folder: str | None = None
    config: dict[str, Any] | None = None
    seed: int = 0


class EngineServer:
    """Serves one ``LLMEngine`` to the control plane: our engine's ``RolloutEngine``."""

    capabilities = EngineCapabilities.full("pearl")

    def __init__(
        self,
        worker_id: str,
        model: ModelSpec,
        engine_config: EngineConfig,
        torch_threads: int = 1,
    ) -> None:
        import torch  # live extra

        from pearl.engine.engine import LLMEngine  # torch

        torch.set_num_threads(torch_threads)
        self.worker_id = worker_id
        if model.folder is not None:
            self.engine = LLMEngine.from_folder(model.folder, engine_config)
        elif model.config is not None:
            self.engine = LLMEngine.from_model_config(
                ModelConfig.from_dict(model.config), engine_config, seed=model.seed
            )
        else:
            raise ValueError("ModelSpec needs a folder or a config")
        self._futures: dict[str, tuple[asyncio.Future[RequestOutput], float]] = {}
        self._lock = asyncio.Lock()  # held by the engine loop for an iteration, by calls otherwise
        self._stepper = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{worker_id}-step")
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        # (prefill chunks as (tokens, start), decode contexts, seconds) of every iteration,
        # once ``log_iterations(True)``: what the simulator's cost model is checked against.
        self._iteration_log: list[tuple[list[tuple[int, int]], list[int], float]] | None = None

    # -- turns ----------------------------------------------------------------------
    async def run_turn(self, turn: TurnRequest) -> TurnOutput:
        """Generate (colocated), prefill (prefill role) or decode (decode role) one turn."""
        loop = asyncio.get_running_loop()
        submitted = loop.time()
        async with self._lock:
            self.engine.add_request(engine_request(turn))
        fut: asyncio.Future[RequestOutput] = loop.create_future()
        self._futures[turn.request_id] = (fut, submitted)
        self._kick()
        return self._turn_output(await fut, submitted)

    async def session_length(self, session_id: str) -> int:
        async with self._lock:
            return self.engine.session_length(session_id)

    async def match_session(self, session_id: str, token_ids: list[int]) -> int:
        async with self._lock:
            return self.engine.match_session(session_id, token_ids)

    async def release_session(self, session_id: str) -> None:
        async with self._lock:
            self.engine.release_session(session_id)

    async def export_kv(self, session_id: str, start: int, end: int) -> KVChunk:
        async with self._lock:
            return self.engine.export_kv(session_id, start, end)

    async def import_kv(self, chunk: KVChunk) -> tuple[int, int]:
        """Returns (tokens added, bytes received)."""
        async with self._lock:
            return self.engine.import_kv(chunk), chunk.nbytes

    async def set_role(self, role: str) -> list[TurnOutput]:
        async with self._lock:
            outs = self.engine.set_role(Role(role), InFlight.HAND_BACK)
        return [self._resolve(o) for o in outs]

    async def abort_all(self) -> list[TurnOutput]:
        async with self._lock:
            outs = self.engine.abort_all()
        return [self._resolve(o) for o in outs]

    async def release_device(self) -> None:
        """Free the KV cache and the weights (the next ``load_weights`` brings them back,
        ``restore_device`` reallocates); the process and its engine object stay."""
        async with self._lock:
            if not self.engine.asleep:
                self.engine.sleep(keep_weights_on_host=False)

    async def restore_device(self) -> None:
        async with self._lock:
            self.engine.wake()

    async def load_weights(self, weights: tuple[int, dict[str, Any]]) -> int:
        """Install the trainer's ``(version, numpy weights)`` between two iterations; turns in
        flight continue under them. Returns the version."""
        import torch  # live extra

        version, arrays = weights
        state = {name: torch.from_numpy(a) for name, a in arrays.items()}
        async with self._lock:
            self.engine.load_weights(state, version, in_flight=True)
        return version

    async def stats(self) -> dict[str, Any]:

        async with self._lock:
            return asdict(self.engine.stats())

    async def ping(self) -> str:
        return self.worker_id

    async def where(self) -> dict:
        """The node this actor runs on (inside a Ray actor only)."""

        return actor_location()

    async def log_iterations(self, enabled: bool = True) -> list:
        """Start (or stop) logging iteration shapes and seconds; returns the log so far."""
        log, self._iteration_log = self._iteration_log or [], [] if enabled else None

        def record(out, seconds: float) -> None:
            if self._iteration_log is not None:
                self._iteration_log.append(
                    (
                        [(c.num_tokens, c.start) for c in out.prefills],
                        [seq.num_tokens for seq in out.decodes],
                        seconds,
                    )
                )

        self.engine.on_iteration = record if enabled else None
        return log

    async def profile(self, grid: str = "default", repeats: int = 5, clock: str = "wall") -> list:
        """Calibration samples of this worker's own engine, timed where it really runs."""

        async with self._lock:
            return profile_engine(self.engine, get_grid(grid), repeats, clock=clock)

    # -- engine loop ----------------------------------------------------------------
    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._engine_loop())
        elif self._wakeup is not None:
            self._wakeup.set()

    async def _engine_loop(self) -> None:
        loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        while True:
            if not self.engine.has_unfinished():
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            # Calls waiting for the lock (FIFO) land before the next iteration starts.
            async with self._lock:
                outs = await loop.run_in_executor(self._stepper, self.engine.step)
            for out in outs:
                self._resolve(out)

    def _resolve(self, out: RequestOutput) -> TurnOutput:
        entry = self._futures.pop(out.request_id, None)
        submitted = entry[1] if entry else 0.0
        if entry is not None and not entry[0].done():
            entry[0].set_result(out)
        return self._turn_output(out, submitted)

    def _turn_output(self, out: RequestOutput, submitted: float) -> TurnOutput:
        now = asyncio.get_running_loop().time()
        return turn_output(out, self.worker_id, self.engine.role, submitted, now)
