"""Disaggregated execution of turns on an in-process prefill engine and decode engine.

The control plane's router does the same across workers; this in-process version
serves the demo, tests and benchmarks.
"""

from __future__ import annotations

import dataclasses

from pearl.engine.engine import LLMEngine
from pearl.engine.sequence import FinishReason, Request, Role


@dataclasses.dataclass(slots=True)
class TurnResult:
    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    kv_tokens_moved: int
    kv_bytes_moved: int


def run_disaggregated(
    prefill: LLMEngine, decode: LLMEngine, requests: list[Request]
) -> dict[str, TurnResult]:
    """Prefill every request on ``prefill``, move the new KV to ``decode``, decode there.

    Requests need a ``session_id``; both engines keep the session's KV pinned so the
    next turn of the session is an append-prefill plus an append-transfer.
    """
    if prefill.role is not Role.PREFILL or decode.role is not Role.DECODE:
        raise ValueError(
            f"need a prefill and a decode engine, got {prefill.role} and {decode.role}"
        )
    by_id = {r.request_id: r for r in requests}
    for r in requests:
        if r.session_id is None:
            raise ValueError(
                f"request {r.request_id!r} needs a session_id for disaggregated execution"
            )
        prefill.add_request(r)
    results: dict[str, TurnResult] = {}
    for out in prefill.run():
        req = by_id[out.request_id]
        moved_tokens = moved_bytes = 0
        if out.finish_reason is FinishReason.PREFILLED:
            # The decode engine keeps what it holds of this context (the common prefix if
            # the agent edited it) and receives exactly the tokens it lacks.
            held = decode.match_session(req.session_id, req.prompt_token_ids)
            chunk = prefill.export_kv(req.session_id, held, len(req.prompt_token_ids))
            moved_tokens = decode.import_kv(chunk)
            moved_bytes = chunk.nbytes
            rest = dataclasses.replace(req.sampling, max_new_tokens=req.sampling.max_new_tokens - 1)
            decode.add_request(
                Request(
                    req.request_id,
                    req.prompt_token_ids + out.token_ids,
                    rest,
                    req.session_id,
                    pin_session=True,
                )
            )
        results[out.request_id] = TurnResult(
            out.request_id,
            out.token_ids,
            out.logprobs,
            out.finish_reason,
            moved_tokens,
            moved_bytes,
        )
    for out in decode.run():
        first = results[out.request_id]
        first.token_ids = first.token_ids + out.token_ids
        first.logprobs = first.logprobs + out.logprobs
        first.finish_reason = out.finish_reason
    return results
