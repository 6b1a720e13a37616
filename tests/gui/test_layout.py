"""The window's layout holds: nothing widens it (settings, streaming, the warm label, a long
title, an edit), 960 x 600 shows the composer and Send whole, the sidebar and the settings
fold away and stay so, 200% scaling fits, and a rename shows in the header at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QWidget

from app.ui.main_window import MainWindow
from tests.gui.harness import Harness

SMALL = QSize(960, 600)
LONG_TITLE = "A conversation about the long history of the northern lighthouses " * 3
ROOT = Path(__file__).resolve().parents[2]


def shown_whole(window: MainWindow, widget: QWidget) -> bool:
    """Visible, inside the window, and not clipped by any parent."""
    rect = QRect(widget.mapTo(window, QPoint(0, 0)), widget.size())
    clipped = widget.visibleRegion().boundingRect().size() != widget.size()
    return widget.isVisible() and window.rect().contains(rect) and not clipped


def small_window(harness: Harness) -> MainWindow:
    window = harness.start()
    window.resize(SMALL)
    harness.wait_until(lambda: window.size() == SMALL)
    return window


def holds(harness: Harness, window: MainWindow, limit: QSize) -> None:
    """The window kept its size and its minimum never outgrew `limit`."""
    harness.act(QApplication.processEvents)
    assert window.size() == SMALL
    hint = window.minimumSizeHint()
    assert hint.width() <= limit.width() and hint.height() <= limit.height(), hint


def test_nothing_widens_the_window(harness: Harness) -> None:
    window = small_window(harness)
    conversation = window.conversation_id
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 48})
    holds(harness, window, SMALL)
    harness.act(window.toggle_settings)
    harness.wait_until(window.settings_dock.isVisible)
    holds(harness, window, SMALL)
    limit = window.minimumSizeHint()  # with the settings open: nothing below may add to it

    streamed: list[str] = []
    window.chat.append_reply = lambda mid, piece, orig=window.chat.append_reply: (
        streamed.append(piece),
        orig(mid, piece),
    )
    harness.type_and_send("Write a long sentence about the sea, the wind and the lighthouses.")
    harness.wait_until(lambda: len(streamed) >= 3 or not window.busy())
    holds(harness, window, limit)  # while streaming
    harness.turn()
    holds(harness, window, limit)
    assert window.status.text()  # the long statistics line is there, elided

    harness.act(window.new_conversation)
    harness.act(lambda: window.open_conversation(conversation))
    harness.wait_until(lambda: window.warm_label.text().startswith("warm"))
    assert not any(c.isdigit() for c in window.warm_label.text())  # the meter has the count
    holds(harness, window, limit)

    window.store.rename(conversation, LONG_TITLE)
    harness.act(window.reload)
    assert window.title_label.text() == LONG_TITLE
    holds(harness, window, limit)

    first = window.store.current_path(conversation)[0]
    harness.act(lambda: window.chat.edit_requested.emit(first.id, "And now about the hills?"))
    harness.turn()
    holds(harness, window, limit)


def test_960_by_600_shows_the_composer_and_send_whole(harness: Harness) -> None:
    window = small_window(harness)
    harness.act(window.toggle_settings)
    harness.wait_until(window.settings_dock.isVisible)
    harness.act(QApplication.processEvents)
    for widget in (window.composer.editor, window.composer.send_button, window.header):
        assert shown_whole(window, widget), widget.objectName()
    assert window.chat.height() > 200  # room left to read


def test_the_sidebar_and_the_settings_fold_and_stay_folded(harness: Harness) -> None:
    window = small_window(harness)
    chat_width = window.chat.width()
    window.activateWindow()
    harness.act(
        lambda: QTest.keyClick(
            window.composer.editor, Qt.Key.Key_B, Qt.KeyboardModifier.ControlModifier
        )
    )
    harness.wait_until(lambda: not window.sidebar.isVisible())
    harness.wait_until(lambda: window.chat.width() > chat_width)
    harness.act(window.toggle_settings)
    harness.stop()
    window = harness.start()
    assert not window.sidebar.isVisible() and window.settings_dock.isVisible()
    window.activateWindow()
    harness.act(
        lambda: QTest.keyClick(
            window.composer.editor, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier
        )
    )
    harness.wait_until(lambda: window.sidebar.isVisible() and window.sidebar.search.hasFocus())

    window.splitter.setSizes([0, window.splitter.width()])  # dragged shut
    harness.wait_until(lambda: window.splitter.sizes()[0] == 0)
    harness.act(window.panels.toggle_sidebar)
    harness.wait_until(lambda: window.splitter.sizes()[0] > 100)


def test_at_200_percent_the_window_fits_a_full_hd_screen() -> None:
    """QT_SCALE_FACTOR is read when Qt starts, so the window runs in its own process."""
    env = {**os.environ, "QT_SCALE_FACTOR": "2", "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.gui.scaled_window"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["device_pixel_ratio"] == 2
    assert seen["size"] == [960, 540]  # 1920 x 1080 at 200%
    assert seen["minimum"][0] <= 960 and seen["minimum"][1] <= 540
    assert seen["composer_whole"] and seen["send_whole"]


def test_renaming_in_the_sidebar_updates_the_header_at_once(harness: Harness) -> None:
    window = harness.start()
    sidebar = window.sidebar
    window.activateWindow()
    harness.act(lambda: sidebar.list.setFocus())
    harness.wait_until(lambda: sidebar.list.currentItem() is not None or sidebar.list.count())
    harness.act(lambda: sidebar.list.setCurrentRow(1))  # row 0 is the date header
    harness.act(lambda: QTest.keyClick(sidebar.list, Qt.Key.Key_F2))
    harness.wait_until(lambda: QApplication.focusWidget() is not sidebar.list)
    editor = QApplication.focusWidget()
    harness.act(lambda: editor.selectAll())
    harness.act(lambda: QTest.keyClicks(editor, "Trip to Lisbon"))
    harness.act(lambda: QTest.keyClick(editor, Qt.Key.Key_Return))
    harness.wait_until(lambda: window.title_label.text() == "Trip to Lisbon")
    assert window.store.get_conversation(window.conversation_id).title == "Trip to Lisbon"
