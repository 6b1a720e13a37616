"""The grammar a forced call gets in DeepSeek's DSML syntax (V3.2 and V4): the calls the
family writes for valid arguments are sentences of it; missing, mistyped or unlisted values
are not. Checked with the grammar library itself over a byte-level vocabulary."""

from __future__ import annotations

import llguidance
import pytest

from app.engine.constraint import tokenizer_from_pieces
from app.toolcalls.grammar import reply_grammar
from app.toolcalls.syntax import FAMILIES
from app.toolcalls.tools import ResponseFormat, ToolCall, parse_tools

CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "hour24": {"type": "boolean"},
                "unit": {"type": "string", "enum": ["utc", "local"]},
                "days": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["city", "hour24"],
        },
    },
}
NOOP = {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}
BYTES = tokenizer_from_pieces(
    [bytes([i]) for i in range(256)] + [b"<eos>"], [256], [256], lambda t: list(t.encode())
)


def _accepts(grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(BYTES, grammar, log_level=0)
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


@pytest.mark.parametrize("family", ["deepseek-v3.2", "deepseek-v4"])
@pytest.mark.parametrize(
    ("name", "arguments", "valid"),
    [
        ("get_time", '{"city": "Oslo", "hour24": true}', True),
        ("get_time", '{"city": "Oslo", "hour24": false, "unit": "utc", "days": [1, 2]}', True),
        ("get_time", '{"city": "Oslo", "hour24": true, "days": [3]}', True),
        ("noop", "{}", True),
        ("get_time", '{"city": "Oslo"}', False),  # a required parameter missing
        ("get_time", '{"city": 3, "hour24": true}', False),  # not a string
        ("get_time", '{"city": "Oslo", "hour24": "yes"}', False),
        ("get_time", '{"city": "Oslo", "hour24": true, "unit": "mars"}', False),  # not in enum
        ("get_time", '{"city": "Oslo", "hour24": true, "x": 1}', False),  # not listed
        ("rm", "{}", False),  # not offered
    ],
)
def test_forced_dsml_call(family: str, name: str, arguments: str, valid: bool) -> None:
    tools = parse_tools({"tools": [CLOCK, NOOP], "tool_choice": "required"})
    grammar = reply_grammar(ResponseFormat(), tools, FAMILIES[family], lambda t: [1])
    assert not llguidance.LLMatcher.validate_grammar_with_warnings(grammar)[0]
    text = FAMILIES[family].render([ToolCall("x", name, arguments)])
    assert _accepts(grammar, text) is valid
    if valid:  # what the grammar lets through reads back as the call
        assert FAMILIES[family].parse(text)[1][0].arguments == arguments


def test_named_choice_allows_only_that_function() -> None:
    tools = parse_tools(
        {"tools": [CLOCK, NOOP], "tool_choice": {"type": "function", "function": {"name": "noop"}}}
    )
    grammar = reply_grammar(ResponseFormat(), tools, FAMILIES["deepseek-v4"], lambda t: [1])
    render = FAMILIES["deepseek-v4"].render
    assert _accepts(grammar, render([ToolCall("x", "noop", "{}")]))
    assert not _accepts(
        grammar, render([ToolCall("x", "get_time", '{"city": "a", "hour24": true}')])
    )
