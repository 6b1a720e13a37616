"""Tool calls streamed as they are written (tool_replies.ToolStream): fed in pieces split at
every position, the deltas a client assembles are the calls the whole reply parses to; a
reply cut inside a call still leaves JSON-object arguments equal to the calls reported; text
that is no call reaches the client as content; nothing sent is ever taken back."""

from __future__ import annotations

import json

import pytest

from app.server.tool_replies import ToolStream
from app.toolcalls.calls import reply_calls
from app.toolcalls.json_prefix import scan
from app.toolcalls.syntax import FAMILIES
from app.toolcalls.tools import Tools


def _tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


TOOLS = Tools((_tool("get_weather"), _tool("get_time")))
# Replies as the models write them (two calls each, arguments with escapes and nesting)
REPLIES = {
    "hermes": 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo '
    '\\"centre\\"", "days": [1, 2.5e1], "opts": {"metric": true, "x": null}}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"city":"Rome","hour24":false}}\n'
    "</tool_call>",
    "deepseek": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    '{"city": "Oslo", "days": [1, 2]}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time'
    '<｜tool▁sep｜>{"city": "Rome", "hour24": true}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek-v4": "I will check.\n\n<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Oslo "centre" </｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="days" string="false">[1, 2]</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    '<｜DSML｜invoke name="get_time">\n'
    '<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    "deepseek-v3.2": "\n\n<｜DSML｜function_calls>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
}


def _stream(family: str, pieces: list[str], tools: Tools = TOOLS):
    """Feed the pieces; returns (content sent, calls assembled by index as a client does,
    the calls the stream reports, the number of argument fragments, whether any delta
    changed what an earlier one said)."""
    stream = ToolStream(FAMILIES[family], tools)
    content, calls, fragments = "", {}, 0

    def take(deltas) -> None:
        nonlocal fragments
        for d in deltas:
            if d.id is not None:
                assert d.index not in calls, "a call was opened twice"
                assert d.index == len(calls), "calls open in order"
                calls[d.index] = {"id": d.id, "name": d.name, "arguments": ""}
            calls[d.index]["arguments"] += d.arguments
            fragments += bool(d.arguments)

    for piece in pieces:
        content += stream.feed(piece)
        take(stream.deltas())
    rest, last, total, reported = stream.close()
    content += rest
    take(last)
    assert total == content
    assembled = [(c["id"], c["name"], c["arguments"]) for c in calls.values()]
    assert assembled == [(c.id, c.name, c.arguments) for c in reported]
    return content, [(n, a) for _, n, a in assembled], fragments


@pytest.mark.parametrize("family", sorted(REPLIES))
def test_split_anywhere_assembles_the_parsed_calls(family: str) -> None:
    text = REPLIES[family]
    content, calls = reply_calls(TOOLS, FAMILIES[family], text)
    expected = [(c.name, c.arguments) for c in calls]
    assert expected and all(isinstance(json.loads(a), dict) for _, a in expected)
    for k in range(len(text) + 1):
        sent, assembled, _ = _stream(family, [text[:k], text[k:]])
        assert (sent, assembled) == (content, expected), k
    sent, assembled, fragments = _stream(family, list(text))  # one character at a time
    assert (sent, assembled) == (content, expected)
    assert fragments > 2 * len(expected)  # the arguments came as they were written


@pytest.mark.parametrize("family", sorted(REPLIES))
def test_a_reply_cut_anywhere_still_gives_json_objects(family: str) -> None:
    """max_tokens may end the reply inside a call: what was sent stands, and is closed."""
    text = REPLIES[family]
    for k in range(len(text)):
        sent, assembled, _ = _stream(family, list(text[:k]))
        for _, arguments in assembled:
            assert isinstance(json.loads(arguments), dict), (k, arguments)
        if not assembled:  # nothing became a call: the text is content, all of it
            assert sent == text[:k], k
        else:  # the content before the calls, less the blank before their marker
            assert sent == text[: text.index(FAMILIES[family].start)].rstrip(), k


@pytest.mark.parametrize("family", sorted(REPLIES))
def test_text_that_is_no_call_is_content(family: str) -> None:
    for text in ("Sunny in Oslo <today>, see [1].", FAMILIES[family].start + "not a call at all"):
        sent, assembled, _ = _stream(family, list(text))
        assert (sent, assembled) == (text, [])


def test_calls_to_functions_not_offered_are_not_streamed() -> None:
    text = '<tool_call>\n{"name": "rm_rf", "arguments": {"path": "/"}}\n</tool_call>'
    assert _stream("hermes", list(text)) == (text, [], 0)


def test_one_call_only_when_parallel_calls_are_off() -> None:
    serial = Tools(TOOLS.functions, parallel=False)
    _, assembled, _ = _stream("hermes", list(REPLIES["hermes"]), serial)
    assert [name for name, _ in assembled] == ["get_weather"]


def test_a_call_that_breaks_off_keeps_what_was_sent() -> None:
    """Arguments that stop being JSON: the call stands with what was valid, closed."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "n": 1O}}'
    _, assembled, _ = _stream("hermes", list(text))
    assert assembled == [("get_weather", '{"city": "Oslo", "n": 1}')]
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": Oslo}}'
    _, assembled, _ = _stream("hermes", list(text))
    assert assembled == [("get_weather", "{}")]


def test_arguments_before_the_name_go_whole_at_the_end() -> None:
    text = '<tool_call>\n{"arguments": {"city": "Oslo"}, "name": "get_weather"}\n</tool_call>'
    _, assembled, fragments = _stream("hermes", list(text))
    assert assembled == [("get_weather", '{"city": "Oslo"}')] and fragments == 1


def test_families_that_do_not_stream_send_each_call_whole() -> None:
    text = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    assert _stream("llama3", list(text)) == ("", [("get_weather", '{"city": "Oslo"}')], 1)


def test_json_prefix_grows_and_always_closes() -> None:
    text = '{"a": "x\\"\\u00e9", "b": [1, -2.5e+3, {"c": null}], "d": true, "e": {}}'
    shown = ""
    for k in range(len(text) + 1):
        prefix = scan(text[:k])
        assert text[: prefix.safe].startswith(shown)
        shown = text[: prefix.safe]
        if shown:
            json.loads(shown + prefix.completion)
    assert scan(text).end == len(text)
    assert scan('{"a": 1O}').broken and not scan('{"a": 1').broken
