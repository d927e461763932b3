"""Tool calls in the model's own format: tools declared as JSON schemas, offered in the
system message, called as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

An environment declares ``tools`` (OpenAI-style function schemas, the ``tools=`` argument
of Hugging Face chat templates) and answers ``call_tool(name, arguments) -> str``. When
the model's chat template renders tools itself (it mentions ``tools``), the prompt is that
template's rendering; otherwise the system message gets a ``<tools>`` block and the
``<tool_call>`` reply format that Qwen- and Hermes-style templates use (both in
``pearl.models.chat``). A reply's calls are parsed and checked against the schemas here; a
malformed one gets an observation that says what was wrong instead of a call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


@dataclass(slots=True, frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def check_tools(tools: Any, where: str) -> list[dict[str, Any]]:
    """The declared tools, checked: a list of ``{"type": "function", "function": {"name",
    "description", "parameters"}}`` (a bare function dict is accepted and wrapped)."""
    if not isinstance(tools, list | tuple):
        raise ValueError(f"{where}: tools must be a list of function schemas")
    out = []
    for k, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"{where}: tool {k} has no function name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise ValueError(f"{where}: tool {fn['name']!r}: parameters must be an object schema")
        out.append({"type": "function", "function": {**fn, "parameters": params}})
    return out


def tool_response(text: str) -> str:
    """A tool's result as the next user message carries it."""
    return f"<tool_response>\n{text}\n</tool_response>"


def parse_tool_calls(text: str, tools: list[dict[str, Any]]) -> tuple[list[ToolCall], list[str]]:
    """The calls in a reply, checked against ``tools``: (valid calls, what was wrong with
    the others, one sentence each)."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    calls: list[ToolCall] = []
    errors: list[str] = []
    for k, match in enumerate(_CALL.finditer(text), start=1):
        body, closed = match.group(1).strip(), bool(match.group(2))
        where = f"tool call {k}"
        if not closed:
            errors.append(f"{where} has no closing </tool_call> tag")
            continue
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"{where} is not valid JSON ({exc.msg} at character {exc.pos})")
            continue
        except RecursionError:
            errors.append(f"{where} is JSON nested too deeply to read")
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            errors.append(f'{where} needs a JSON object with a "name" string')
            continue
        name, arguments = data["name"], data.get("arguments", {})
        if isinstance(arguments, str):  # some models send the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError):
                pass
        if name not in schemas:
            errors.append(f"{where}: no tool named {name!r}; the tools are {', '.join(schemas)}")
            continue
        problem = _check_arguments(arguments, schemas[name])
        if problem:
            errors.append(f"{where} to {name}: {problem}")
            continue
        calls.append(ToolCall(name, arguments))
    return calls, errors


def _check_arguments(arguments: Any, schema: dict[str, Any]) -> str | None:
    if not isinstance(arguments, dict):
        return '"arguments" must be a JSON object'
    properties = schema.get("properties", {})
    missing = [p for p in schema.get("required", []) if p not in arguments]
    if missing:
        return f"missing required argument {', '.join(map(repr, missing))}"
    for key, value in arguments.items():
        if key not in properties:
            if schema.get("additionalProperties", True) is False:
                return f"unknown argument {key!r}; it takes {', '.join(properties)}"
            continue
        kind = properties[key].get("type")
        kinds = kind if isinstance(kind, list) else [kind] if kind else []
        allowed = tuple(t for k in kinds for t in _JSON_TYPES.get(k, ()))
        if allowed and (not isinstance(value, allowed) or _bool_as_number(value, kinds)):
            return f"argument {key!r} must be {' or '.join(kinds)}, got {type(value).__name__}"
    return None


def _bool_as_number(value: Any, kinds: list[str]) -> bool:
    return isinstance(value, bool) and "boolean" not in kinds
