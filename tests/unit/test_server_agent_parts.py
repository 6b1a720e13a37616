"""The agent endpoints' parts without an engine: tool-call replay by canonical arguments,
Anthropic and Responses requests translated into the chat request they mean, and the
grammars that forced calls and schemas get."""

from __future__ import annotations

import json

import llguidance
import pytest

from app.server.anthropic import to_chat_body
from app.server.errors import ApiError
from app.server.replay import ReplyStore, calls_key
from app.server.responses import _items
from app.server.schema import parse_chat
from app.toolcalls.grammar import reply_grammar
from app.toolcalls.syntax import FAMILIES
from app.toolcalls.tools import ResponseFormat, ToolCall, parse_tools

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _key(content: str, *calls: ToolCall) -> str:
    return calls_key(content, [c.canonical() for c in calls])


def test_tool_call_replay_ignores_ids_spacing_and_key_order() -> None:
    store = ReplyStore()
    sampled = ToolCall("call_a", "f", '{"b": 1, "a": [1, 2]}')
    store.put("<tool_call>…</tool_call>", [5, 6, 7], "fp", content="", calls=_key("", sampled))
    resent = ToolCall("agent-1", "f", '{\n  "a": [1,2],\n  "b": 1\n}')
    found = store.find("", None, _key("  ", resent))
    assert found is not None and found.tokens == (5, 6, 7)
    for other in (
        ToolCall("x", "f", '{"a": [2, 1], "b": 1}'),  # another value
        ToolCall("x", "g", '{"a": [1, 2], "b": 1}'),  # another function
    ):
        assert store.find("", None, _key("", other)) is None
    assert store.find("", None, _key("some words", resent)) is None  # other content
    # a message with calls matches only by its calls, never by text
    assert store.find("<tool_call>…</tool_call>", None, _key("", other)) is None


def test_tool_call_replay_checks_reasoning_sent_back() -> None:
    store = ReplyStore()
    call = ToolCall("c", "f", "{}")
    store.put("…", [1], "fp", reasoning="think hard", content="", calls=_key("", call))
    assert store.find("", "think hard", _key("", call)) is not None
    assert store.find("", None, _key("", call)) is not None  # dropped: fine
    assert store.find("", "something else", _key("", call)) is None


def test_anthropic_blocks_become_chat_messages() -> None:
    body = to_chat_body(
        {
            "model": "m",
            "max_tokens": 10,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Use the tool.", "signature": ""},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"c": "Oslo"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "Sun"}],
                },
            ],
            "tools": [{"name": "w", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
        }
    )
    chat = parse_chat(body)
    system, user, assistant, tool = chat.messages
    assert (user.role, user.text) == ("user", "Weather?")
    assert (system.role, system.text) == ("system", "Be brief.")
    assert (assistant.text, assistant.reasoning) == ("Checking.", "Use the tool.")
    assert assistant.tool_calls == (ToolCall("t1", "w", '{"c": "Oslo"}'),)
    assert (tool.role, tool.tool_call_id, tool.text) == ("tool", "t1", "Sun")
    assert chat.tools.choice == "required" and not chat.tools.parallel
    assert chat.params.stop == ("END",)


def test_anthropic_refuses_what_it_cannot_take() -> None:
    with pytest.raises(ApiError, match="max_tokens"):
        to_chat_body({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    for block, words in (({"type": "document"}, "'document' block"), ({"type": "image"}, "base64")):
        with pytest.raises(ApiError, match=words):
            to_chat_body(
                {
                    "model": "m",
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": [block]}],
                }
            )


def test_responses_items_become_chat_messages() -> None:
    messages = _items(
        [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "Sun"},
        ]
    )
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]


def _tokenize(text: str) -> list[int]:
    return [ord(c) for c in text]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_forced_call_grammars_are_valid(family: str) -> None:
    tools = parse_tools({"tools": [WEATHER], "tool_choice": "required"})
    grammar = reply_grammar(ResponseFormat(), tools, FAMILIES[family], _tokenize)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    assert not is_error, messages
    if family in ("deepseek-v3.2", "deepseek-v4"):  # DSML: a tag per listed parameter only
        assert 'parameter name=\\"city\\" string=\\"true\\"' in grammar
    else:
        assert '"additionalProperties": false' in grammar  # tool parameters are closed


def test_free_text_has_no_grammar_and_schemas_do() -> None:
    tools = parse_tools({"tools": [WEATHER]})
    assert reply_grammar(ResponseFormat(), tools, FAMILIES["hermes"], _tokenize) is None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    open_ = reply_grammar(
        ResponseFormat("json_schema", schema), tools, FAMILIES["hermes"], _tokenize
    )
    strict = reply_grammar(
        ResponseFormat("json_schema", schema, strict=True), tools, FAMILIES["hermes"], _tokenize
    )
    assert "additionalProperties" not in open_ and '"additionalProperties": false' in strict
    assert json.loads(strict.removeprefix("start: %json"))["properties"] == schema["properties"]
