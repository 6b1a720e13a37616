"""Tool calls and tool results in the window, offscreen: closed rows that open with the mouse
or the keyboard, long results cut with a way to see all, both themes, and an imported agent
conversation that goes on as a chat on the real engine (the tests' tiny model,
tests/tiny_model.py: what is proven is the rows and the KV the next turn reuses, not the
model's words)."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QColor
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot

from app.conversations import ToolCall
from app.ui.chat_view import ChatView
from app.ui.message_view import MessageView
from app.ui.tool_rows import SHOWN_LINES, ToolResultWidget, ToolRow
from tests.gui.harness import Harness

FORECAST = "\n".join(f"{hour:02d}:00  {10 + hour % 7} C" for hour in range(48))
AGENT_LOG = [
    {"role": "system", "content": "You are a weather assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_paris",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris","unit":"c"}'},
            },
            {
                "id": "call_hours",
                "type": "function",
                "function": {"name": "get_forecast", "arguments": {"city": "Paris"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_paris", "content": "18 C and sunny"},
    {"role": "tool", "tool_call_id": "call_hours", "content": FORECAST},
    {"role": "assistant", "content": "It is 18 C and sunny in Paris."},
]


def _rows(widget: QWidget) -> list[ToolRow]:
    return [row for row in widget.findChildren(ToolRow) if row.isVisibleTo(widget)]


def _message(view: QWidget, message_id: str) -> QWidget:
    for widget in view.findChildren(QWidget, "message"):
        if widget.property("messageId") == message_id:
            return widget
    raise LookupError(message_id)


def _open_with_keyboard(row: ToolRow) -> None:
    """Tab reaches the row's toggle; Space opens it."""
    assert row.toggle.focusPolicy() & Qt.FocusPolicy.TabFocus
    row.toggle.setFocus(Qt.FocusReason.TabFocusReason)
    QTest.keyClick(row.toggle, Qt.Key.Key_Space)


def test_rows_start_closed_and_open_to_arguments_and_results(qtbot: QtBot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(900, 900)
    calls = (
        ToolCall("call_1", "get_weather", '{"city":"Paris","unit":"c"}'),
        ToolCall("call_2", "get_forecast", "not json at all"),
    )
    view.set_messages(
        [
            MessageView("u1", "user", "Weather?"),
            MessageView("a1", "assistant", "", tool_calls=calls),
            MessageView("t1", "tool", "18 C", tool_name="get_weather"),
            MessageView("t2", "tool", FORECAST, tool_name="get_forecast"),
            MessageView("a2", "assistant", "It is 18 C."),
        ]
    )
    view.show()
    qtbot.waitExposed(view)

    reply = _message(view, "a1")
    weather, forecast = _rows(reply)
    assert [row.toggle.text() for row in (weather, forecast)] == [
        "▸  Called get_weather",
        "▸  Called get_forecast",
    ]
    assert not reply.findChild(QWidget, "messageText").isVisibleTo(reply)  # calls, no text
    results = [_message(view, "t1"), _message(view, "t2")]
    assert all(isinstance(r, ToolResultWidget) for r in results)
    assert [r.row.toggle.text() for r in results] == [
        "▸  Result of get_weather",
        "▸  Result of get_forecast",
    ]
    every = [weather, forecast, *(r.row for r in results)]
    assert not any(row.is_open or row.body is not None for row in every)  # closed, unbuilt
    assert weather.toggle.accessibleName() == "Show the arguments of get_weather"

    _open_with_keyboard(weather)
    assert weather.is_open and weather.body.isVisibleTo(weather)
    assert weather.body_text.toPlainText().splitlines()[-4:] == [
        "{",
        '  "city": "Paris",',
        '  "unit": "c"',
        "}",
    ]
    assert weather.toggle.text() == "▾  Called get_weather"
    assert weather.toggle.accessibleName() == "Hide the arguments of get_weather"
    QTest.mouseClick(forecast.toggle, Qt.MouseButton.LeftButton)
    assert "not json at all" in forecast.body_text.toPlainText()  # shown as it came

    short, long = (r.row for r in results)
    _open_with_keyboard(short)
    assert "18 C" in short.body_text.toPlainText() and short.show_all is None
    _open_with_keyboard(long)
    shown = long.body_text.toPlainText()
    assert "00:00  10 C" in shown and "47:00" not in shown and shown.rstrip().endswith("…")
    assert (
        long.show_all is not None
        and long.show_all.text() == f"Show all {len(FORECAST):,} characters"
    )
    QTest.keyClick(long.show_all, Qt.Key.Key_Space)
    assert "47:00  15 C" in long.body_text.toPlainText()
    assert not long.show_all.isVisibleTo(long)
    assert len(long.body_text.toPlainText().splitlines()) > SHOWN_LINES

    copied: list[str] = []
    view.copied.connect(copied.append)
    long.body_text.anchorClicked.emit(QUrl("copy:0"))  # the block's Copy link
    assert copied == [FORECAST]  # the whole result, not the lines on screen

    QTest.keyClick(weather.toggle, Qt.Key.Key_Space)
    assert not weather.is_open and not weather.body.isVisibleTo(weather)


def _background(widget: QWidget) -> QColor:
    image = widget.grab().toImage()
    return QColor(image.pixel(image.width() // 2, image.height() // 2))


def test_an_imported_agent_conversation_shows_closed_rows_and_the_chat_goes_on(
    harness: Harness, tmp_path: Path, tiny_model: str
) -> None:
    window = harness.start(tiny_model)
    log = tmp_path / "agent-log.json"
    log.write_text(json.dumps({"model": "gpt-4o", "messages": AGENT_LOG}), "utf-8")

    harness.act(lambda: window.import_from(log))  # File > Import, on the running loop
    harness.run(window.prewarm.idle())

    cid = window.conversation_id
    path = window.store.current_path(cid)
    assert [m.role for m in path] == ["user", "assistant", "tool", "tool", "assistant"]
    reply = _message(window.chat, path[1].id)
    calls = _rows(reply)
    assert [row.toggle.text() for row in calls] == [
        "▸  Called get_weather",
        "▸  Called get_forecast",
    ]
    results = [_message(window.chat, m.id) for m in path[2:4]]
    assert [r.row.toggle.text() for r in results] == [
        "▸  Result of get_weather",  # its name from the call its id names
        "▸  Result of get_forecast",
    ]
    assert not any(row.is_open for row in [*calls, *(r.row for r in results)])

    harness.act(lambda: _open_with_keyboard(calls[0]))
    assert '"city": "Paris"' in calls[0].body_text.toPlainText()
    harness.act(lambda: QTest.mouseClick(results[0].row.toggle, Qt.MouseButton.LeftButton))
    assert "18 C and sunny" in results[0].row.body_text.toPlainText()

    light = _background(results[1].frame)
    harness.act(lambda: window.apply_theme("dark"))
    dark = _background(_message(window.chat, path[3].id).frame)
    assert light.lightness() > 200 and dark.lightness() < 80  # each theme's own colours
    harness.act(lambda: window.apply_theme("light"))

    window.store.set_sampling(cid, {"temperature": 0, "max_tokens": 12})
    harness.type_and_send("Thanks! And tomorrow?")
    harness.turn()
    first = window.store.current_path(cid)
    assert [m.role for m in first[-2:]] == ["user", "assistant"]
    assert first[-1].status == "complete" and first[-1].content.strip()
    assert window.banner.isHidden()
    assert len(_rows(_message(window.chat, path[1].id))) == 2  # the calls are still shown

    harness.type_and_send("One word: warm or cold?")
    harness.turn()
    second = window.store.current_path(cid)[-1]
    assert second.status == "complete"
    stats, before = second.stats, first[-1].stats
    # the tool messages render to the same tokens every turn: the new turn only appends, so
    # the engine reuses all it held after the last reply (its last token at most excepted)
    assert stats["reused_tokens"] >= before["prompt_tokens"] + before["generated_tokens"] - 1
    print(
        f"tool conversation: turn 1 prompt {before['prompt_tokens']} tokens, "
        f"{before['generated_tokens']} generated; "
        f"turn 2 prompt {stats['prompt_tokens']}, reused {stats['reused_tokens']}, "
        f"prefilled {stats['prefilled_tokens']}"
    )
