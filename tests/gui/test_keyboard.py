"""The keyboard in the window: from the search field into the list, Enter opens, the focus
stays visible after a send, and the View menu names Ctrl+, for the settings."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QColor, QKeySequence, QPalette
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.conversations import ConversationStore
from app.ui.sidebar import Sidebar
from tests.gui.harness import Harness

WAIT_MS = 5000


def test_down_from_search_shows_a_current_row_and_enter_opens_it(
    qtbot: QtBot, store: ConversationStore
) -> None:
    older = store.create_conversation("Older").id
    newest = store.create_conversation("Newest").id
    sidebar = Sidebar(store)
    qtbot.addWidget(sidebar)
    sidebar.resize(280, 600)
    sidebar.show()
    qtbot.waitExposed(sidebar)
    sidebar.select(older)  # the open conversation
    opened: list[str] = []
    sidebar.conversation_selected.connect(opened.append)
    sidebar.activateWindow()
    sidebar.focus_search()
    qtbot.waitUntil(sidebar.search.hasFocus, timeout=WAIT_MS)

    QTest.keyClick(sidebar.search, Qt.Key.Key_Down)
    qtbot.waitUntil(sidebar.list.hasFocus, timeout=WAIT_MS)
    current = sidebar.list.currentItem()
    assert current is not None and current.text() == "Newest"  # the first row, shown
    assert opened == []  # moving is not opening
    painted = sidebar.list.viewport().grab().toImage()
    rect = sidebar.list.visualItemRect(current)
    ring = QColor(painted.pixel(rect.center().x(), rect.top() + 1))
    highlight = sidebar.palette().color(QPalette.ColorRole.Highlight)
    assert abs(ring.hue() - highlight.hue()) < 20 and ring.saturation() > 40  # the ring shows

    QTest.keyClick(sidebar.list, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: opened == [newest], timeout=WAIT_MS)


def test_focus_stays_visible_in_the_composer_after_send(harness: Harness) -> None:
    window = harness.start()
    window.store.set_sampling(window.conversation_id, {"temperature": 0, "max_tokens": 8})
    window.activateWindow()
    editor = window.composer.editor
    harness.act(lambda: QTest.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton))
    harness.act(lambda: QTest.keyClicks(editor, "Say hi."))
    harness.act(lambda: QTest.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton))
    harness.turn()
    assert [m.role for m in window.store.current_path(window.conversation_id)] == [
        "user",
        "assistant",
    ]
    harness.wait_until(lambda: QApplication.focusWidget() is editor)
    focused = editor.grab().toImage()
    window.sidebar.search.setFocus()
    harness.wait_until(lambda: not editor.hasFocus())
    unfocused = editor.grab().toImage()
    x = editor.width() // 2
    frame = QColor(focused.pixel(x, 0))
    highlight = editor.palette().color(QPalette.ColorRole.Highlight)
    assert frame.name() != QColor(unfocused.pixel(x, 0)).name()  # the focus frame is drawn
    assert abs(frame.hue() - highlight.hue()) < 20


def test_view_menu_shows_ctrl_comma_for_conversation_settings(harness: Harness) -> None:
    window = harness.start()
    view = next(a.menu() for a in window.menuBar().actions() if a.text() == "&View")
    settings = next(a for a in view.actions() if a.text() == "Conversation Settings")
    assert settings.shortcut() == QKeySequence("Ctrl+,")
    assert isinstance(settings, QAction)
    window.activateWindow()
    harness.act(
        lambda: QTest.keyClick(
            window.composer.editor, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier
        )
    )
    harness.wait_until(window.settings_dock.isVisible)
