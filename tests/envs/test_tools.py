"""Tool calls: schemas checked, calls parsed and validated, malformed ones explained."""

import pytest

from pearl.envs.calculator import CALCULATE
from pearl.envs.tools import ToolCall, check_tools, parse_tool_calls

LOOKUP = {
    "name": "lookup",  # a bare function dict: wrapped as {"type": "function", ...}
    "parameters": {
        "type": "object",
        "properties": {"key": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["key"],
        "additionalProperties": False,
    },
}
TOOLS = check_tools([CALCULATE, LOOKUP], "test")


def test_valid_calls_are_parsed_in_order():
    text = (
        'Let me compute. <tool_call>\n{"name": "calculate", "arguments": {"expression": "2+2"}}'
        '\n</tool_call> and <tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"a\\"}"}'
        "</tool_call>"
    )
    calls, errors = parse_tool_calls(text, TOOLS)
    assert errors == []
    assert calls == [ToolCall("calculate", {"expression": "2+2"}), ToolCall("lookup", {"key": "a"})]
    assert parse_tool_calls("no calls here", TOOLS) == ([], [])


@pytest.mark.parametrize(
    "text, problem",
    [
        ("<tool_call>{name: calculate}</tool_call>", "tool call 1 is not valid JSON"),
        ('<tool_call>["calculate"]</tool_call>', 'needs a JSON object with a "name" string'),
        ('<tool_call>{"name": "search"}</tool_call>', "no tool named 'search'; the tools are"),
        (
            '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>',
            "missing required argument 'key'",
        ),
        (
            '<tool_call>{"name": "lookup", "arguments": {"key": "a", "limit": "3"}}</tool_call>',
            "argument 'limit' must be integer, got str",
        ),
        (
            '<tool_call>{"name": "lookup", "arguments": {"key": "a", "limit": true}}</tool_call>',
            "argument 'limit' must be integer, got bool",
        ),
        (
            '<tool_call>{"name": "lookup", "arguments": {"key": "a", "x": 1}}</tool_call>',
            "unknown argument 'x'; it takes key, limit",
        ),
        ('<tool_call>{"name": "lookup", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "calculate", "arguments": {"expression": "1"}}', "no closing"),
    ],
)
def test_malformed_calls_say_what_was_wrong(text, problem):
    calls, errors = parse_tool_calls(text, TOOLS)
    assert calls == [] and len(errors) == 1 and problem in errors[0]


def test_bad_tool_declarations_are_refused():
    with pytest.raises(ValueError, match="no function name"):
        check_tools([{"function": {"description": "x"}}], "env")
    with pytest.raises(ValueError, match="parameters must be an object schema"):
        check_tools([{"name": "f", "parameters": {"type": "string"}}], "env")
    with pytest.raises(ValueError, match="must be a list"):
        check_tools({"name": "f"}, "env")
