"""A full context on the real engine: the banner offers only the ways out that can work. The
engine runs the tests' tiny model (tests/tiny_model.py: SmolLM2's tokenizer and template,
random weights): what fits is counted in its tokens, which are SmolLM2's; the words of the
four-token replies are not the point."""

from __future__ import annotations

from PySide6.QtWidgets import QPlainTextEdit, QWidget

from tests.gui.harness import Harness

TURN = "Tell me about the harbour, the ferry, the gulls and the winter light on the water. " * 5


def _editor(window, message_id: str) -> QPlainTextEdit | None:
    for widget in window.chat.findChildren(QWidget, "message"):
        if widget.property("messageId") == message_id:
            return widget.findChild(QPlainTextEdit, "messageEditor")
    return None


def test_a_message_too_long_alone_offers_shorten_and_a_larger_context(
    harness: Harness, tiny_model: str
):
    window = harness.start(tiny_model, n_ctx=256)
    conversation = window.conversation_id
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 4})
    harness.act(lambda: window.spawn(window.send_message("Describe the sea at dawn. " * 60)))
    harness.turn()
    assert window.banner.isVisible()
    assert "Your message alone is" in window.banner.text.text()
    assert window.banner.action_labels() == ["Shorten it", "Reload with a 1,024-token context"]
    user = window.store.current_path(conversation)[-1]
    assert user.role == "user"

    harness.act(lambda: window.banner.trigger("Shorten it"))
    editor = _editor(window, user.id)
    assert editor is not None and editor.isVisible() and editor.toPlainText() == user.content

    harness.act(lambda: window.banner.trigger("Reload with a 1,024-token context"))
    harness.turn()
    assert window.session.engine.info.n_ctx == 1024
    path = window.store.current_path(conversation)
    assert [m.role for m in path] == ["user", "assistant"] and path[1].content
    assert not window.banner.isVisible()


def test_a_long_history_offers_dropping_turns_and_dropping_works(harness: Harness, tiny_model: str):
    window = harness.start(tiny_model, n_ctx=512)
    conversation = window.conversation_id
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 4})
    for _ in range(5):
        harness.act(lambda: window.spawn(window.send_message(TURN)))
        harness.turn()
        if window.store.current_path(conversation)[-1].role == "user":
            break  # this one did not fit
    assert "Drop the oldest turns" in window.banner.text.text()
    assert window.banner.action_labels() == ["Drop oldest turns", "New conversation"]
    harness.act(lambda: window.banner.trigger("Drop oldest turns"))
    harness.turn()
    assert window.store.current_path(conversation)[-1].role == "assistant"
    assert "oldest messages to fit the context" in window.banner.text.text()
    assert "Drop oldest turns" not in window.banner.action_labels()
