"""A long prompt in the window, on the real engine: the bubble says how far the prompt has
been read, Esc stops within a chunk, and a reply stopped before it started offers Retry."""

from __future__ import annotations

import re

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QFrame, QLabel, QTextBrowser, QToolButton, QWidget

from app.ui.message_widget import EMPTY_STOP_MARK
from tests.gui.harness import Harness

# About 980 tokens: four of the window's prefill chunks (USER_CHUNK), so Esc, pressed once the
# first is shown, has two more and part of a third to land in before the prompt is read, on
# the default model (the tiny one reads a chunk too fast to stop). Fewer than the 1,631 it was:
# Retry reads the rest of the prompt, which took 38 of this test's 46 s.
LONG = "The harbour town woke slowly in winter, and the ferry sounded its horn twice. " * 60
_SHOWN = re.compile(r"Reading the prompt… ([\d,]+) / ([\d,]+) tokens")


def _widget(window, message_id: str) -> QWidget:
    for widget in window.chat.findChildren(QWidget, "message"):
        if widget.property("messageId") == message_id:
            return widget
    raise LookupError(message_id)


def test_progress_shows_and_esc_stops_before_the_reply_started(harness: Harness):
    window = harness.start()
    conversation = window.conversation_id
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 4})
    shown: list[tuple[int, int]] = []

    def bubble_text() -> str:
        reply = window._streaming_id
        if reply is None:
            return ""
        return _widget(window, reply).findChild(QTextBrowser, "messageText").toPlainText()

    def watch() -> bool:
        found = _SHOWN.search(bubble_text())
        if found:
            shown.append(tuple(int(n.replace(",", "")) for n in found.groups()))
        return any(done > 0 for done, _ in shown)  # a chunk of the prompt is read

    harness.act(lambda: window.spawn(window.send_message(LONG)))
    harness.wait_until(watch)
    harness.act(lambda: QTest.keyClick(window, Qt.Key.Key_Escape))
    harness.turn()
    done, total = next(seen for seen in shown if seen[0] > 0)
    assert 0 < done < total

    reply = window.store.current_path(conversation)[-1]
    assert reply.role == "assistant" and reply.status == "interrupted" and reply.content == ""
    assert reply.stats["prefilled_tokens"] < reply.stats["prompt_tokens"] == total
    widget = _widget(window, reply.id)
    assert widget.findChild(QLabel, "statusMark").text() == EMPTY_STOP_MARK
    assert not widget.findChild(QFrame, "messageBubble").isVisible()  # no empty bubble
    retry = widget.findChild(QToolButton, "continueButton")
    assert retry.isVisible() and retry.text() == "Retry"

    harness.act(retry.click)
    harness.turn()
    answered = window.store.get_message(reply.id)
    assert answered.status == "complete" and answered.content
    assert [m.role for m in window.store.current_path(conversation)] == ["user", "assistant"]
