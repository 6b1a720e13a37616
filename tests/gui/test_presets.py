"""Prompt presets in the conversation settings panel over a real store: pick one and the
conversation gets its prompt and sampling; save the settings as a preset; delete it."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QInputDialog, QMessageBox
from pytestqt.qtbot import QtBot

from app.conversations import ConversationStore
from app.presets import BUILTIN, load_presets
from app.ui.settings_panel import ConversationSettings

WAIT_MS = 5000


def pick(panel: ConversationSettings, name: str) -> None:
    combo = panel.presets.combo
    index = combo.findText(name)
    assert index >= 0, name
    combo.setCurrentIndex(index)
    combo.activated.emit(index)


def test_picking_a_preset_applies_it_and_an_edit_shows_custom(
    panel: ConversationSettings, store: ConversationStore, qtbot: QtBot
) -> None:
    conversation = store.create_conversation(sampling={"seed": 5, "max_tokens": 300})
    panel.load(conversation.id)
    assert panel.presets.combo.currentText() == "Default"
    coder = next(p for p in BUILTIN if p.name == "Coder")
    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        pick(panel, "Coder")
    saved = store.get_conversation(conversation.id)
    assert saved.system_prompt == coder.system_prompt
    assert saved.sampling == {"seed": 5, "max_tokens": 300, **coder.sampling}
    assert panel.system_prompt.toPlainText() == coder.system_prompt  # the controls follow
    assert panel.temperature.value() == pytest.approx(coder.sampling["temperature"])
    assert not panel.presets.delete_button.isEnabled()  # built in

    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        panel.temperature.spin.setValue(0.9)
    assert panel.presets.combo.currentText() == "Custom"
    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        pick(panel, "Default")
    assert store.get_conversation(conversation.id).system_prompt is None
    assert store.get_conversation(conversation.id).sampling == {"seed": 5, "max_tokens": 300}
    assert panel.presets.combo.currentText() == "Default"


def test_save_as_preset_then_apply_it_elsewhere_and_delete_it(
    panel: ConversationSettings,
    store: ConversationStore,
    qtbot: QtBot,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = store.create_conversation(system_prompt="Talk like a pirate.")
    panel.load(first.id)
    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        panel.temperature.spin.setValue(1.3)
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Pirate", True))
    panel.presets.save_button.click()
    assert [p.name for p in load_presets()][-1] == "Pirate"
    assert panel.presets.combo.currentText() == "Pirate"
    assert panel.presets.delete_button.isEnabled()

    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Precise", True))
    warned: list[str] = []
    monkeypatch.setattr(QMessageBox, "warning", lambda _p, _t, text: warned.append(text))
    panel.presets.save_button.click()
    assert warned and "built-in preset" in warned[0]

    second = store.create_conversation()
    panel.load(second.id)
    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        pick(panel, "Pirate")
    applied = store.get_conversation(second.id)
    assert applied.system_prompt == "Talk like a pirate." and applied.sampling["temperature"] == 1.3

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    panel.presets.delete_button.click()
    assert "Pirate" not in [p.name for p in load_presets()]
    assert panel.presets.combo.currentText() == "Custom"  # the conversation keeps its settings


def test_the_preset_row_fits_the_panel_at_its_narrowest(panel: ConversationSettings) -> None:
    """The picker's list sits above its buttons: side by side they made the panel wider than
    its dock at 960 px, which then scrolled sideways and clipped its Save button."""
    picker = panel.presets
    assert picker.minimumSizeHint().width() <= panel.minimumWidth() - 24
    assert panel.minimumSizeHint().width() <= panel.minimumWidth()
    panel.resize(panel.minimumWidth(), panel.height())
    assert picker.save_button.width() >= picker.save_button.sizeHint().width()
