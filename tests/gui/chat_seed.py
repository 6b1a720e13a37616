"""Long conversations for the window's tests, written straight into the store."""

from __future__ import annotations

from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QScrollArea, QScrollBar, QWidget

from app.conversations import ConversationStore
from app.ui.chat_view import PAGE_SIZE, ChatView

LONG = 3 * PAGE_SIZE + 17  # four pages: the newest on open, three more above it


def seed_long(store: ConversationStore, count: int = LONG, title: str = "Long chat") -> str:
    """A conversation of `count` alternating messages (the last one a reply); its id."""
    conversation = store.create_conversation(title)
    parent = None
    for i in range(count):
        role = "user" if i % 2 == 0 else "assistant"
        parent = store.add_message(conversation.id, parent, role, f"Message number {i}").id
    return conversation.id


def scroll_bar(view: ChatView) -> QScrollBar:
    return view.findChild(QScrollArea, "chatScroll").verticalScrollBar()


def in_view(view: ChatView, message_id: str) -> bool:
    """Whether the message's bubble is at least partly inside the visible part of the chat."""
    viewport = view.findChild(QScrollArea, "chatScroll").viewport()
    for widget in view.findChildren(QWidget, "message"):
        if widget.property("messageId") == message_id and widget.isVisible():
            top = widget.mapTo(viewport, QPoint(0, 0)).y()
            return top + widget.height() > 0 and top < viewport.height()
    return False
