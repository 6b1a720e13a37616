"""The wizard's cards are built of these (cards.py, remote.py): a titled card, a selectable
label, a path elided to fit.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QVBoxLayout, QWidget


class PathLabel(QLabel):
    """A path elided in the middle to fit; the whole path in the tooltip."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def set_path(self, path: str) -> None:
        self._full = path
        self.setToolTip(path)
        self._elide()

    def resizeEvent(self, event: QEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        metrics = self.fontMetrics()
        self.setText(metrics.elidedText(self._full, Qt.TextElideMode.ElideMiddle, self.width()))


def selectable_label(text: str = "", parent: QWidget | None = None, *, role: str = "") -> QLabel:
    label = QLabel(text, parent)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    if role:
        label.setObjectName(role)
    return label


def titled_card(title: str, parent: QWidget) -> tuple[QFrame, QVBoxLayout]:
    card = QFrame(parent)
    card.setObjectName("card")
    column = QVBoxLayout(card)
    column.setContentsMargins(16, 14, 16, 16)
    column.setSpacing(10)
    heading = QLabel(title, card)
    heading.setObjectName("card-title")
    column.addWidget(heading)
    return card, column
