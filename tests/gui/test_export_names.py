"""Export suggests the title as a file name and keeps its extension; imports are marked."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QLineEdit
from pytestqt.qtbot import QtBot

from app.ui.conversation_files import export_dialog, suggested_name, with_suffix
from tests.gui.harness import Harness


def test_the_suggested_name_is_the_title_made_safe() -> None:
    assert suggested_name("Rust lifetimes", "json") == "Rust lifetimes.json"
    assert suggested_name('a/b\\c: "d" <e>?*|', "md") == "a b c d e.md"
    assert suggested_name("  ..  ", "json") == "conversation.json"
    assert suggested_name(None, "md") == "conversation.md"
    assert len(suggested_name("x" * 500, "json")) == 80 + len(".json")


def test_the_extension_is_added_only_when_left_out() -> None:
    assert with_suffix(Path("/tmp/export1"), "json") == Path("/tmp/export1.json")
    assert with_suffix(Path("/tmp/notes.v2"), "md") == Path("/tmp/notes.v2.md")
    assert with_suffix(Path("/tmp/a.JSON"), "json") == Path("/tmp/a.JSON")


def _accept_as(qtbot: QtBot, dialog: QFileDialog, name: str) -> str:
    edit = dialog.findChild(QLineEdit, "fileNameEdit")
    edit.setText(name)
    with qtbot.waitSignal(dialog.fileSelected, timeout=10_000) as chosen:
        qtbot.keyClick(edit, Qt.Key.Key_Return)
    return chosen.args[0]


def test_the_dialog_proposes_the_title_and_appends_the_extension(
    qtbot: QtBot, tmp_path: Path
) -> None:
    dialog = export_dialog(None, "Trip: Lisbon/Porto", "json", str(tmp_path))
    dialog.setOption(QFileDialog.Option.DontUseNativeDialog)
    qtbot.addWidget(dialog)
    dialog.open()
    qtbot.waitExposed(dialog)
    assert dialog.findChild(QLineEdit, "fileNameEdit").text() == "Trip Lisbon Porto.json"
    assert _accept_as(qtbot, dialog, "export1") == str(tmp_path / "export1.json")


def test_export_from_the_window_and_import_marks_the_copy(harness: Harness, tmp_path: Path):
    window = harness.start()
    conversation = window.store.create_conversation("Sea at dawn")
    window.store.add_message(conversation.id, None, "user", "Describe the sea.")
    harness.act(lambda: window.open_conversation(conversation.id))
    assert window.title_label.text() == "Sea at dawn"
    harness.act(lambda: window.export_to(tmp_path / "chat", "json"))
    written = tmp_path / "chat.json"
    assert json.loads(written.read_text("utf-8"))["conversation"]["title"] == "Sea at dawn"

    harness.act(lambda: window.import_from(written))
    imported = window.store.get_conversation(window.conversation_id)
    assert imported.id != conversation.id and imported.imported_at is not None
    assert window.store.get_conversation(conversation.id).imported_at is None
    assert window.title_label.text() == "Sea at dawn · imported"
    assert window.title_label.toolTip().startswith("Imported ")
    rows = {
        window.sidebar.list.item(i).data(Qt.ItemDataRole.UserRole + 1): window.sidebar.list.item(i)
        for i in range(window.sidebar.list.count())
    }
    assert "Imported " in rows[imported.id].toolTip()
    assert "Imported" not in rows[conversation.id].toolTip()
    assert rows[imported.id].data(Qt.ItemDataRole.AccessibleTextRole).endswith(", imported")
    harness.act(lambda: window.open_conversation(conversation.id))
    assert window.title_label.text() == "Sea at dawn" and window.title_label.toolTip() == ""
