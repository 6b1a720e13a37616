"""API conversations in the window: the API server beside it (Settings > API Server, on the
window's own engine) keeps what clients ask and get as conversations of the window's store.

Real parts throughout: the window offscreen on the default model, its SQLite store, the
server on loopback, and the official openai and anthropic SDKs in a thread beside the loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QListWidgetItem, QWidget

from app.conversations import Conversation
from app.settings import Settings
from app.ui.sidebar import _ID, _TAG, API_TAG
from app.ui.tool_rows import ToolRow
from tests.gui.harness import Harness

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
SYSTEM = "You are a weather assistant. Use the tools."
QUESTION = "What is the weather in Paris?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _served(harness: Harness) -> list[Conversation]:
    return [c for c in harness.window.store.list_conversations() if c.served_at is not None]


def _row(harness: Harness, conversation_id: str) -> QListWidgetItem:
    sidebar = harness.window.sidebar.list
    items = (sidebar.item(i) for i in range(sidebar.count()))
    return next(item for item in items if item.data(_ID) == conversation_id)


def _message(view: QWidget, message_id: str) -> QWidget:
    for widget in view.findChildren(QWidget, "message"):
        if widget.property("messageId") == message_id:
            return widget
    raise LookupError(message_id)


def _rows(widget: QWidget) -> list[ToolRow]:
    return [row for row in widget.findChildren(ToolRow) if row.isVisibleTo(widget)]


@pytest.fixture
def serving(harness: Harness) -> tuple[Harness, str, str, str]:
    """The window with its API server on (the setting left on), and (url, key, model)."""
    port = _free_port()
    settings = Settings.load()
    settings.serve_on_start, settings.serve_port = True, port
    settings.save()
    assert settings.keep_api_conversations  # on by default
    window = harness.start()
    assert window.api_server.running and window.api_server.keeping
    key = window.api_server.api_key().value
    return harness, f"http://127.0.0.1:{port}", key, window.api_server.server.model_id


def _beside(harness: Harness, work: Callable[[], Any]) -> Any:
    """A client call in another thread, while the window's loop serves it."""
    return harness.run(asyncio.get_event_loop().run_in_executor(None, work))


def test_an_api_tool_loop_is_a_conversation_of_the_window(serving) -> None:
    harness, url, key, model = serving
    window = harness.window
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]

    def round_1() -> Any:
        return client.chat.completions.create(
            model=model,
            messages=messages,
            tools=[WEATHER],
            tool_choice="required",
            temperature=0,
            max_tokens=48,
        )

    first = _beside(harness, round_1)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    harness.wait_until(lambda: len(_served(harness)) == 1)
    conversation = _served(harness)[0]
    assert conversation.title == QUESTION and "OpenAI" in (conversation.served_to or "")

    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"})

    def round_2() -> tuple[str, Any]:
        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=[WEATHER],
            tool_choice="auto",
            temperature=0,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            usage = chunk.usage or usage
        return text, usage

    _, second = _beside(harness, round_2)
    # the follow-up continues that conversation: no second one
    harness.wait_until(lambda: len(window.store.current_path(conversation.id)) == 4)
    assert [c.id for c in _served(harness)] == [conversation.id]
    path = window.store.current_path(conversation.id)
    assert [m.role for m in path] == ["user", "assistant", "tool", "assistant"]
    assert path[1].tool_calls[0].name == "get_weather" and path[1].token_ids
    assert (path[2].tool_name, path[2].content) == ("get_weather", "18 C and sunny")
    assert window.store.get_conversation(conversation.id).system_prompt.startswith(SYSTEM)

    row = _row(harness, conversation.id)  # in the sidebar, marked
    assert row.data(_TAG) == API_TAG
    assert "from the API" in row.data(Qt.ItemDataRole.AccessibleTextRole)
    assert "Through the API, for OpenAI" in row.toolTip()

    harness.act(lambda: window.open_conversation(conversation.id))
    harness.run(window.prewarm.idle())
    assert window.title_label.text().endswith(" · API")
    assert "Through the API" in window.title_label.toolTip()
    calls = _rows(_message(window.chat, path[1].id))
    result = _message(window.chat, path[2].id).row
    assert [r.toggle.text() for r in calls] == ["▸  Called get_weather"]
    assert result.toggle.text() == "▸  Result of get_weather"
    assert not any(r.is_open for r in [*calls, result])  # collapsed

    # opening it found the API's KV: the served prompt and reply are not read again
    held = second.prompt_tokens + second.completion_tokens
    opened = window.prewarm.last[conversation.id]
    assert opened.reused_tokens >= held - 1, (opened, held)
    window.store.set_sampling(conversation.id, {"temperature": 0, "max_tokens": 8})
    harness.type_and_send("Thanks! And tomorrow?")
    harness.turn()
    turn = window.store.current_path(conversation.id)[-1]
    assert turn.status == "complete" and window.banner.isHidden()
    stats = turn.stats
    assert stats["reused_tokens"] >= held - 1
    assert stats["prefilled_tokens"] == stats["prompt_tokens"] - stats["reused_tokens"]
    print(
        f"API tool loop: round 2 prompt {second.prompt_tokens} (cached "
        f"{second.prompt_tokens_details.cached_tokens}), {second.completion_tokens} generated; "
        f"opened in the window: reused {opened.reused_tokens}, prefilled "
        f"{opened.prefilled_tokens}; window turn prompt {stats['prompt_tokens']}, reused "
        f"{stats['reused_tokens']}, prefilled {stats['prefilled_tokens']}"
    )


def test_anthropic_and_responses_requests_land_too(serving) -> None:
    harness, url, key, model = serving
    messages = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0).messages
    asked = [{"role": "user", "content": "Say hello to Oslo."}]

    def ask_streamed() -> Any:
        with messages.stream(model=model, max_tokens=8, messages=asked) as stream:
            return stream.get_final_message()

    reply = _beside(harness, ask_streamed)
    assert reply.content and reply.content[0].type == "text"
    harness.wait_until(lambda: len(_served(harness)) == 1)
    landed = _served(harness)[0]
    assert landed.title == "Say hello to Oslo." and "Anthropic" in (landed.served_to or "")
    path = harness.window.store.current_path(landed.id)
    assert [m.role for m in path] == ["user", "assistant"]
    assert path[1].content == reply.content[0].text and path[1].token_ids

    # the client's next turn, its history in content blocks, goes on in the same conversation
    asked += [
        {"role": "assistant", "content": [{"type": "text", "text": reply.content[0].text}]},
        {"role": "user", "content": [{"type": "text", "text": "And to Bergen?"}]},
    ]
    again = _beside(harness, lambda: messages.create(model=model, max_tokens=8, messages=asked))
    harness.wait_until(lambda: len(harness.window.store.current_path(landed.id)) == 4)
    assert [c.id for c in _served(harness)] == [landed.id]
    assert again.usage.cache_read_input_tokens > 0

    responses = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0).responses

    def respond() -> Any:
        return responses.create(model=model, input="Name one colour.", max_output_tokens=8)

    answered = _beside(harness, respond)
    harness.wait_until(lambda: len(_served(harness)) == 2)
    newest = _served(harness)[0]
    assert newest.title == "Name one colour."
    assert harness.window.store.current_path(newest.id)[-1].content == answered.output_text


def test_a_store_that_refuses_still_serves_and_says_why(
    serving, caplog: pytest.LogCaptureFixture
) -> None:
    harness, url, key, model = serving
    store = harness.window.store
    store._conn.execute("PRAGMA query_only = ON")  # writes fail as on a read-only file
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)

    def ask() -> Any:
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )

    with caplog.at_level(logging.WARNING, logger="stoke.ui"):
        reply = _beside(harness, ask)
        harness.wait_until(lambda: "could not keep" in caplog.text)
    assert reply.choices[0].message.content is not None and reply.usage.completion_tokens > 0
    assert "Cannot use the conversation database" in caplog.text
    assert "Traceback" not in caplog.text
    store._conn.execute("PRAGMA query_only = OFF")
    assert _served(harness) == []


def test_the_setting_turns_keeping_off_and_on(serving) -> None:
    harness, url, key, model = serving
    window = harness.window
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)

    def ask(text: str) -> Callable[[], Any]:
        return lambda: client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": text}], max_tokens=4
        )

    dialog = window.open_api_server_settings()
    assert dialog.keep.isChecked() and dialog.keep.isEnabled()
    harness.act(lambda: dialog.keep.setChecked(False))
    assert not Settings.load().keep_api_conversations and not window.api_server.keeping
    assert _beside(harness, ask("Not kept, please.")).choices[0].message.content is not None
    harness.act(lambda: dialog.keep.setChecked(True))
    _beside(harness, ask("Kept again."))
    # had the first been kept, it would have landed before the second
    harness.wait_until(lambda: len(_served(harness)) >= 1)
    assert [c.title for c in _served(harness)] == ["Kept again."]
    assert Settings.load().keep_api_conversations
