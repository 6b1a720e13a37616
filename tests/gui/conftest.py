"""The window's fixtures: the real window on the real engine (offscreen: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytestqt.qtbot import QtBot

    from app.conversations import ConversationStore
    from app.ui.settings_panel import ConversationSettings


@pytest.fixture
def harness(qapp, stoke_home: Path) -> Iterator:
    """The real window on the real engine and model; stopped and its loop closed after."""
    from tests.gui.harness import Harness

    h = Harness(qapp)
    try:
        yield h
    finally:
        h.stop()
        h.loop.close()


@pytest.fixture
def store(qtbot: QtBot, stoke_home: Path) -> Iterator[ConversationStore]:
    """The conversation store of the test's own STOKE_HOME, closed only after the widgets
    over it are gone, timers included."""
    from PySide6.QtCore import QEvent
    from PySide6.QtWidgets import QApplication

    from app.conversations import ConversationStore

    with ConversationStore.open() as opened:
        yield opened
        for widget in QApplication.topLevelWidgets():
            widget.close()
            widget.deleteLater()
        QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.fixture
def panel(qtbot: QtBot, store: ConversationStore) -> ConversationSettings:
    """The conversation settings panel over `store`, shown."""
    from app.ui.settings_panel import ConversationSettings

    widget = ConversationSettings(store)
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    return widget
