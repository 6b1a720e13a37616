"""Small widgets the Models page's tabs share: labels by role, the colored pill, the
verdict badge, a path elided in the middle, what an empty list says, and the confirmation."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QFont, QFontMetrics, QGuiApplication, QPainter, QPaintEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.ui.a11y import described
from app.ui.models.words import FIT_COLORS, FIT_TIPS, fit_level
from app.units import decimal_bytes


def text_label(text: str = "", name: str = "", parent: QWidget | None = None) -> QLabel:
    label = QLabel(text, parent)
    if name:
        label.setObjectName(name)
    return label


def tab_page(parent: QWidget, spacing: int) -> tuple[QWidget, QVBoxLayout]:
    """A tab's page and its column, set below the tab bar as every tab of the page is."""
    page = QWidget(parent)
    column = QVBoxLayout(page)
    column.setContentsMargins(0, 10, 0, 0)
    column.setSpacing(spacing)
    return page, column


def confirm(
    parent: QWidget,
    title: str,
    text: str,
    action: str,
    keep: str = "Cancel",
    *,
    allowed: bool = True,
) -> bool:
    """Ask before something that cannot be undone; the safe answer is the default. When the
    text says why it cannot be done now (not `allowed`), the action's button is disabled."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Warning)
    box.setWindowTitle(title)
    box.setText(text)
    box.setStandardButtons(QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    yes = box.button(QMessageBox.StandardButton.Yes)
    yes.setText(action)
    described(yes, action, action)
    yes.setEnabled(allowed)
    no = box.button(QMessageBox.StandardButton.Cancel)
    no.setText(keep)
    described(no, keep, keep)
    return box.exec() == QMessageBox.StandardButton.Yes


def download_anyway(parent: QWidget, name: str, size: int) -> bool:
    """Ask before downloading a model whose fit badge says it does not fit this machine:
    gigabytes for a model that cannot run here should be a choice, not a slip."""
    return confirm(
        parent,
        "Download a model that does not fit",
        f"{name} does not fit this machine: it needs more memory than this machine's GPUs "
        f"and RAM have together, so it will not load here.\n\nDownload its "
        f"{decimal_bytes(size)} anyway, for another computer?",
        "Download Anyway",
    )


def pill(label: QLabel, text: str, color: str) -> None:
    label.setObjectName("pill")
    label.setText(text)
    label.setStyleSheet(f"background: {color};")


class ElidedLabel(QLabel):
    """A path that shortens in the middle to fit; the whole of it in the tooltip and the
    context menu's Copy."""

    def __init__(self, name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self.setAccessibleName(name)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setMinimumHeight(self.fontMetrics().height())
        copy = QAction("Copy", self)
        copy.triggered.connect(lambda: QGuiApplication.clipboard().setText(self._full))
        self.addAction(copy)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)

    def set_full_text(self, text: str, tip: str | None = None) -> None:
        self._full = text
        self.setToolTip(tip or text)
        self.setAccessibleDescription(text)
        self.update()

    def full_text(self) -> str:
        return self._full

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        shown = QFontMetrics(self.font()).elidedText(
            self._full, Qt.TextElideMode.ElideMiddle, self.width()
        )
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(self.rect(), int(self.alignment()), shown)


class FitBadge(QLabel):
    """The planner's verdict for this machine, as a colored pill."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.level = "unknown"
        self.setAccessibleName("Fit on this machine")
        self.set_verdict(None)

    def set_verdict(self, text: str | None, problem: str = "") -> None:
        if text is None:
            self.level = "unknown"
            shown = "fit unknown" if problem else "checking…"
            tip = problem or "Stoke is looking at this machine's GPUs and memory."
        else:
            self.level, shown, tip = fit_level(text), text, FIT_TIPS.get(text, text)
        pill(self, shown, FIT_COLORS[self.level])
        self.setToolTip(tip)
        self.setAccessibleDescription(f"{shown}. {tip}")


class EmptyState(QWidget):
    """What an empty list says instead: what goes here and how to get some."""

    def __init__(self, icon: str, title: str, detail: str, parent: QWidget | None = None):
        super().__init__(parent)
        content = QWidget(self)
        content.setFixedWidth(660)  # wrapped labels need a width to compute their height
        inner = QVBoxLayout(content)
        inner.setSpacing(8)
        glyph = text_label(icon, "empty-icon", content)
        heading = text_label(title, "empty-title", content)
        font = QFont(heading.font())  # set here, not in the style sheet: wrapping measures it
        font.setPointSizeF(font.pointSizeF() * 1.3)
        font.setBold(True)
        heading.setFont(font)
        body = text_label(detail, "muted", content)
        for label in (glyph, heading, body):
            label.setAlignment(Qt.AlignmentFlag.AlignCenter)
            label.setWordWrap(True)
            inner.addWidget(label)
        self.buttons = QHBoxLayout()
        self.buttons.addStretch(1)
        inner.addSpacing(8)
        inner.addLayout(self.buttons)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(content)
        row.addStretch(1)
        column = QVBoxLayout(self)
        column.addStretch(1)
        column.addLayout(row)
        column.addStretch(2)
        self.title = heading

    def add_button(self, button: QPushButton) -> None:
        self.buttons.addWidget(button)

    def finish(self) -> None:
        self.buttons.addStretch(1)
