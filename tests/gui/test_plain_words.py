"""On screen: a Delete that cannot be done now is disabled, and the first message's inline
editor opens in sight instead of under the top edge."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox, QPlainTextEdit, QToolButton, QWidget
from pytestqt.qtbot import QtBot

from app.ui.chat_view import ChatView
from app.ui.message_view import MessageView
from app.ui.models.widgets import confirm
from tests.gui.test_models_page import imported, open_dialog  # noqa: F401


def _answer_later(seen: dict) -> None:
    def look() -> None:
        box = QApplication.activeModalWidget()
        assert isinstance(box, QMessageBox)
        seen["text"] = box.text()
        seen["enabled"] = box.button(QMessageBox.StandardButton.Yes).isEnabled()
        box.reject()

    QTimer.singleShot(0, look)


def test_confirm_disables_an_action_that_cannot_be_done(qtbot: QtBot) -> None:
    seen: dict = {}
    _answer_later(seen)
    assert not confirm(None, "Delete model", "Load another model first.", "Delete", allowed=False)
    assert seen["enabled"] is False
    _answer_later(seen)
    confirm(None, "Delete model", "Sure?", "Delete")
    assert seen["enabled"] is True


def test_deleting_the_loaded_model_cannot_be_confirmed(open_dialog) -> None:  # noqa: F811
    model = imported()
    dialog = open_dialog()
    dialog.set_loaded_path(str(model.path))
    assert dialog.select_model(str(model.path))
    seen: dict = {}
    _answer_later(seen)
    dialog.delete_selected()
    assert "load another model first" in seen["text"] and seen["enabled"] is False
    assert model.path.exists()


def test_the_first_messages_editor_opens_in_sight(qtbot: QtBot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(900, 420)
    view.show()
    qtbot.waitExposed(view)
    first = "\n".join(f"line {i}" for i in range(6))
    messages = [MessageView("u1", "user", first)]
    messages += [MessageView(f"a{i}", "assistant", "A reply. " * 40) for i in range(4)]
    view.set_messages(messages)
    qtbot.wait(50)
    scroll = view.findChild(QWidget, "chatScroll")
    user = next(w for w in view.findChildren(QWidget, "message") if w.property("messageId") == "u1")
    viewport = scroll.viewport()
    assert user.mapTo(viewport, QPoint(0, 0)).y() < 0  # scrolled past, at the bottom
    user.findChild(QToolButton, "editButton").click()
    editor = user.findChild(QPlainTextEdit, "messageEditor")

    def in_sight() -> bool:
        top = editor.mapTo(viewport, QPoint(0, 0)).y()
        return top >= 0 and top + editor.height() <= viewport.height()

    qtbot.waitUntil(in_sight, timeout=5000)
    qtbot.wait(200)  # and it stays there while the layout settles
    assert in_sight()
