"""Tool calls and tool results through export and import, against a real store: Stoke's own
JSON, OpenAI-style message lists, and the Markdown for people."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.conversations import ConversationStore, Message, ToolCall
from app.conversations.export import (
    ImportFormatError,
    export_json,
    export_markdown,
    import_json,
)

WEATHER = ToolCall("call_paris", "get_weather", '{"city": "Paris", "unit": "celsius"}')
TIME = ToolCall("call_time", "get_time", '{"zone":"Europe/Paris"}')


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ConversationStore]:
    with ConversationStore.open(tmp_path / "conversations.db") as opened:
        yield opened


@pytest.fixture
def tool_loop(store: ConversationStore) -> str:
    """A question, a reply that makes two calls (its exact tokens kept), both results, the
    answer, and a regenerated answer beside it."""
    cid = store.create_conversation("Paris now", "Use the tools.").id
    question = store.add_message(cid, None, "user", "Weather and time in Paris?")
    calls = store.add_message(
        cid,
        question.id,
        "assistant",
        "Let me look.",
        tool_calls=(WEATHER, TIME),
        token_ids=[7, 8, 9],
        tokens_fingerprint="fp",
        finish_reason="tool_calls",
    )
    weather = store.add_message(
        cid,
        calls.id,
        "tool",
        "18 C and ```sunny```",
        tool_call_id="call_paris",
        tool_name="get_weather",
    )
    time = store.add_message(
        cid, weather.id, "tool", "14:05", tool_call_id="call_time", tool_name="get_time"
    )
    store.add_message(cid, time.id, "assistant", "It is 18 C.")
    store.add_message(cid, time.id, "assistant", "18 C at 14:05.")
    return cid


def _tools(messages: list[Message]) -> list[tuple]:
    return [
        (m.role, m.content, m.tool_calls, m.tool_call_id, m.tool_name, m.token_ids)
        for m in messages
    ]


def test_stoke_export_round_trip_keeps_calls_and_results(
    store: ConversationStore, tool_loop: str
) -> None:
    exported = json.loads(json.dumps(export_json(store, tool_loop)))

    assert exported["version"] == 2  # older Stokes would drop the calls: they are told
    records = exported["messages"]
    assert records[1]["tool_calls"] == [
        {"id": "call_paris", "name": "get_weather", "arguments": WEATHER.arguments},
        {"id": "call_time", "name": "get_time", "arguments": TIME.arguments},
    ]
    assert (records[2]["tool_call_id"], records[2]["tool_name"]) == ("call_paris", "get_weather")
    assert "tool_calls" not in records[0] and "tool_call_id" not in records[0]

    imported = import_json(store, exported)

    assert _tools(store.current_path(imported.id)) == _tools(store.current_path(tool_loop))
    answer = store.current_path(imported.id)[-1]
    assert [m.content for m in store.siblings(answer.id)[0]] == ["It is 18 C.", "18 C at 14:05."]


def test_markdown_shows_calls_and_results(store: ConversationStore, tool_loop: str) -> None:
    text = export_markdown(store, tool_loop)

    assert (
        '*Called get_weather*\n\n```json\n{\n  "city": "Paris",\n  "unit": "celsius"\n}\n```'
        in (text)
    )
    assert "*Called get_time*" in text
    # the result's own backticks cannot close its block: the fence is longer
    assert "**Result of get_weather**\n\n````\n18 C and ```sunny```\n````" in text
    assert "**Result of get_time**\n\n```\n14:05\n```" in text


AGENT_LOG = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": "Weather and time in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_paris",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "call_time",
                "type": "function",
                "function": {"name": "get_time", "arguments": {"zone": "Europe/Paris"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_paris", "content": "18 C"},
    {
        "role": "tool",
        "tool_call_id": "call_time",
        "name": "get_time",
        "content": [{"type": "text", "text": "14:"}, {"type": "text", "text": "05"}],
    },
    {"role": "assistant", "content": "18 C at 14:05."},
    {"role": "user", "content": "Thanks"},
]


@pytest.mark.parametrize("wrap", [False, True], ids=["list", "request body"])
def test_openai_messages_import_with_tool_calls(store: ConversationStore, wrap: bool) -> None:
    data: Any = {"model": "gpt-4o", "tools": [], "messages": AGENT_LOG} if wrap else AGENT_LOG

    conversation = import_json(store, json.loads(json.dumps(data)))

    assert conversation.system_prompt == "You are a weather bot.\n\nBe brief."
    assert conversation.title == "Weather and time in Paris?"
    assert conversation.imported_at is not None
    assert conversation.model is None  # another server's model name is no model of this one
    path = store.current_path(conversation.id)
    assert [m.role for m in path] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    assert path[1].content == ""
    assert path[1].tool_calls == (
        ToolCall("call_paris", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_time", "get_time", '{"zone": "Europe/Paris"}'),
    )
    # a result without a name takes its call's
    assert [(m.tool_call_id, m.tool_name, m.content) for m in path[2:4]] == [
        ("call_paris", "get_weather", "18 C"),
        ("call_time", "get_time", "14:05"),
    ]
    assert export_json(store, conversation.id)["messages"][1]["tool_calls"][1] == {
        "id": "call_time",
        "name": "get_time",
        "arguments": '{"zone": "Europe/Paris"}',
    }


def _log(**change: Any) -> list[dict[str, Any]]:
    """AGENT_LOG with message `index` replaced (or dropped when the value is None)."""
    log = json.loads(json.dumps(AGENT_LOG))
    for index, message in change.items():
        at = int(index.removeprefix("m"))
        if message is None:
            del log[at]
        else:
            log[at] = message
    return log


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ([], "its list of chat messages is empty"),
        ({"messages": "hello"}, "must be a list of chat messages"),
        (AGENT_LOG[:2], "only system messages"),
        (_log(m3=None), "Message 4 is a tool result, but the message before it makes no tool"),
        (_log(m6={"role": "system", "content": "x"}), "Message 7 is a system message in the"),
        (_log(m2={"role": "function", "content": "x"}), "Message 3 has the role 'function'"),
        (
            _log(m2={"role": "user", "content": [{"type": "image_url", "image_url": {}}]}),
            "Message 3 holds a part of type 'image_url'; Stoke imports text parts only.",
        ),
        (_log(m3={"role": "assistant", "tool_calls": {"id": "x"}}), "must be a list of calls"),
        (
            _log(m3={"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}),
            "Message 4's tool call 1 needs a function name of 1 to 64 characters.",
        ),
        (_log(m4={"role": "tool", "tool_call_id": 5, "content": "x"}), "tool_call_id must be text"),
        (_log(m2={"role": "user"}), "Message 3's content must be text or a list of text parts."),
    ],
)
def test_bad_message_lists_are_refused_in_words(
    store: ConversationStore, data: Any, words: str
) -> None:
    before = store.list_conversations(include_deleted=True)

    with pytest.raises(ImportFormatError, match=re.escape(words)):
        import_json(store, data)

    assert store.list_conversations(include_deleted=True) == before


def _broken(store: ConversationStore, conversation_id: str, how: str) -> dict[str, Any]:
    data = json.loads(json.dumps(export_json(store, conversation_id)))
    records = data["messages"]
    if how == "result after a question":
        records[2]["parent_id"] = records[0]["id"]
    elif how == "a user's calls":
        records[0]["tool_calls"] = records[1]["tool_calls"]
    elif how == "an answer naming a call":
        records[4]["tool_call_id"] = "call_paris"
    return data


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ("result after a question", "Message 3 is a tool result, but the message before it"),
        ("a user's calls", "Message 1 makes tool calls, which only an assistant message does."),
        ("an answer naming a call", "Message 5 names a tool call it answers"),
    ],
)
def test_bad_tool_records_in_an_export_are_refused(
    store: ConversationStore, tool_loop: str, how: str, words: str
) -> None:
    data = _broken(store, tool_loop, how)
    before = store.list_conversations(include_deleted=True)

    with pytest.raises(ImportFormatError, match=re.escape(words)):
        import_json(store, data)

    assert store.list_conversations(include_deleted=True) == before
