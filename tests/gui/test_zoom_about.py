"""Text zoom (remembered; tool rows and action links grow with the text), Help > About
(versions, folders, the doctor's report copied) and the notification of a reply that finishes
while the window is in the background."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QLabel, QTextBrowser, QToolButton, QWidget

from app import paths
from app.conversations import ToolCall
from app.ui.zoom import ZOOM_KEY
from tests.gui.harness import Harness


def message_font_pt(window) -> float:
    texts = [t for t in window.chat.findChildren(QTextBrowser) if t.isVisible()]
    assert texts
    texts[0].ensurePolished()
    return texts[0].font().pointSizeF()


def composer_px(window) -> int:
    editor = window.composer.editor
    editor.ensurePolished()
    return editor.font().pixelSize()


def key(harness: Harness, window, which: Qt.Key) -> None:
    control = Qt.KeyboardModifier.ControlModifier
    harness.act(lambda: QTest.keyClick(window.composer.editor, which, control))


def test_zoom_keys_size_chat_and_composer_and_are_remembered(harness: Harness) -> None:
    window = harness.start()
    window.store.set_sampling(window.conversation_id, {"temperature": 0, "max_tokens": 8})
    harness.type_and_send("Hello there.")
    harness.turn()
    window.activateWindow()
    chat_pt, editor_px = message_font_pt(window), composer_px(window)

    key(harness, window, Qt.Key.Key_Plus)
    key(harness, window, Qt.Key.Key_Equal)  # Ctrl+= too: + needs Shift on many keyboards
    assert window.zoom.percent == 120
    assert str(window.settings.value(ZOOM_KEY)) == "120"
    assert message_font_pt(window) > chat_pt * 1.15
    assert composer_px(window) > editor_px
    key(harness, window, Qt.Key.Key_Minus)
    assert window.zoom.percent == 110

    harness.stop()
    window = harness.start()  # the next start keeps it
    assert window.zoom.percent == 110
    assert message_font_pt(window) > chat_pt
    window.activateWindow()
    key(harness, window, Qt.Key.Key_0)
    assert window.zoom.percent == 100
    assert message_font_pt(window) == chat_pt and composer_px(window) == editor_px


def test_about_shows_versions_and_folders_and_copies_the_doctor_report(harness: Harness) -> None:
    window = harness.start()
    help_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Help")
    about_action = next(a for a in help_menu.actions() if a.text() == "About Stoke")
    harness.act(about_action.trigger)
    dialog = next(w for w in QApplication.topLevelWidgets() if w.objectName() == "about-dialog")
    shown = {label.accessibleName(): label.text() for label in dialog.findChildren(QLabel)}
    assert shown["Data"] == str(paths.data_dir()) and shown["Cache"] == str(paths.cache_dir())
    assert shown["Settings"] == str(paths.config_dir())
    assert shown["Python"] and "PySide6" in shown["Qt"] and "llama-cpp-python" in shown["llama.cpp"]
    QGuiApplication.clipboard().setText("")
    button = dialog.findChild(QWidget, "copy-diagnostics")
    harness.act(button.click)
    assert not button.isEnabled()  # collecting, off the UI thread
    harness.wait_until(lambda: QGuiApplication.clipboard().text() != "", timeout=300)
    report = QGuiApplication.clipboard().text()
    assert "llama" in report.lower() and str(paths.data_dir()) in report
    model = Path(window.session.engine.info.path).name
    assert f"ok, the window has {model} loaded on it" in report  # no load again: it knows
    assert button.isEnabled() and "Copied" in dialog.findChild(QLabel, "about-status").text()


def test_a_reply_in_the_background_notifies_and_one_in_front_does_not(harness: Harness) -> None:
    window = harness.start()
    window.store.set_sampling(window.conversation_id, {"temperature": 0, "max_tokens": 8})
    notified: list[tuple[str, str]] = []
    window.notifier.notified.connect(lambda title, text: notified.append((title, text)))

    other = QWidget()
    other.setWindowTitle("Another application")
    other.show()
    other.activateWindow()
    harness.wait_until(lambda: not window.isActiveWindow())
    harness.type_and_send("Say hello.")
    harness.turn()
    reply = window.store.current_path(window.conversation_id)[-1]
    assert len(notified) == 1
    assert notified[0][1] == " ".join(reply.content.split())[:120] or "…" in notified[0][1]

    other.close()
    window.activateWindow()
    harness.wait_until(window.isActiveWindow)
    harness.type_and_send("Say goodbye.")
    harness.turn()
    assert len(notified) == 1  # the reader was looking
    other.deleteLater()


def test_zoom_sizes_tool_rows_and_action_links_with_the_text(harness: Harness) -> None:
    window = harness.start()
    store, conversation = window.store, window.conversation_id
    question = store.add_message(conversation, None, "user", "Weather in Paris?")
    call = ToolCall("call_paris", "get_weather", '{"city": "Paris"}')
    asked = store.add_message(conversation, question.id, "assistant", "", tool_calls=[call])
    result = store.add_message(
        conversation, asked.id, "tool", "18 C", tool_call_id=call.id, tool_name=call.name
    )
    store.add_message(conversation, result.id, "assistant", "It is 18 C in Paris.")
    harness.act(window.reload)
    window.activateWindow()

    def sizes() -> dict[str, float]:
        shown = [
            *window.chat.findChildren(QToolButton, "toolToggle"),
            *window.chat.findChildren(QToolButton, "copyButton"),
            *window.chat.findChildren(QToolButton, "editButton"),
            *window.chat.findChildren(QToolButton, "regenerateButton"),
        ]
        for widget in shown:
            widget.ensurePolished()
        return {f"{w.objectName()}-{i}": w.font().pointSizeF() for i, w in enumerate(shown)}

    before = sizes()
    assert {name.split("-")[0] for name in before} == {
        "toolToggle",
        "copyButton",
        "editButton",
        "regenerateButton",
    }
    key(harness, window, Qt.Key.Key_Equal)
    key(harness, window, Qt.Key.Key_Equal)
    after = sizes()
    assert all(after[name] > before[name] * 1.15 for name in before), (before, after)
    key(harness, window, Qt.Key.Key_0)
    assert sizes() == before
