"""What the control plane needs from a world: rollout workers, a KV mover, a trainer, a clock.

The live world (Ray actors over ``pearl.engine``) and the simulated world
(``pearl.sim``) both implement these; everything in ``pearl.control`` is written
against them only. Pure Python: no torch, no engine, no simulator imports.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class WorkerRole(enum.StrEnum):
    """The role of a worker slot (values match the engine's roles where they overlap)."""

    COLOCATED = "colocated"
    PREFILL = "prefill"
    DECODE = "decode"
    TRAINING = "training"


@dataclass(slots=True, frozen=True)
class TurnRequest:
    """One turn of a trajectory: continue ``token_ids`` (the whole context) by up to
    ``max_new_tokens`` tokens."""

    request_id: str
    session_id: str
    token_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = True
    stop_token_ids: tuple[int, ...] = ()
    """The turn ends when one of these is sampled (kept in its output), even with
    ``ignore_eos``, which ignores only the model config's end-of-sequence ids."""


@dataclass(slots=True)
class TurnTelemetry:
    """Where a turn's time went (world clock seconds) and what it computed."""

    submitted_at: float = 0.0
    first_token_at: float | None = None
    finished_at: float = 0.0
    prefill_tokens_computed: int = 0
    prefill_tokens_cached: int = 0
    kv_bytes_moved: int = 0
    kv_transfer_s: float = 0.0
    preemptions: int = 0
    prefill_worker: str | None = None
    decode_worker: str | None = None


VersionSpan = tuple[int, int, int]
"""``(first token, weights, kv)``: from a turn's token ``first`` on (to the next span), tokens
were sampled by a forward pass of weights version ``weights`` over KV whose oldest part
weights ``kv`` computed (``kv <= weights``: older when new weights landed while the turn, or
its session's kept KV, was in flight; newer only where a simulated decode worker that
accepts KV of other weights, ``SimEngineConfig.refuse_kv_of_other_weights`` False, took a
chunk from a prefill worker already updated)."""


@dataclass(slots=True)
class TurnOutput:
    """A finished (or aborted) turn: generated tokens and their log-probabilities."""

    request_id: str
    session_id: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: int  # the last token's weights
    telemetry: TurnTelemetry = field(default_factory=TurnTelemetry)
    version_spans: tuple[VersionSpan, ...] = ()
    """Which weights produced each token's distribution (``VersionSpan``); empty: every
    token was sampled by ``weight_version`` on KV it computed."""

    @property
    def oldest_version(self) -> int:
        """The oldest weights any of this turn's token distributions depended on."""
        return min(min(weights, kv) for _, weights, kv in self._spans())

    def tokens_by_version(self, n: int | None = None) -> dict[tuple[int, int], int]:
        """This turn's ``n`` generated tokens (default: those it holds) by ``(weights, kv)``
        (``VersionSpan``)."""
        n = len(self.token_ids) if n is None else n
        spans = self._spans()
        out: dict[tuple[int, int], int] = {}
        for k, (first, weights, kv) in enumerate(spans):
            end = spans[k + 1][0] if k + 1 < len(spans) else n
            if end > first:
                out[weights, kv] = out.get((weights, kv), 0) + end - first
        return out

    def _spans(self) -> tuple[VersionSpan, ...]:
        return self.version_spans or ((0, self.weight_version, self.weight_version),)

    def without_tokens(self) -> TurnOutput:
        """This turn with its token ids and log-probabilities dropped (a run that keeps no
        tokens; ``dataclasses.replace`` was ~1% of a simulated step, once a turn)."""
        return TurnOutput(
            self.request_id,
            self.session_id,
            [],
            [],
            self.finish_reason,
            self.weight_version,
            self.telemetry,
            self.version_spans,
        )

    def joined(self, rest: TurnOutput, **replace) -> TurnOutput:
        """This turn's tokens followed by ``rest``'s (a resumed or prefill-then-decode turn):
        its finish reason, last version and telemetry, unless given in ``replace``."""
        offset = len(self.token_ids)
        spans = list(self._spans() if offset else ())
        for first, weights, kv in rest._spans() if rest.token_ids else ():
            if not spans or spans[-1][1:] != (weights, kv):
                spans.append((offset + first, weights, kv))
        joined = TurnOutput(
            request_id=self.request_id,
            session_id=self.session_id,
            token_ids=self.token_ids + rest.token_ids,
            logprobs=self.logprobs + rest.logprobs,
            finish_reason=rest.finish_reason,
            weight_version=rest.weight_version,
            telemetry=rest.telemetry,
            version_spans=tuple(spans),
        )
        return dataclasses.replace(joined, **replace) if replace else joined


@runtime_checkable
class RolloutWorker(Protocol):
    """One rollout worker (a TP group running one engine)."""

    worker_id: str

    @property
    def role(self) -> WorkerRole: ...

    async def generate(self, turn: TurnRequest) -> TurnOutput:
        """Colocated: prefill and decode the turn here."""

    async def prefill(self, turn: TurnRequest) -> TurnOutput:
        """Prefill role: compute the turn's new KV, sample its first token, keep the KV."""

    async def decode(self, turn: TurnRequest) -> TurnOutput:
        """Decode role: continue a turn whose KV (all but the last token) was imported."""

    async def session_length(self, session_id: str) -> int:
        """Tokens of the session whose KV this worker holds."""

    async def match_session(self, session_id: str, token_ids: list[int]) -> int:
        """Keep the longest block-aligned prefix of the session's KV that ``token_ids``
        starts with (the agent may have edited its context), drop the rest; return its length."""

    async def release_session(self, session_id: str) -> None:
        """Forget the session's KV (the trajectory ended or moved)."""

    async def abort_all(self) -> list[TurnOutput]:
        """Stop every in-flight turn; return partial outputs."""

    async def sync_weights(self, version: int, seconds: float) -> None:
        """Install the trainer's weights ``version`` (taking about ``seconds``)."""

    async def set_role(self, role: WorkerRole) -> list[TurnOutput]:
        """Switch role, handing back in-flight turns the new role cannot run."""

    async def release_device(self) -> None:
        """Free the device state (KV cache, weights) of an idle worker; its process stays
        (a borrowing worker between rounds: the trainer needs the memory)."""

    async def restore_device(self) -> None:
        """Reallocate what ``release_device`` freed, with the weights last installed
        (``sync_weights`` works while released); a no-op on a worker holding its state."""


class KVMover(Protocol):
    """Moves a session's KV for tokens ``[start, end)`` from a prefill to a decode worker."""

    async def move(
        self,
        src: RolloutWorker,
        dst: RolloutWorker,
        session_id: str,
        token_ids: list[int],
        start: int,
        end: int,
    ) -> tuple[int, float]:
        """Return (bytes moved, seconds taken)."""


@dataclass(slots=True, frozen=True)
class TrainSample:
    """One trajectory as a trainer sees it: every token of its context in order, which of
    them the model generated (the loss mask), the behaviour log-probability of each
    generated token (0 elsewhere), its reward and its group (the task)."""

    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    reward: float
    group: str
    success: bool = False
    stop_reason: str = "done"
    """Why the episode ended; an environment failure (``env_error`` / ``env_timeout``) is
    not trained on (pearl.control.episode)."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"sample of {n} tokens has {len(self.loss_mask)} mask entries and "
                f"{len(self.logprobs)} logprobs"
            )


@dataclass(slots=True, frozen=True)
class TrainBatch:
    """What a GRPO step trains on: the batch's token count and its longest sequence, and
    (live) the trajectories themselves."""

    step: int
    trajectories: int
    tokens: int
    max_sequence_tokens: int
    weight_versions: tuple[int, ...] = ()
    samples: tuple[TrainSample, ...] = ()


@dataclass(slots=True, frozen=True)
class TrainMetrics:
    step: int
    weight_version: int
    started_at: float
    finished_at: float
    tokens: int
    stats: dict[str, float] = field(default_factory=dict)
    """What a real trainer measured (loss, gradient norm, clip fraction, ...)."""


@runtime_checkable
class Trainer(Protocol):
    """The training side: GRPO steps, weight snapshots, and device hand-off for borrowing."""

    @property
    def weight_version(self) -> int: ...

    async def train_step(self, batch: TrainBatch) -> TrainMetrics:
        """Train on ``batch``; the new weights become version ``weight_version``."""

    async def release_device(self) -> None:
        """Free training device state so rollout workers can borrow the GPUs."""

    async def restore_device(self) -> None:
        """Take the GPUs back before the next step."""


class Clock(Protocol):
    """The world's time: wall clock (live) or virtual (simulated)."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class AsyncioClock:
    """A ``Clock`` over the running asyncio loop: wall time live, virtual time in the simulator."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
