"""A one-line label that elides instead of widening its window.

A QLabel's minimum width is its whole text, so a long model name, title or statistics
line raised the window's minimum width until the window grew off the screen (issue 16).
This label asks for almost nothing, paints what fits with an ellipsis, and shows the
whole text as its tooltip when it is cut. `text()` stays the whole text.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QStyle, QStyleOption, QWidget

_MIN_CHARS = "Mm…"  # the least it shows before the layout takes space elsewhere


class ElidedLabel(QLabel):
    """One line of text, cut with "…" at the end when the space is short."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self._own_tooltip = ""
        self._room = ""  # a longer text whose width it asks for (keep_room_for)

    def setText(self, text: str) -> None:
        super().setText(text)
        self._update_tooltip()

    def setToolTip(self, text: str) -> None:
        self._own_tooltip = text
        self._update_tooltip()

    def keep_room_for(self, text: str) -> None:
        """Ask for the width of `text` too ("" for none), so a text that changes while it is
        read (a count going up) does not make the label grow step by step."""
        self._room = text
        self.updateGeometry()

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        room = self._width_of(self._room) if self._room else 0
        return QSize(max(hint.width(), room), hint.height())

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()  # the same with or without text: nothing moves
        return QSize(self._width_of(_MIN_CHARS), hint.height())

    def _width_of(self, text: str) -> int:
        """The label's width showing `text` whole: the text, margins and indent."""
        margins = self.contentsMargins()
        extra = margins.left() + margins.right() + 2 * self.margin()
        return self.fontMetrics().horizontalAdvance(text) + extra

    def is_elided(self) -> bool:
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._update_tooltip()

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        option = QStyleOption()
        option.initFrom(self)
        self.style().drawPrimitive(QStyle.PrimitiveElement.PE_Widget, option, painter, self)
        rect = self.contentsRect().adjusted(self.margin(), 0, -self.margin(), 0)
        shown = self.fontMetrics().elidedText(
            self.text(), Qt.TextElideMode.ElideRight, rect.width()
        )
        self.style().drawItemText(
            painter,
            rect,
            int(self.alignment()),
            self.palette(),
            self.isEnabled(),
            shown,
            self.foregroundRole(),
        )

    def _update_tooltip(self) -> None:
        whole = self.text() if self.text() and self.is_elided() else ""
        parts = [part for part in (whole, self._own_tooltip) if part]
        super().setToolTip("\n".join(parts))
