"""The preset row of the conversation settings: pick a preset, save the settings as one, delete.

Picking applies the preset to the open conversation at once (its system prompt and the
sampling presets own, app/presets.py); the row shows which preset the conversation follows,
or "Custom" once it was edited by hand.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QSignalBlocker, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QInputDialog,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.conversations import Conversation, ConversationStore, StoreError
from app.presets import Preset, PresetError, delete_preset, load_presets, save_preset

CUSTOM = "Custom"


class PresetPicker(QWidget):
    """A preset combo box with Save as preset… and Delete. `applied` carries the
    conversation id after a preset was written to it; `before_change` is called first, so
    the panel's pending edits are saved before a preset replaces them."""

    applied = Signal(str)

    def __init__(self, store: ConversationStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._store = store
        self._conversation_id: str | None = None
        self._presets: list[Preset] = []
        self.before_change: Callable[[], None] = lambda: None
        self.combo = QComboBox(self)
        self.combo.setObjectName("preset")
        self.combo.setAccessibleName("Preset")
        self.combo.setToolTip(
            "A named system prompt and sampling settings: picking one applies it to this "
            "conversation"
        )
        self.combo.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.combo.setMinimumContentsLength(12)  # a long preset name elides, the panel holds
        self.save_button = QPushButton("Save…", self)  # short: the panel fits its dock at 960
        self.save_button.setAccessibleName("Save as preset")
        self.save_button.setToolTip("Keep this conversation's system prompt and sampling")
        self.delete_button = QPushButton("Delete", self)
        self.delete_button.setAccessibleName("Delete preset")
        self.delete_button.setToolTip("Delete the chosen preset (built-in ones stay)")
        # The list above its buttons: side by side they made the panel wider than its dock
        # at 960 px (the panel then scrolled sideways and clipped its Save button).
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(6)
        column.addWidget(self.combo)
        row = QHBoxLayout()
        row.setSpacing(6)
        row.addWidget(self.save_button)
        row.addWidget(self.delete_button)
        row.addStretch(1)
        column.addLayout(row)
        self.combo.activated.connect(self._picked)
        self.save_button.clicked.connect(self.save_current)
        self.delete_button.clicked.connect(self.delete_current)
        self.reload()

    def load(self, conversation_id: str | None) -> None:
        self._conversation_id = conversation_id
        self.show_match()

    def reload(self) -> None:
        """Read the presets again (after a save or a delete) and show the match."""
        self._presets = load_presets()
        self.show_match()

    def show_match(self) -> None:
        """Select the preset the open conversation follows, or Custom."""
        conversation = self._conversation()
        names = [p.name for p in self._presets]
        match = next(
            (
                p.name
                for p in self._presets
                if conversation is not None
                and p.matches(conversation.system_prompt, conversation.sampling)
            ),
            CUSTOM,
        )
        with QSignalBlocker(self.combo):
            self.combo.clear()
            self.combo.addItems(names + ([CUSTOM] if match == CUSTOM else []))
            self.combo.setCurrentText(match)
        chosen = self._chosen()
        self.delete_button.setEnabled(chosen is not None and not chosen.builtin)

    def apply(self, name: str) -> None:
        """Give the open conversation the preset `name`."""
        preset = next((p for p in self._presets if p.name == name), None)
        if preset is None or self._conversation_id is None:
            return
        self.before_change()
        try:
            conversation = self._store.get_conversation(self._conversation_id)
            self._store.set_system_prompt(conversation.id, preset.system_prompt)
            self._store.set_sampling(conversation.id, preset.applied_to(conversation.sampling))
        except StoreError as error:
            QMessageBox.warning(self, "Stoke", str(error))
            return
        self.show_match()
        self.applied.emit(conversation.id)

    def save_current(self) -> None:
        conversation = self._conversation()
        if conversation is None:
            return
        self.before_change()
        conversation = self._conversation()
        name, ok = QInputDialog.getText(
            self, "Save as preset", "Name of the preset:", QLineEdit.EchoMode.Normal, ""
        )
        if not ok:
            return
        try:
            save_preset(name, conversation.system_prompt, conversation.sampling)
        except (PresetError, OSError) as error:
            words = str(error) if isinstance(error, PresetError) else error.strerror
            QMessageBox.warning(self, "Stoke", f"The preset was not saved: {words}")
            return
        self.reload()

    def delete_current(self) -> None:
        chosen = self._chosen()
        if chosen is None or chosen.builtin:
            return
        answer = QMessageBox.question(self, "Stoke", f"Delete the preset “{chosen.name}”?")
        if answer != QMessageBox.StandardButton.Yes:
            return
        try:
            delete_preset(chosen.name)
        except (PresetError, OSError) as error:
            words = str(error) if isinstance(error, PresetError) else error.strerror
            QMessageBox.warning(self, "Stoke", f"The preset was not deleted: {words}")
            return
        self.reload()

    def _picked(self, index: int) -> None:
        name = self.combo.itemText(index)
        if name != CUSTOM:
            self.apply(name)

    def _chosen(self) -> Preset | None:
        return next((p for p in self._presets if p.name == self.combo.currentText()), None)

    def _conversation(self) -> Conversation | None:
        if self._conversation_id is None:
            return None
        try:
            return self._store.get_conversation(self._conversation_id)
        except StoreError:
            return None
