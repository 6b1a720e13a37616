"""Keyboard paths through the window that no single widget owns.

Ctrl+Home / Ctrl+End go to the start / end of the conversation, also from the composer
while its draft is empty (a text box would otherwise take them to move its cursor through
nothing). After a send, a turn or a rebuild of the chat the keyboard focus returns to the
composer if it was lost: hidden buttons and rebuilt message widgets drop it to nowhere.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QKeyEvent, QKeySequence
from PySide6.QtWidgets import QApplication, QPlainTextEdit, QWidget

GO_TO_START = QKeySequence("Ctrl+Home")
GO_TO_END = QKeySequence("Ctrl+End")


class EmptyDraftPassesNavigation(QObject):
    """Lets Ctrl+Home / Ctrl+End reach the window's actions while the composer is empty."""

    def __init__(self, editor: QPlainTextEdit) -> None:
        super().__init__(editor)
        self._editor = editor
        editor.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if (
            watched is self._editor
            and event.type() == QEvent.Type.ShortcutOverride
            and isinstance(event, QKeyEvent)
            and not self._editor.toPlainText()
            and QKeySequence(event.keyCombination()) in (GO_TO_START, GO_TO_END)
        ):
            event.ignore()  # not the editor's: the shortcut runs
            return True
        return super().eventFilter(watched, event)


def refocus(window: QWidget, fallback: QWidget) -> None:
    """Give the focus to `fallback` when nothing visible in `window` has it."""
    focused = QApplication.focusWidget()
    if focused is None or not focused.isVisible() or focused.window() is not window:
        fallback.setFocus()
