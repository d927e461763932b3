"""OpenAI chat-completion requests: checked, compared and laid out as the model reads them.

A request's body is validated here (``ChatRequest``); what PEARL cannot honour is refused
with a sentence that says what would be valid (``ApiError``), never silently ignored. The
layout follows PEARL's tool convention (``pearl.envs.tools``): tools are listed in the
system message, an assistant's tool calls are ``<tool_call>`` blocks after its text, and a
run of ``tool`` messages is one user message of ``<tool_response>`` blocks.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pearl.envs.tools import check_tools, tool_response
from pearl.models.chat import tools_system_prompt

MAX_STOP_SEQUENCES = 4  # as OpenAI's API
# The deepest nesting of arrays and objects a request may have: a chat request's own
# structure is 6 levels deep and a tool's JSON schema rarely 10; a deeper body exhausts
# recursion in the JSON parser, in validation or in a chat template (a RecursionError).
MAX_JSON_DEPTH = 64


def load_json(raw: bytes | str) -> Any:
    """``raw`` parsed; ``ValueError`` saying why if it is not JSON, or is nested deeper
    than ``MAX_JSON_DEPTH``."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep") from None
    level, deepest = [data], 1
    while level:  # breadth first, without recursion
        level = [
            child
            for value in level
            if isinstance(value, dict | list)
            for child in (value.values() if isinstance(value, dict) else value)
            if isinstance(child, dict | list)
        ]
        deepest += bool(level)
        if deepest > MAX_JSON_DEPTH:
            raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
    return data


class ApiError(Exception):
    """An OpenAI-style error: HTTP ``status`` and the ``error`` object of the body."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = (
            status,
            message,
            kind,
            param,
            code,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


class _Open(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionCall(_Open):
    name: str
    arguments: str = "{}"


class ToolCallIn(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self, where: str) -> str:
        """The content as text: a string, or text parts joined (other parts are refused)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for k, part in enumerate(self.content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(
                    400,
                    f"{where}.content[{k}]: only text parts are supported "
                    f"(type 'text'), got type {part.get('type')!r}",
                    param=f"{where}.content",
                )
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(_Open):
    """The fields of ``POST /v1/chat/completions`` that PEARL reads; others are ignored."""

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = 1
    logprobs: bool = False
    top_logprobs: int | None = None
    return_token_ids: bool = False  # vLLM's extension: the ids behind the text

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported (each call is one turn of a trajectory)")
        return n

    @field_validator("top_logprobs")
    @classmethod
    def _no_alternatives(cls, k: int | None) -> int | None:
        if k:
            raise ValueError("top_logprobs > 0 is not supported; logprobs=true gives each token's")
        return k

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOP_SEQUENCES or any(not s for s in stops):
            raise ValueError(f"stop takes up to {MAX_STOP_SEQUENCES} non-empty strings")
        return stop

    @classmethod
    def parse(cls, raw: bytes) -> ChatRequest:
        """A request body, or ``ApiError`` (400) saying what is wrong and where."""
        try:
            data = load_json(raw)
        except ValueError as exc:
            raise ApiError(400, f"the request body is {exc}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the request body must be a JSON object")
        try:
            request = cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or None
            raise ApiError(400, f"{where}: {first['msg']}", param=where) from None
        request.check()
        return request

    def check(self) -> None:
        choice = self.tool_choice
        if isinstance(choice, dict) or choice not in (None, "auto", "none"):
            raise ApiError(
                400,
                f"tool_choice {choice!r} is not supported: the model is not constrained to "
                "call a tool; use 'auto' or 'none'",
                param="tool_choice",
            )
        if self.tools is not None:
            try:
                check_tools(self.tools, "tools")
            except ValueError as exc:
                raise ApiError(400, str(exc), param="tools") from None
        for k, message in enumerate(self.messages):
            message.text(f"messages[{k}]")  # refuses non-text parts now

    @property
    def offered_tools(self) -> list[dict[str, Any]] | None:
        """The tools shown to the model (none under ``tool_choice: none``)."""
        if not self.tools or self.tool_choice == "none":
            return None
        return check_tools(self.tools, "tools")

    @property
    def text_bytes(self) -> int:
        """The UTF-8 bytes of the messages' text: all of it is in the prompt."""
        return sum(len(m.text("messages").encode()) for m in self.messages)

    @property
    def size_bytes(self) -> int:
        """About what the prompt renders: the messages' text and the tools' JSON."""
        return self.text_bytes + (len(json.dumps(self.tools)) if self.tools else 0)

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def tool_call_block(name: str, arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _arguments(raw: str) -> Any:
    try:
        return load_json(raw)
    except ValueError:
        return raw  # shown as the agent sent it


def canonical(message: Message) -> tuple:
    """What identifies a message when a later request repeats it (SDKs add fields such as
    ``refusal`` or ids that do not change what the model read)."""
    role = "system" if message.role == "developer" else message.role
    calls = tuple(
        (c.function.name, json.dumps(_arguments(c.function.arguments), sort_keys=True))
        for c in message.tool_calls or ()
    )
    return (role, message.text("message").strip(), calls)


def flatten(messages: list[Message], tools: list[dict[str, Any]] | None) -> list[tuple[str, str]]:
    """``(role, text)`` pairs as the model reads them (module docstring); with ``tools``,
    the first message is the system message that lists them."""
    out: list[tuple[str, str]] = []
    responses: list[str] = []
    for message in messages:
        text = message.text("message")
        if message.role == "tool":
            responses.append(tool_response(text))
            continue
        if responses:
            out.append(("user", "\n".join(responses)))
            responses = []
        if message.role == "assistant":
            blocks = [
                tool_call_block(c.function.name, _arguments(c.function.arguments))
                for c in message.tool_calls or ()
            ]
            out.append(("assistant", "\n".join(([text] if text else []) + blocks)))
        else:
            out.append(("system" if message.role == "developer" else message.role, text))
    if responses:
        out.append(("user", "\n".join(responses)))
    if tools:
        if out and out[0][0] == "system":
            out[0] = ("system", tools_system_prompt(out[0][1], tools))
        else:
            out.insert(0, ("system", tools_system_prompt("", tools).lstrip()))
    return out


def template_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """``messages`` in the Hugging Face chat format, for a model template that lays out
    tools itself (tool calls with parsed arguments, ``tool`` messages as they are)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        item: dict[str, Any] = {
            "role": "system" if message.role == "developer" else message.role,
            "content": message.text("message"),
        }
        if message.tool_calls:
            item["tool_calls"] = [
                {
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": _arguments(c.function.arguments),
                    },
                }
                for c in message.tool_calls
            ]
        out.append(item)
    return out
