"""A desktop notification when a reply finishes while the window is in the background.

Through the system tray's message where there is a tray (QSystemTrayIcon.showMessage), else
QApplication.alert, which makes the task bar entry ask for attention. Never while the
window is the active one: the reader is already looking.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QApplication, QSystemTrayIcon, QWidget

from app.ui import theme

PREVIEW_CHARS = 120
SHOWN_MS = 6000


class ReplyNotifier(QObject):
    """Tells the desktop that a reply is ready; `notified` carries the words shown."""

    notified = Signal(str, str)  # title, text

    def __init__(self, window: QWidget) -> None:
        super().__init__(window)
        self._window = window
        self._tray: QSystemTrayIcon | None = None

    def reply_finished(self, title: str, reply: str) -> bool:
        """Notify unless the window is active; whether it did."""
        if self._window.isActiveWindow():
            return False
        text = " ".join(reply.split())
        if len(text) > PREVIEW_CHARS:
            text = text[: PREVIEW_CHARS - 1].rstrip() + "…"
        text = text or "The reply is ready."
        if QSystemTrayIcon.isSystemTrayAvailable():
            if self._tray is None:
                self._tray = QSystemTrayIcon(theme.app_icon(), self)
                self._tray.setToolTip("Stoke")
                self._tray.activated.connect(lambda _reason: self._raise())
                self._tray.messageClicked.connect(self._raise)
            self._tray.show()
            self._tray.showMessage(title, text, theme.app_icon(), SHOWN_MS)
        else:
            QApplication.alert(self._window)
        self.notified.emit(title, text)
        return True

    def _raise(self) -> None:
        self._window.showNormal()
        self._window.raise_()
        self._window.activateWindow()
