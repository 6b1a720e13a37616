"""Messages on screen: the user's text exactly as typed, replies as Markdown, the length mark."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QLabel, QTextBrowser, QToolButton, QWidget
from pytestqt.qtbot import QtBot

from app.ui.chat_view import ChatView
from app.ui.message_view import MessageView
from app.ui.message_widget import LENGTH_MARK


@pytest.fixture
def view(qtbot: QtBot) -> ChatView:
    widget = ChatView()
    qtbot.addWidget(widget)
    widget.resize(900, 700)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def _message(view: ChatView, message_id: str) -> QWidget:
    for widget in view.findChildren(QWidget, "message"):
        if widget.property("messageId") == message_id:
            return widget
    raise AssertionError(f"no widget for message {message_id}")


def _text(view: ChatView, message_id: str) -> QTextBrowser:
    return _message(view, message_id).findChild(QTextBrowser, "messageText")


def test_user_lines_indentation_and_markup_are_kept(view: ChatView) -> None:
    typed = "first line\nsecond line\n\n    indented()\n**not bold** <b>tag</b> # no heading"
    view.set_messages([MessageView("u1", "user", typed), MessageView("a1", "assistant", "**b**")])
    shown = _text(view, "u1").toPlainText().splitlines()
    assert shown == typed.split("\n")
    assert "<b>" not in _text(view, "u1").toHtml().replace("&lt;b&gt;", "")
    assert _text(view, "a1").toPlainText() == "b"  # replies stay Markdown


def test_a_600_line_paste_shows_600_lines(view: ChatView) -> None:
    pasted = "\n".join(f"row {i}: value" for i in range(600))
    view.set_messages([MessageView("u1", "user", pasted)])
    browser = _text(view, "u1")
    assert browser.toPlainText().splitlines() == pasted.split("\n")
    one = browser.fontMetrics().lineSpacing()
    assert browser.height() >= 600 * one  # laid out as 600 lines, not one paragraph


def test_a_reply_cut_at_the_length_limit_is_marked_with_continue(view: ChatView) -> None:
    cut = MessageView("a1", "assistant", "One, two", finish_reason="length")
    done = MessageView("a2", "assistant", "Done.", finish_reason="stop")
    view.set_messages([MessageView("u1", "user", "Count"), cut])
    widget = _message(view, "a1")
    assert widget.findChild(QLabel, "statusMark").text() == LENGTH_MARK
    assert widget.findChild(QLabel, "statusMark").isVisible()
    assert widget.findChild(QToolButton, "continueButton").isVisible()
    view.set_messages([MessageView("u1", "user", "Count"), done])
    widget = _message(view, "a2")
    assert not widget.findChild(QLabel, "statusMark").isVisible()
    assert not widget.findChild(QToolButton, "continueButton").isVisible()
