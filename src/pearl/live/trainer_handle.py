"""The control plane's handle on the live trainer: its Ray actors (``LiveTrainer``, which
implements ``pearl.control.interfaces.Trainer``) and how a trainer process's death reaches
the run (``TrainerProcessDied``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pearl.control.interfaces import TrainBatch, TrainMetrics
from pearl.live.cluster import Placement, process_death
from pearl.live.server import ModelSpec
from pearl.live.trainer import GRPOTrainer
from pearl.live.trainer_config import TrainerConfig


class TrainerProcessDied(RuntimeError):
    """A trainer process died (its actor is gone; the message names Ray's error): the run
    ends, and resumes from its last checkpoint."""


class LiveTrainer:
    """The control plane's handle on the trainer: one ``GRPOTrainer`` actor, or
    ``processes`` of them sharing each step (FSDP2 over gloo; rank 0 publishes the weights
    and writes checkpoints). Keeps the newest weights in Ray's object store for the rollout
    workers (``weights_ref``)."""

    def __init__(
        self,
        model: ModelSpec,
        config: TrainerConfig,
        torch_threads: int = 1,
        placement: Placement | None = None,
        processes: int = 1,
    ):
        import ray  # imported once pearl.live.cluster has set Ray's environment

        options = (placement or Placement()).trainer_options()
        cls = ray.remote(GRPOTrainer).options(**options)
        self.actors = [cls.remote(model, config, torch_threads) for _ in range(processes)]
        self.actor = self.actors[0]
        self.location: dict[str, Any] | None = None  # rank 0's node, once started
        self.locations: list[dict[str, Any]] = []  # every process's
        self._version = 0
        self.weights_ref: Any = None  # ObjectRef of (version, weights) of ``_version``
        self.history: list[dict[str, float]] = []

    @property
    def weight_version(self) -> int:
        return self._version

    async def _all(self, method: str, *args) -> list[Any]:
        """``method`` on every process (a collective when sharded); their answers."""
        return await _gather([getattr(a, method).remote(*args) for a in self.actors])

    async def start(self, resume: str | None = None) -> None:
        self.locations = await self._all("where")
        self.location = self.locations[0]
        if resume is not None:
            await self._all("load", resume)
        if len(self.actors) > 1:
            address = await self.actor.rendezvous_address.remote()
            world = len(self.actors)
            await asyncio.gather(
                *(a.init_distributed.remote(r, world, address) for r, a in enumerate(self.actors))
            )
        self._version, _ = await self._publish()

    async def _publish(self) -> tuple[int, Any]:
        refs = [a.weights.remote() for a in self.actors]
        (version, _), *_ = await _gather(refs)
        # Only now: until the new weights are there, a worker that asks gets the weights
        # of ``_version``, which is what the control plane believes it installs.
        self.weights_ref = refs[0]
        return version, self.weights_ref

    async def train_step(self, batch: TrainBatch) -> TrainMetrics:
        started = time.time()
        stats = (await self._all("train_step", batch))[0]
        self._version, _ = await self._publish()
        self.history.append(stats)
        return TrainMetrics(
            batch.step, self._version, started, time.time(), int(stats["trained_tokens"]), stats
        )

    async def release_device(self) -> None:
        await self._all("release_device")

    async def restore_device(self) -> None:
        await self._all("restore_device")

    async def save(self, folder: str, background: bool = False) -> None:
        """Write a checkpoint; ``background``: return once it is snapshotted, while the
        trainer writes it (``flush`` waits for it)."""
        await self._all("save_async" if background else "save", folder)

    async def flush(self) -> None:
        await self._all("flush")

    def kill(self) -> None:
        import ray  # (as above)

        for actor in self.actors:
            ray.kill(actor)


DEATH_GRACE_S = 10.0
"""How long, once one trainer process failed, to wait for the others' answers: when a
process dies, the survivors fail in their collectives first, and the death is the news."""


async def _gather(refs: list[Any]) -> list[Any]:
    """Await the processes' ``refs``. If one fails, the failure reported is a process's
    death when any process died (``TrainerProcessDied``, which ends the run with the resume
    command), not a survivor's broken collective."""

    async def one(ref: Any) -> Any:
        return await ref

    tasks = [asyncio.ensure_future(one(r)) for r in refs]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    failed = [t.exception() for t in done if t.exception() is not None]
    if not failed:
        return [t.result() for t in tasks]
    if pending:
        late, _ = await asyncio.wait(pending, timeout=DEATH_GRACE_S)
        failed += [t.exception() for t in late if t.exception() is not None]
    deaths = [e for e in failed if process_death(e)]
    if deaths:
        raise TrainerProcessDied(_death_reason(deaths[0])) from deaths[0]
    raise failed[0]


def _death_reason(error: BaseException) -> str:
    """Ray's error in one line: its type and its message's last line (the exception a
    trainer's constructor raised, or why its process ended), at most 300 characters."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1][:300]}" if lines else type(error).__name__
