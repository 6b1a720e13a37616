"""Every dialog fits the screen it opens on: no larger than the screen's available geometry
(a 960 x 600 laptop, a 200% scaled display), its content scrolling where it does not fit.

`fit_to_screen(dialog)` is called once, in the dialog's constructor: it bounds the size and
the minimum size now and again each time the dialog is shown (it may open on another
screen, or have grown since). `available_geometry` is the one place that asks the screen.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QRect, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget


def available_geometry(widget: QWidget) -> QRect:
    """The free part (without panels and docks) of the screen `widget` opens on."""
    anchor = widget.parentWidget() or widget
    screen = anchor.screen() or QGuiApplication.primaryScreen()
    return screen.availableGeometry()


def bound_to_screen(widget: QWidget) -> None:
    """Shrink `widget` (and its minimum) to the available geometry, keeping it on screen."""
    area = available_geometry(widget)
    bound = area.size()
    if widget.minimumWidth() > bound.width() or widget.minimumHeight() > bound.height():
        widget.setMinimumSize(widget.minimumSize().boundedTo(bound))
    size = widget.size() if widget.testAttribute(Qt.WidgetAttribute.WA_Resized) else None
    if size is None:
        size = widget.sizeHint().expandedTo(widget.minimumSize())
    if size.width() > bound.width() or size.height() > bound.height() or widget.isVisible():
        widget.resize(size.boundedTo(bound))
    if widget.isVisible() and not area.contains(widget.frameGeometry()):
        widget.move(
            max(area.left(), min(widget.x(), area.right() - widget.width())),
            max(area.top(), min(widget.y(), area.bottom() - widget.height())),
        )


class _Fitter(QObject):
    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Show and isinstance(watched, QWidget):
            bound_to_screen(watched)
        return False


def fit_to_screen(widget: QWidget) -> None:
    """Bound `widget` to its screen now and whenever it is shown."""
    bound_to_screen(widget)
    widget.installEventFilter(_Fitter(widget))
