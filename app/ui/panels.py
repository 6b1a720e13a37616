"""The panels beside the chat that a narrow window can fold away: the sidebar and the
conversation settings dock, each with a View toggle, remembered in the window's settings.

The chat column is the one part that never collapses; the sidebar folds either by its
toggle (hidden) or by dragging the splitter handle to the edge (collapsed to 0 px), and
the toggle opens it again from both.
"""

from __future__ import annotations

from PySide6.QtCore import QSettings, QSize, Qt
from PySide6.QtWidgets import QDockWidget, QFrame, QScrollArea, QSplitter, QStyle, QWidget

SIDEBAR_KEY = "sidebar_open"
SETTINGS_KEY = "settings_open"
SIDEBAR_PX = 270


def _flag(settings: QSettings, key: str, default: bool) -> bool:
    return str(settings.value(key, "true" if default else "false")) == "true"


class Panels:
    """Shows, hides and remembers the sidebar (splitter pane 0) and the settings dock."""

    def __init__(
        self, splitter: QSplitter, sidebar: QWidget, dock: QDockWidget, settings: QSettings
    ) -> None:
        self._splitter, self._sidebar, self._dock = splitter, sidebar, dock
        self._settings = settings
        splitter.setChildrenCollapsible(True)
        splitter.setCollapsible(splitter.indexOf(sidebar), True)
        splitter.setCollapsible(1 - splitter.indexOf(sidebar), False)  # the chat stays

    def sidebar_open(self) -> bool:
        shown = self._sidebar.isVisibleTo(self._splitter.window())
        return shown and self._splitter.sizes()[self._splitter.indexOf(self._sidebar)] > 0

    def set_sidebar_open(self, open_: bool) -> None:
        if open_:
            self._sidebar.show()
            sizes = self._splitter.sizes()
            index = self._splitter.indexOf(self._sidebar)
            if sizes[index] == 0:  # collapsed by a drag: open it at its usual width
                sizes[1 - index] = max(0, sum(sizes) - SIDEBAR_PX)
                sizes[index] = SIDEBAR_PX
                self._splitter.setSizes(sizes)
        else:
            self._sidebar.hide()
        self._settings.setValue(SIDEBAR_KEY, "true" if open_ else "false")

    def toggle_sidebar(self) -> None:
        self.set_sidebar_open(not self.sidebar_open())

    def toggle_settings(self) -> None:
        self._dock.setVisible(not self._dock.isVisible())

    def restore(self) -> None:
        """The panels as the window was closed."""
        self._sidebar.setVisible(_flag(self._settings, SIDEBAR_KEY, True))
        self._dock.setVisible(_flag(self._settings, SETTINGS_KEY, False))

    def save(self) -> None:
        self._settings.setValue(SETTINGS_KEY, "true" if self._dock.isVisible() else "false")


class _VerticalScroll(QScrollArea):
    """Scrolls up and down only, and asks for the width its widget needs, scroll bar
    included: a dock never cuts the panel at its right edge or scrolls it sideways."""

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        inner = self.widget()
        if inner is None:
            return hint
        bar = self.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent, None, self)
        frame = 2 * self.frameWidth()
        return QSize(inner.minimumSizeHint().width() + bar + frame, hint.height())


def scrolling(widget: QWidget) -> QScrollArea:
    """`widget` in a frameless scroll area: a tall panel in a short window scrolls instead of
    raising the window's minimum height (960 x 540 at 200% scaling)."""
    area = _VerticalScroll()
    area.setObjectName(f"{widget.objectName() or 'panel'}-scroll")
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setWidgetResizable(True)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    area.setWidget(widget)
    return area
