"""A dismissible message strip above the chat: errors in words, with the actions that fix them.

A message belongs to its cause: shown with a `cause` (what raised it) and, where it is about
one conversation, that `conversation`, so the window can take it down once the cause is
resolved (`clear`) or when another conversation opens (`leave_conversation`) instead of
leaving it up to mislead. Kinds: error, info, success.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget

from app.ui.theme import BANNER


class Banner(QFrame):
    """Shows one message at a time; `show_message` replaces whatever was there."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        self.setAccessibleName("Notice")
        self.text = QLabel(self)
        self.text.setWordWrap(True)
        self.text.setObjectName("banner-text")
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(12, 8, 8, 8)
        self._layout.addWidget(self.text, 1)
        self._actions: list[QPushButton] = []
        close = QToolButton(self)
        close.setText("✕")
        close.setAccessibleName("Dismiss notice")
        close.setToolTip("Dismiss")
        close.setAutoRaise(True)
        close.clicked.connect(self.hide)
        self._close = close
        self._layout.addWidget(close)
        self._dark = False
        self.kind = "error"
        self.cause = ""  # what raised the message on show ("" for none in particular)
        self.conversation: str | None = None  # the conversation it is about, if one
        self.hide()

    def set_dark(self, dark: bool) -> None:
        """Follow the theme, the message on show included."""
        self._dark = dark
        self._paint()

    def _paint(self) -> None:
        bg, fg = BANNER[self.kind]["dark" if self._dark else "light"]
        self.setStyleSheet(f"QFrame#banner {{ background: {bg}; }} QLabel {{ color: {fg}; }}")

    def show_message(
        self,
        message: str,
        actions: list[tuple[str, Callable[[], object]]] | None = None,
        *,
        kind: str = "error",
        cause: str = "",
        conversation: str | None = None,
    ) -> None:
        self.cause, self.conversation = cause, conversation
        self.kind = kind
        for button in self._actions:
            button.deleteLater()
        self._actions = []
        self._paint()
        self.text.setText(message)
        for label, callback in actions or []:
            button = QPushButton(label, self)
            button.setAccessibleName(label)
            button.clicked.connect(lambda _=False, cb=callback: (self.hide(), cb()))
            self._layout.insertWidget(self._layout.count() - 1, button)
            self._actions.append(button)
        self.show()

    def clear(self, *causes: str) -> None:
        """Take the message down if one of `causes` raised it (it is resolved now)."""
        if not self.isHidden() and self.cause in causes:
            self.hide()

    def leave_conversation(self, conversation_id: str | None) -> None:
        """Another conversation is on screen: a message about a different one goes."""
        if self.conversation is not None and self.conversation != conversation_id:
            self.hide()

    def action_labels(self) -> list[str]:
        return [button.text() for button in self._actions]

    def trigger(self, label: str) -> None:
        """Press an action by its label (keyboard users and tests)."""
        for button in self._actions:
            if button.text() == label:
                button.click()
                return
        raise KeyError(label)
