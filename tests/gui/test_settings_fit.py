"""With the conversation settings open, the chat and the panel each fit their own viewport at
960, 1180 and 1920 wide (issue 36 items 1 and 2): no bubble, action row or reply statistics
runs under the panel, and the panel neither scrolls sideways nor cuts a field at its right."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QScrollArea, QWidget

from app.ui.main_window import MainWindow
from tests.gui.harness import Harness

SIZES = (QSize(960, 600), QSize(1180, 780), QSize(1920, 1040))
LONG = "The sea is wide and the wind is strong; the lighthouses stand on the rocks. " * 4
STATS = {
    "decode_tok_s": 14.2,
    "ttft_s": 11.53,
    "prefill_tok_s": 230.0,
    "reused_tokens": 0,
    "prompt_tokens": 2815,
}


def overflowing(area: QAbstractScrollArea) -> list[str]:
    """The visible widgets inside `area` that reach past its viewport's right edge."""
    viewport = area.viewport()
    inside = area.widget() if isinstance(area, QScrollArea) else viewport
    found = []
    for widget in [inside, *inside.findChildren(QWidget)]:
        if widget.isVisible() and not isinstance(widget.parentWidget(), QAbstractScrollArea):
            rect = QRect(widget.mapTo(viewport, QPoint(0, 0)), widget.size())
            if rect.right() >= viewport.width():
                found.append(f"{widget.metaObject().className()} {widget.objectName()}")
    return found


def assert_fits(harness: Harness, window: MainWindow, when: str) -> None:
    harness.act(QApplication.processEvents)
    chat = window.chat.findChild(QScrollArea, "chatScroll")
    panel = window.findChild(QScrollArea, "conversation-settings-scroll")
    size = window.size()
    assert size.width() in (s.width() for s in SIZES), size  # nothing widened the window
    assert not overflowing(chat), (when, size, overflowing(chat))
    assert not panel.horizontalScrollBar().isVisible(), (when, size)
    assert not overflowing(panel), (when, size, overflowing(panel))
    chat_right = window.chat.mapTo(window, QPoint(window.chat.width(), 0)).x()
    assert chat_right <= window.settings_dock.mapTo(window, QPoint(0, 0)).x(), (when, size)


def test_the_chat_and_the_settings_fit_side_by_side(harness: Harness) -> None:
    window = harness.start()
    harness.act(window.toggle_settings)
    harness.wait_until(window.settings_dock.isVisible)
    conversation = window.conversation_id
    for size in SIZES:
        window.resize(size)
        harness.wait_until(lambda size=size: window.size() == size)
        assert_fits(harness, window, "panel opened")
        parent = window.store.current_path(conversation)
        parent_id = parent[-1].id if parent else None
        question = window.store.add_message(conversation, parent_id, "user", LONG)
        window.store.add_message(
            conversation, question.id, "assistant", LONG, finish_reason="length", stats=STATS
        )
        harness.act(window.reload)
        harness.wait_until(lambda: window.chat.findChildren(QWidget, "message"))
        assert_fits(harness, window, "a reply cut at its length limit, with statistics")
