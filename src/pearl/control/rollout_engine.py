"""What a live rollout worker needs from an inference engine, and what an engine can do.

``RolloutEngine`` is the contract between a worker process and the engine inside it: run a
turn of a session with log-probabilities (colocated, or as the prefill or decode half of
a disaggregated turn), abort, keep/match/release a session's KV between turns, export and
import KV by token range, sleep and wake (free and restore device memory), install new
weights between iterations, and report each iteration's batch and seconds. Our engine
(``pearl.live.server.EngineServer`` over ``pearl.engine``) fills all of it; an adapter
over another engine (vLLM, SGLang) fills what that engine can and declares the rest
missing in its ``EngineCapabilities``. The control plane checks a policy against the
world's capabilities before it starts anything (``require_capabilities``), so a PD
deployment on an engine that cannot move KV is refused with a clear error instead of
failing at the first turn. Pure Python: no engine, simulator or Ray imports.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pearl.control.interfaces import TurnOutput, TurnRequest
from pearl.control.policies import Borrowing, PDMode, Policy
from pearl.errors import ConfigError


class Capability(enum.StrEnum):
    """An optional part of ``RolloutEngine``."""

    KV_EXPORT = "kv_export"  # export a session's KV for a token range (prefill role)
    KV_IMPORT = "kv_import"  # import it on another worker (decode role)
    SLEEP = "sleep"  # free the KV cache and weights, keep the process (borrowed GPUs)
    WEIGHT_UPDATE = "weight_update"  # install new weights between iterations, turns in flight
    ITERATION_LOG = "iteration_log"  # each iteration's prefill chunks, decode contexts, seconds


class EngineCapabilityError(ConfigError):
    """A run needs something the configured engine cannot do."""


@dataclass(slots=True, frozen=True)
class EngineCapabilities:
    """What an engine backend can do (``engine`` names it in errors)."""

    engine: str
    supported: frozenset[Capability]

    @classmethod
    def full(cls, engine: str) -> EngineCapabilities:
        return cls(engine, frozenset(Capability))

    def has(self, capability: Capability) -> bool:
        return capability in self.supported

    def missing(self, *needed: Capability) -> list[Capability]:
        return [c for c in needed if c not in self.supported]


def needed_by(policy: Policy) -> dict[Capability, str]:
    """The optional capabilities ``policy`` uses, each with the reason."""
    needs: dict[Capability, str] = {}
    if policy.pd is not PDMode.COLOCATED:
        why = f"policy {policy.name} runs disaggregated prefill/decode (KV moves between workers)"
        needs[Capability.KV_EXPORT] = why
        needs[Capability.KV_IMPORT] = why
    if policy.borrowing is not Borrowing.OFF:
        needs[Capability.SLEEP] = (
            f"policy {policy.name} borrows training GPUs (workers free their memory between rounds)"
        )
    return needs


def require_capabilities(policy: Policy, capabilities: EngineCapabilities) -> None:
    """Refuse ``policy`` on an engine that lacks what it uses, naming what is missing, why,
    and the policies that would run."""
    needs = needed_by(policy)
    missing = capabilities.missing(*needs)
    if missing:
        reasons = "; ".join(sorted({needs[c] for c in missing}))
        raise EngineCapabilityError(
            f"the {capabilities.engine} engine cannot {', '.join(map(str, missing))}, which "
            f"{reasons}; use a colocated policy without borrowing (e.g. roll, rlboost) or an "
            f"engine that supports it"
        )


@runtime_checkable
class RolloutEngine(Protocol):
    """An inference engine serving one rollout worker; calls land between iterations."""

    capabilities: EngineCapabilities

    async def run_turn(self, turn: TurnRequest) -> TurnOutput:
        """Run one turn of ``turn.session_id`` in the engine's role (colocated: prefill and
        decode; prefill: the new KV and the first token, KV kept; decode: continue a turn
        whose KV was imported), with each sampled token's log-probability and the weight
        version that produced it."""

    async def abort_all(self) -> list[TurnOutput]:
        """Stop every in-flight turn; return the partial outputs."""

    async def session_length(self, session_id: str) -> int:
        """Tokens of the session whose KV the engine holds (0: none)."""

    async def match_session(self, session_id: str, token_ids: list[int]) -> int:
        """Keep the longest block-aligned prefix of the session's KV that ``token_ids``
        starts with, drop the rest; return its length."""

    async def release_session(self, session_id: str) -> None:
        """Forget the session's KV."""

    async def export_kv(self, session_id: str, start: int, end: int) -> Any:
        """(``KV_EXPORT``) The session's KV for tokens ``[start, end)``, as a transferable chunk."""

    async def import_kv(self, chunk: Any) -> tuple[int, int]:
        """(``KV_IMPORT``) Install an exported chunk; return (tokens, bytes) imported."""

    async def set_role(self, role: str) -> list[TurnOutput]:
        """Become ``colocated``, ``prefill`` or ``decode``; hand back turns the new role
        cannot run."""

    async def release_device(self) -> None:
        """(``SLEEP``) Free the KV cache and weights; the process stays."""

    async def restore_device(self) -> None:
        """(``SLEEP``) Reallocate what ``release_device`` freed, with the newest weights."""

    async def load_weights(self, weights: tuple[int, dict[str, Any]]) -> int:
        """(``WEIGHT_UPDATE``) Install ``(version, state dict)`` between two iterations;
        return the version now served."""

    async def log_iterations(self, enabled: bool = True) -> list:
        """(``ITERATION_LOG``) The iterations run since the last call, as (prefill chunks
        (tokens, cached), decode contexts, seconds); ``enabled`` keeps logging."""
