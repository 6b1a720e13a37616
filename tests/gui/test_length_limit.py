"""A reply cut by max tokens, on the real engine: marked, continued, and its stats in words."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QToolButton, QWidget

from app.ui.main_window import stats_line
from app.ui.message_widget import LENGTH_MARK
from tests.gui.harness import Harness


def _widget(window, message_id: str) -> QWidget:
    for widget in window.chat.findChildren(QWidget, "message"):
        if widget.property("messageId") == message_id:
            return widget
    raise LookupError(message_id)


def test_a_reply_cut_at_max_tokens_is_marked_and_continues(harness: Harness):
    window = harness.start()
    conversation = window.conversation_id
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 3})
    harness.type_and_send("Count from 1 to 50, separated by commas.")
    harness.turn()
    reply = window.store.current_path(conversation)[-1]
    assert reply.status == "complete" and reply.finish_reason == "length"
    assert len(reply.token_ids) == 3
    widget = _widget(window, reply.id)
    mark = widget.findChild(QLabel, "statusMark")
    assert mark.isVisible() and mark.text() == LENGTH_MARK
    button = widget.findChild(QToolButton, "continueButton")
    assert button.isVisible()

    harness.act(button.click)
    harness.turn()
    continued = window.store.get_message(reply.id)
    assert continued.content.startswith(reply.content)
    assert len(continued.token_ids) == 6  # a new budget of 3, after the 3 it had
    assert "reused" in window.status.text()


def test_a_turn_that_prefilled_nothing_shows_no_prefill_speed():
    """Continuing an interrupted reply finds its KV whole: no "prefill 0 tok/s"."""
    warm = {
        "ttft_s": 0.02,
        "prefill_tok_s": 0.0,
        "decode_tok_s": 90.0,
        "reused_tokens": 40,
        "prompt_tokens": 40,
    }
    line = stats_line(warm)
    assert "prefill" not in line and "reused 40 of 40" in line
    assert "prefill 300 tok/s" in stats_line({**warm, "prefill_tok_s": 300.0})
