"""Requests, sequences and their outputs (pure Python: shared by the engine and the simulator).

Compiled for simulations (``pearl.native``): its dataclasses take no ``slots=True`` (mypyc
lays compiled classes out itself and rejects ``__slots__``)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from pearl.errors import RequestError
from pearl.token_runs import TokenIds, TokenRuns


class Role(enum.StrEnum):
    """What a rollout worker's engine runs."""

    COLOCATED = "colocated"  # prefill chunks and decodes in the same iterations
    PREFILL = "prefill"  # prefills only; finished KV is held for export
    DECODE = "decode"  # decodes only, of sequences whose KV was imported


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


class FinishReason(enum.StrEnum):
    STOP = "stop"  # a stop token was sampled
    LENGTH = "length"  # max_new_tokens or the context limit reached
    ABORT = "abort"  # aborted by the caller; output is partial
    PREFILLED = "prefilled"  # prefill role: prompt computed, first token sampled, KV held
    HANDED_BACK = "handed_back"  # a role change returned the request unfinished


MAX_NEW_TOKENS_LIMIT = 1 << 20


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` is greedy; ``top_k == 0`` disables top-k.

    With ``seed`` set, the token at position p is drawn with a uniform hashed from
    ``(seed, p)`` (``pearl.engine.sampler.row_uniform``), so the result does not depend on
    batching or on which engine (prefill or decode worker) samples it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def validate(self, vocab_size: int) -> None:
        """Raise ``RequestError`` naming the bad field and the valid range."""
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)):
            raise RequestError(
                f"temperature must be a finite number >= 0, got {self.temperature!r}"
            )
        if self.temperature < 0 or self.temperature > 100:
            raise RequestError(f"temperature must be in [0, 100], got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise RequestError(f"top_k must be an integer >= 0 (0 disables), got {self.top_k!r}")
        if not isinstance(self.max_new_tokens, int) or not (
            1 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT
        ):
            raise RequestError(
                f"max_new_tokens must be an integer in [1, {MAX_NEW_TOKENS_LIMIT}], got {self.max_new_tokens!r}"
            )
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise RequestError(f"seed must be a non-negative integer or None, got {self.seed!r}")
        for tok in self.stop_token_ids:
            if not isinstance(tok, int) or not (0 <= tok < vocab_size):
                raise RequestError(
                    f"stop token id {tok!r} is outside the vocabulary [0, {vocab_size})"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Telemetry:
    """Per-request timings (engine clock, seconds) and work accounting."""

    queued_at: float = 0.0
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    prefill_tokens_computed: int = 0
    prefill_tokens_cached: int = 0  # served from the prefix cache or a pinned session
    kv_tokens_imported: int = 0
    preemptions: int = 0


@dataclass
class Request:
    """One generation request: a full token history and how to continue it.

    ``session_id`` ties the turns of one trajectory together: with ``pin_session``
    the engine keeps the request's KV after it finishes so the next turn appends.
    """

    request_id: str
    prompt_token_ids: TokenIds
    sampling: SamplingParams = field(default_factory=SamplingParams)
    session_id: str | None = None
    pin_session: bool = False


@dataclass
class RequestOutput:
    """What a finished (or aborted, or prefilled) request returns."""

    request_id: str
    session_id: str | None
    prompt_len: int
    token_ids: TokenIds
    logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int
    telemetry: Telemetry
    version_spans: tuple[tuple[int, int, int], ...] = ()
    """Which weights produced each output token's distribution, as runs ``(first token,
    weights, kv)``: from output token ``first`` on (to the next run), tokens were sampled by
    a forward pass of weights ``weights`` over KV of which the oldest part was computed by
    weights ``kv`` (<= ``weights``; older when an update landed with the request in flight,
    or under its session's kept KV). ``weight_version`` is the last token's ``weights``."""


class Sequence:
    """A request's mutable state inside one engine."""

    __slots__ = (
        "request",
        "request_id",
        "sampling",
        "token_ids",
        "num_prompt_tokens",
        "output_logprobs",
        "num_computed_tokens",
        "block_table",
        "num_hashed_blocks",
        "status",
        "telemetry",
        "arrival",
        "weight_version",
        "attach_hint",
        "cacheable",
        "kv_version",
        "version_spans",
    )

    def __init__(self, request: Request, arrival: int, now: float) -> None:
        self.request = request
        self.request_id = request.request_id
        self.sampling = request.sampling
        ids = request.prompt_token_ids
        # A copy: the engine appends to it. The simulator's contexts stay runs (TokenRuns).
        self.token_ids: TokenIds = ids.copy() if isinstance(ids, TokenRuns) else list(ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.output_logprobs: list[float] = []
        self.num_computed_tokens = 0  # tokens whose KV is in this engine's cache
        self.block_table: list[int] = []
        self.num_hashed_blocks = 0  # leading blocks registered in the prefix cache
        self.status = SequenceStatus.WAITING
        self.telemetry = Telemetry(queued_at=now)
        self.arrival = arrival  # admission order; later arrivals are preempted first
        self.weight_version = 0
        # (pinned session, its computed tokens) whose KV this sequence was found to extend
        self.attach_hint: tuple[Sequence, int] | None = None
        # False once new weights landed under this sequence's KV: its blocks hold KV of older
        # weights (or attend to it) and never enter the prefix cache.
        self.cacheable = True
        # The oldest weights version among the KV this sequence holds (None: holds none).
        self.kv_version: int | None = None
        self.version_spans: list[tuple[int, int, int]] = []  # see RequestOutput.version_spans

    @property
    def session_id(self) -> str | None:
        return self.request.session_id

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def output_token_ids(self) -> TokenIds:
        return self.token_ids[self.num_prompt_tokens :]

    def to_output(self, reason: FinishReason) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            session_id=self.session_id,
            prompt_len=self.num_prompt_tokens,
            token_ids=self.output_token_ids,
            logprobs=list(self.output_logprobs),
            finish_reason=reason,
            weight_version=self.weight_version,
            telemetry=self.telemetry,
            version_spans=tuple(self.version_spans),
        )

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, {self.status.name})"
        )
