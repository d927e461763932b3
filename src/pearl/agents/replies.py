"""A turn's sampled tokens as an OpenAI chat completion: stop strings, tool calls, the body.

Stop strings are applied after the turn (the engines stop on token ids only): the reply is
cut after the token that completes the first stop string, the text before it is returned,
and the tokens after it are dropped from the trajectory as if never sampled.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pearl.agents.messages import FunctionCall, Message, ToolCallIn
from pearl.envs.tools import parse_tool_calls
from pearl.models.chat import ChatFormat


@dataclass(slots=True)
class Reply:
    token_ids: list[int]
    logprobs: list[float]
    message: Message
    finish_reason: str  # stop, length or tool_calls
    malformed_calls: int = 0  # tool calls it tried to make that did not parse


def make_reply(
    chat: ChatFormat,
    token_ids: list[int],
    logprobs: list[float],
    truncated: bool,
    stops: list[str],
    tools: list[dict[str, Any]] | None,
) -> Reply:
    """The reply to return for a turn's ``token_ids`` (``truncated``: cut by the token
    limit rather than ended by the model)."""
    text = chat.text(token_ids)
    finish = "length" if truncated else "stop"
    cut = _first_stop(text, stops)
    if cut is not None:
        keep = _tokens_through(chat, token_ids, text[: cut[1]])
        token_ids, logprobs = token_ids[:keep], logprobs[:keep]
        text, finish = text[: cut[0]], "stop"
    calls, errors = parse_tool_calls(text, tools) if tools else ([], [])
    if calls:
        content = text[: text.index("<tool_call>")].strip() or None
        message = Message(
            role="assistant",
            content=content,
            tool_calls=[
                ToolCallIn(
                    id=f"call_{uuid.uuid4().hex[:24]}",
                    function=FunctionCall(name=c.name, arguments=json.dumps(c.arguments)),
                )
                for c in calls
            ],
        )
        finish = "tool_calls"
    else:
        message = Message(role="assistant", content=text)
    return Reply(list(token_ids), list(logprobs), message, finish, len(errors))


def _first_stop(text: str, stops: list[str]) -> tuple[int, int] | None:
    """(start, end) of the earliest stop string in ``text``."""
    found = [(i, i + len(s)) for s in stops if (i := text.find(s)) >= 0]
    return min(found) if found else None


def _tokens_through(chat: ChatFormat, ids: list[int], prefix: str) -> int:
    """The fewest leading ``ids`` whose text contains ``prefix``."""
    for k in range(1, len(ids) + 1):
        if chat.text(ids[:k]).startswith(prefix):
            return k
    return len(ids)


def completion_body(
    reply: Reply, model: str, prompt_ids: list[int], chat: ChatFormat, logprobs: bool, ids: bool
) -> dict[str, Any]:
    """The ``chat.completion`` object (``ids``: with vLLM's ``prompt_token_ids`` and
    ``token_ids`` fields)."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": reply.message.model_dump(exclude_none=True),
        "logprobs": _logprobs(reply, chat) if logprobs else None,
        "finish_reason": reply.finish_reason,
    }
    body: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(reply.token_ids),
            "total_tokens": len(prompt_ids) + len(reply.token_ids),
        },
    }
    if ids:
        body["prompt_token_ids"] = list(prompt_ids)
        choice["token_ids"] = list(reply.token_ids)
    return body


def _logprobs(reply: Reply, chat: ChatFormat) -> dict[str, Any]:
    out = []
    for tok, lp in zip(reply.token_ids, reply.logprobs, strict=True):
        text = chat.tokenizer.decode([tok])
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return {"content": out}


def stream_chunks(body: dict[str, Any]) -> list[str]:
    """A completion as server-sent events: the whole message in one delta, then the finish
    reason, then ``[DONE]`` (a turn is generated whole before it is returned)."""
    choice = body["choices"][0]
    message = dict(choice["message"])
    if "tool_calls" in message:
        message["tool_calls"] = [{"index": k, **c} for k, c in enumerate(message["tool_calls"])]
    head = {k: body[k] for k in ("id", "created", "model")}
    first = {
        **head,
        "object": "chat.completion.chunk",
        "choices": [
            {"index": 0, "delta": message, "logprobs": choice["logprobs"], "finish_reason": None}
        ],
    }
    last = {
        **head,
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
        "usage": body["usage"],
    }
    return [f"data: {json.dumps(first)}\n\n", f"data: {json.dumps(last)}\n\n", "data: [DONE]\n\n"]
