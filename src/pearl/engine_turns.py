"""Conversions between the control plane's turns and the engine's requests and outputs.

Both worlds use them: the live ``EngineServer`` and the ``SimulatedWorker`` run the
same engine scheduler, so a turn becomes the same ``Request`` and its output the same
``TurnOutput`` in either (pure Python: no torch).
"""

from __future__ import annotations

from pearl.control.interfaces import TurnOutput, TurnRequest, TurnTelemetry
from pearl.engine.sequence import Request, RequestOutput, Role, SamplingParams
from pearl.token_runs import TokenRuns


def engine_request(turn: TurnRequest, pin_session: bool = True) -> Request:
    """The engine request for ``turn`` (its KV is kept pinned for the session's next turn)."""
    sampling = SamplingParams(
        temperature=turn.temperature,
        top_p=turn.top_p,
        top_k=turn.top_k,
        seed=turn.seed,
        max_new_tokens=turn.max_new_tokens,
        ignore_eos=turn.ignore_eos,
        stop_token_ids=tuple(turn.stop_token_ids),
    )
    # No copy here: the engine's Sequence copies the prompt, and a turn's context is never
    # mutated once sent (the agent loop builds a new list per turn).
    ids = turn.token_ids if isinstance(turn.token_ids, (list, TokenRuns)) else list(turn.token_ids)
    return Request(turn.request_id, ids, sampling, turn.session_id, pin_session)


def turn_output(
    out: RequestOutput, worker_id: str, role: Role, submitted: float, now: float
) -> TurnOutput:
    """The control plane's view of an engine output produced by ``worker_id`` in ``role``."""
    t = out.telemetry
    return TurnOutput(
        request_id=out.request_id,
        session_id=out.session_id or "",
        token_ids=out.token_ids,
        logprobs=out.logprobs,
        finish_reason=out.finish_reason.value,
        weight_version=out.weight_version,
        telemetry=TurnTelemetry(
            submitted_at=submitted,
            first_token_at=t.first_token_at,
            finished_at=t.finished_at if t.finished_at is not None else now,
            prefill_tokens_computed=t.prefill_tokens_computed,
            prefill_tokens_cached=t.prefill_tokens_cached,
            preemptions=t.preemptions,
            prefill_worker=worker_id if role is not Role.DECODE else None,
            decode_worker=worker_id if role is not Role.PREFILL else None,
        ),
        version_spans=out.version_spans,
    )
