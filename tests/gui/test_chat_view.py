"""The chat view on screen: bubbles, copying, editing, branches, streaming and paging."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QTextBrowser,
    QToolButton,
    QWidget,
)
from pytestqt.qtbot import QtBot

from app.ui.chat_view import EMPTY_HINT, PAGE_SIZE, ChatView
from app.ui.message_view import MessageView

STATS = {
    "ttft_s": 0.08,
    "prefill_tok_s": 412.0,
    "decode_tok_s": 140.0,
    "prompt_tokens": 3431,
    "reused_tokens": 3412,
    "prefilled_tokens": 19,
    "generated_tokens": 120,
    "finish_reason": "stop",
}
CODE = 'items = [3, 1, 2]\nprint(sorted(items))  # "<b>" stays text'


def _conversation() -> list[MessageView]:
    return [
        MessageView("u1", "user", "How do I sort a list?"),
        MessageView(
            "a1",
            "assistant",
            f"Use `sorted()`:\n\n```python\n{CODE}\n```\n",
            stats=STATS,
            sibling_ids=("a0", "a1", "a2"),
        ),
    ]


@pytest.fixture
def view(qtbot: QtBot) -> ChatView:
    widget = ChatView()
    qtbot.addWidget(widget)
    widget.resize(900, 700)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def _messages(view: ChatView) -> list[QWidget]:
    return view.findChildren(QWidget, "message")


def _message(view: ChatView, message_id: str) -> QWidget:
    for widget in _messages(view):
        if widget.property("messageId") == message_id:
            return widget
    raise AssertionError(f"no widget for message {message_id}")


def _button(parent: QWidget, name: str) -> QToolButton:
    button = parent.findChild(QToolButton, name)
    assert button is not None, name
    return button


def test_set_messages_renders_bubbles(view: ChatView) -> None:
    view.set_messages(_conversation())
    assert [w.property("messageId") for w in _messages(view)] == ["u1", "a1"]
    user = _message(view, "u1").findChild(QWidget, "messageBubble")
    assert user.accessibleName() == "User message"
    text = _message(view, "u1").findChild(QTextBrowser, "messageText")
    assert text.toPlainText() == "How do I sort a list?"
    answer = _message(view, "a1").findChild(QTextBrowser, "messageText")
    assert "print(sorted(items))" in answer.toPlainText()


def test_raw_html_in_a_message_is_shown_as_text(view: ChatView) -> None:
    view.set_messages([MessageView("u1", "user", "Is <b>this</b> bold?")])
    text = _message(view, "u1").findChild(QTextBrowser, "messageText")
    assert text.toPlainText() == "Is <b>this</b> bold?"


def test_code_copy_link_puts_the_code_on_the_clipboard(qtbot: QtBot, view: ChatView) -> None:
    view.set_messages(_conversation())
    answer = _message(view, "a1").findChild(QTextBrowser, "messageText")
    with qtbot.waitSignal(view.copied) as blocker:
        answer.anchorClicked.emit(QUrl("copy:0"))
    assert blocker.args == [CODE]
    assert QGuiApplication.clipboard().text() == CODE


def test_a_code_blocks_copy_link_says_copied_then_copy_again(qtbot: QtBot, view: ChatView) -> None:
    """Feedback where the user clicked (issue 36 item 8), not only in the status bar."""
    view.set_messages(_conversation())
    answer = _message(view, "a1").findChild(QTextBrowser, "messageText")
    assert "Copy\n" in answer.toPlainText() and "Copied" not in answer.toPlainText()
    answer.anchorClicked.emit(QUrl("copy:0"))
    assert "Copied" in answer.toPlainText()
    qtbot.waitUntil(lambda: "Copied" not in answer.toPlainText(), timeout=10_000)
    assert "Copy\n" in answer.toPlainText()
    answer.anchorClicked.emit(QUrl("copy:0"))  # the link still copies after it was relabelled
    assert QGuiApplication.clipboard().text() == CODE


def test_copy_message_copies_the_answer_without_reasoning(qtbot: QtBot, view: ChatView) -> None:
    view.set_messages([MessageView("a1", "assistant", "<think>hmm</think>The answer.")])
    with qtbot.waitSignal(view.copied) as blocker:
        _button(_message(view, "a1"), "copyButton").click()
    assert blocker.args == ["The answer."]


def test_edit_flow_emits_the_new_text(qtbot: QtBot, view: ChatView) -> None:
    view.set_messages(_conversation())
    user = _message(view, "u1")
    _button(user, "editButton").click()
    editor = user.findChild(QPlainTextEdit, "messageEditor")
    assert editor.isVisible()
    assert editor.toPlainText() == "How do I sort a list?"
    editor.setPlainText("How do I sort a list in reverse?")
    with qtbot.waitSignal(view.edit_requested) as blocker:
        user.findChild(QPushButton, "sendEdit").click()
    assert blocker.args == ["u1", "How do I sort a list in reverse?"]
    assert not editor.isVisible()
    assert user.findChild(QTextBrowser, "messageText").isVisible()


def test_edit_cancel_emits_nothing(qtbot: QtBot, view: ChatView) -> None:
    view.set_messages(_conversation())
    user = _message(view, "u1")
    _button(user, "editButton").click()
    user.findChild(QPlainTextEdit, "messageEditor").setPlainText("changed")
    with qtbot.assertNotEmitted(view.edit_requested):
        user.findChild(QPushButton, "cancelEdit").click()
    assert user.findChild(QTextBrowser, "messageText").toPlainText() == "How do I sort a list?"


def test_editor_keys_enter_sends_escape_cancels(qtbot: QtBot, view: ChatView) -> None:
    view.set_messages(_conversation())
    user = _message(view, "u1")
    _button(user, "editButton").click()
    editor = user.findChild(QPlainTextEdit, "messageEditor")
    with qtbot.assertNotEmitted(view.edit_requested):
        qtbot.keyClick(editor, Qt.Key.Key_Escape)
    assert not editor.isVisible()
    _button(user, "editButton").click()
    editor.setPlainText("Sort it")
    qtbot.keyClick(editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert editor.toPlainText().count("\n") == 1  # Shift+Enter adds a line, sends nothing
    with qtbot.waitSignal(view.edit_requested) as blocker:
        qtbot.keyClick(editor, Qt.Key.Key_Return)
    assert blocker.args == ["u1", "Sort it"]


def test_regenerate_emits_the_reply_id(qtbot: QtBot, view: ChatView) -> None:
    view.set_messages(_conversation())
    assert not _button(_message(view, "u1"), "regenerateButton").isVisible()
    with qtbot.waitSignal(view.regenerate_requested) as blocker:
        _button(_message(view, "a1"), "regenerateButton").click()
    assert blocker.args == ["a1"]


def test_branch_navigator_shows_position_and_emits_neighbours(qtbot: QtBot, view: ChatView) -> None:
    view.set_messages(_conversation())
    reply = _message(view, "a1")
    label = reply.findChild(QLabel, "branchLabel")
    assert label.text() == "2/3"
    assert label.isVisible()
    with qtbot.waitSignal(view.branch_requested) as blocker:
        _button(reply, "branchPrevious").click()
    assert blocker.args == ["a0"]
    with qtbot.waitSignal(view.branch_requested) as blocker:
        _button(reply, "branchNext").click()
    assert blocker.args == ["a2"]
    assert not _button(_message(view, "u1"), "branchNext").isVisible()


def test_branch_navigator_disables_the_ends(view: ChatView) -> None:
    view.set_messages([MessageView("a0", "assistant", "first", sibling_ids=("a0", "a1"))])
    reply = _message(view, "a0")
    assert not _button(reply, "branchPrevious").isEnabled()
    assert _button(reply, "branchNext").isEnabled()


def test_stats_tooltip_on_the_reply(view: ChatView) -> None:
    view.set_messages(_conversation())
    bubble = _message(view, "a1").findChild(QWidget, "messageBubble")
    assert bubble.toolTip().startswith(
        "TTFT 0.08 s · prefill 412 tok/s · decode 140 tok/s · reused 3,412 of 3,431"
    )


def test_streaming_shows_the_full_text(qtbot: QtBot, view: ChatView) -> None:
    view.set_messages(_conversation()[:1])
    view.begin_reply(MessageView("a9", "assistant", "", status="streaming"))
    reply = _message(view, "a9")
    assert not _button(reply, "copyButton").isVisible()
    text = reply.findChild(QTextBrowser, "messageText")
    for piece in ["Hello", ", ", "wor", "ld"]:
        view.append_reply("a9", piece)
    qtbot.waitUntil(lambda: text.toPlainText() == "Hello, world")
    view.finish_reply(MessageView("a9", "assistant", "Hello, world!", stats=STATS))
    assert text.toPlainText() == "Hello, world!"
    assert _button(reply, "copyButton").isVisible()
    assert "decode 140 tok/s" in reply.findChild(QWidget, "messageBubble").toolTip()


def test_streaming_reasoning_is_collapsed_under_a_toggle(qtbot: QtBot, view: ChatView) -> None:
    view.begin_reply(MessageView("a1", "assistant", "", status="streaming"))
    reply = _message(view, "a1")
    toggle = _button(reply, "reasoningToggle")
    view.append_reply("a1", "<think>Let me plan")
    qtbot.waitUntil(lambda: "Thinking…" in toggle.text())
    view.append_reply("a1", " this.</think>The answer.")
    view.finish_reply(MessageView("a1", "assistant", "<think>Let me plan this.</think>The answer."))
    assert "Reasoning" in toggle.text()
    assert reply.findChild(QTextBrowser, "messageText").toPlainText() == "The answer."
    assert reply.findChild(QTextBrowser, "reasoningText") is None
    toggle.click()
    reasoning = reply.findChild(QTextBrowser, "reasoningText")
    assert reasoning.isVisible()
    assert reasoning.toPlainText() == "Let me plan this."
    toggle.click()
    assert not reasoning.isVisible()


def test_interrupted_reply_offers_continue(qtbot: QtBot, view: ChatView) -> None:
    view.set_messages([MessageView("a1", "assistant", "Half a rep", status="interrupted")])
    reply = _message(view, "a1")
    assert reply.findChild(QLabel, "statusMark").text() == "Interrupted"
    button = _button(reply, "continueButton")
    assert button.isVisible()
    with qtbot.waitSignal(view.continue_requested) as blocker:
        button.click()
    assert blocker.args == ["a1"]


def test_complete_reply_has_no_continue(view: ChatView) -> None:
    view.set_messages(_conversation())
    assert not _button(_message(view, "a1"), "continueButton").isVisible()


def test_thousands_of_messages_load_in_pages(qtbot: QtBot, view: ChatView) -> None:
    messages = [
        MessageView(f"m{i}", "user" if i % 2 == 0 else "assistant", f"Message number {i}")
        for i in range(3000)
    ]
    view.set_messages(messages)
    shown = {w.property("messageId") for w in _messages(view)}
    assert len(shown) <= 60
    oldest = 3000 - len(shown)
    assert shown == {f"m{i}" for i in range(oldest, 3000)}
    bar = view.findChild(QScrollArea, "chatScroll").verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
    bar.setValue(0)
    more = {w.property("messageId") for w in _messages(view)}
    assert more == {f"m{i}" for i in range(oldest - PAGE_SIZE, 3000)}
    qtbot.waitUntil(lambda: bar.value() > 0)  # the reader stays where they were


def test_set_messages_keeps_widgets_of_unchanged_messages(view: ChatView) -> None:
    view.set_messages(_conversation())
    before = _message(view, "u1")
    view.set_messages([*_conversation()[:1], MessageView("a2", "assistant", "Another")])
    assert _message(view, "u1") is before
    assert [w.property("messageId") for w in _messages(view)] == ["u1", "a2"]


def test_empty_state_hint(view: ChatView) -> None:
    hint = view.findChild(QLabel, "emptyHint")
    assert hint.isVisible()
    assert hint.text() == EMPTY_HINT
    view.set_messages(_conversation())
    assert not hint.isVisible()
    view.set_messages([])
    assert hint.isVisible()
    assert _messages(view) == []


def test_every_control_has_an_accessible_name_and_tooltip(view: ChatView) -> None:
    view.set_messages(
        [
            *_conversation(),
            MessageView("a3", "assistant", "<think>x</think>y", status="interrupted"),
        ]
    )
    _button(_message(view, "u1"), "editButton").click()
    buttons = view.findChildren(QToolButton) + view.findChildren(QPushButton)
    assert buttons
    for button in buttons:
        assert button.accessibleName(), button.objectName()
        assert button.toolTip(), button.objectName()


@pytest.mark.parametrize("dark", [False, True])
def test_grab_to_png(tmp_path: Path, view: ChatView, dark: bool) -> None:
    view.set_messages(_conversation())
    view.set_dark(dark)
    path = tmp_path / "chat.png"
    assert view.grab().save(str(path))
    assert path.stat().st_size > 0
