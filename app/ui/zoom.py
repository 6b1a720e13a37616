"""Text zoom for the conversation and the composer: Ctrl/Cmd + / - / 0, remembered.

The sizes go in as a style sheet (resources/zoom.qss) on the chat's canvas (its text, and the
tool rows and action links around it, which would otherwise stay small) and on the composer's
editor, because the app's style sheet sets the composer's font size and a style
sheet beats setFont; at 100% the sheets are cleared and the app looks exactly as without zoom.
"""

from __future__ import annotations

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication, QWidget

from app.ui import theme

ZOOM_KEY = "zoom_percent"
STEP, LOWEST, HIGHEST = 10, 50, 300
COMPOSER_PX = 14  # app.qss's composer font size at 100%
CHAT_STEP_PT = 1.0  # message text reads a point above UI text (message_widget)


class Zoom:
    """The zoom level, applied to `targets` (the chat canvas, the composer editor)."""

    def __init__(self, settings: QSettings, targets: list[QWidget]) -> None:
        self._settings = settings
        self._targets = targets
        try:
            percent = int(str(settings.value(ZOOM_KEY, 100)))
        except ValueError:
            percent = 100
        self.percent = min(HIGHEST, max(LOWEST, percent))
        self._apply()

    def zoom_in(self) -> None:
        self.set_percent(self.percent + STEP)

    def zoom_out(self) -> None:
        self.set_percent(self.percent - STEP)

    def reset(self) -> None:
        self.set_percent(100)

    def set_percent(self, percent: int) -> None:
        self.percent = min(HIGHEST, max(LOWEST, percent))
        self._settings.setValue(ZOOM_KEY, self.percent)
        self._apply()

    def _apply(self) -> None:
        sheet = ""
        if self.percent != 100:
            ui = QApplication.font().pointSizeF()
            sheet = theme.stylesheet(
                "zoom.qss",
                chat_pt=f"{(ui + CHAT_STEP_PT) * self.percent / 100:.1f}",
                ui_pt=f"{ui * self.percent / 100:.1f}",
                composer_px=str(round(COMPOSER_PX * self.percent / 100)),
            )
        for target in self._targets:
            target.setStyleSheet(sheet)
