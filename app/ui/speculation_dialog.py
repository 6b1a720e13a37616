"""Settings > Speculative Decoding: how replies are guessed ahead and checked (the method) and
which smaller model guesses (the draft model, or none).

The draft list is the library's models that can draft for the loaded one (same tokenizer
fingerprint, smaller: app/models/drafts.py), read off the UI thread since each header's
tokenizer is read once. Both choices go to settings.json (`speculation`, `draft_model`);
saving reloads the loaded model with them at once (the main window's reload, after the
running reply, the conversation kept open and its KV restored from the snapshot).
"""

from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from app import paths
from app.engine.drafting import SPECULATION_MODES
from app.models.drafts import compatible_drafts
from app.models.library import Library, LibraryError, ModelEntry
from app.models.names import model_name
from app.settings import Settings
from app.ui.a11y import described
from app.ui.background import Background
from app.ui.fit import fit_to_screen
from app.ui.models.library_tab import library_pool
from app.ui.models.words import library_error_words
from app.units import decimal_bytes

METHOD_WORDS = {
    "auto": "Automatic: prompt lookup, and the draft model when one is chosen",
    "lookup": "Prompt lookup: guesses from the conversation's own text",
    "draft": "Draft model only",
    "mtp": "The model's own MTP head (models that carry one)",
    "off": "Off: one token at a time",
}
NONE_TEXT = "None"


def drafts_for(target_path: str) -> list[ModelEntry]:
    """The library's models that can draft for the model at `target_path`, smallest first
    (none when the target is not in the library or its header cannot be read)."""
    library = Library()
    try:
        target = library.get(target_path)
    except LibraryError:
        return []
    return compatible_drafts(target, library.listed())


class SpeculationDialog(QDialog):
    """The method and the draft model; `accepted` once they are saved."""

    def __init__(self, loaded_path: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Speculative Decoding")
        self.settings = Settings.load()
        self.loaded_path = loaded_path
        self.scans = 0  # finished draft scans, for whoever waits on one
        self.method = described(
            QComboBox(),
            "Method",
            "How the next tokens are guessed; the model checks every guess, so the reply is "
            "the one it would write anyway, and guessing stops by itself when it does not pay",
        )
        for mode in SPECULATION_MODES:
            self.method.addItem(METHOD_WORDS[mode], mode)
        self.method.setCurrentIndex(self.method.findData(self.settings.speculation))
        self.draft = described(
            QComboBox(),
            "Draft model",
            "A smaller model with the same tokenizer that guesses the next tokens",
        )
        self.draft.addItem(NONE_TEXT, None)
        self.status = QLabel(f"Looking for models that can draft for {model_name(loaded_path)}…")
        self.status.setWordWrap(True)
        self.status.setAccessibleName("Draft models found")
        self._show_saved_draft()

        form = QFormLayout()
        form.addRow("Method", self.method)
        form.addRow("Draft model", self.draft)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        self.buttons.accepted.connect(self.save)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        fit_to_screen(self)
        self._background = Background(self, library_error_words)
        self._background.run(
            library_pool(), lambda: drafts_for(loaded_path), self._found, self._failed
        )

    def _show_saved_draft(self) -> None:
        """The saved draft model is a row from the start, so saving keeps it unless changed."""
        saved = self.settings.draft_model
        if saved:
            self.draft.addItem(model_name(saved), saved)
            self.draft.setCurrentIndex(self.draft.count() - 1)

    def _found(self, drafts: list[ModelEntry]) -> None:
        self.scans += 1
        chosen = self.draft.currentData()
        self.draft.clear()
        self.draft.addItem(NONE_TEXT, None)
        for model in drafts:
            self.draft.addItem(
                f"{model.name}  ·  {decimal_bytes(model.size_bytes)}", str(model.path)
            )
        target = model_name(self.loaded_path)
        if chosen and self.draft.findData(chosen) < 0:  # saved for another model, or moved
            self.draft.addItem(f"{model_name(chosen)} (not a draft for {target})", chosen)
        self.draft.setCurrentIndex(max(0, self.draft.findData(chosen)))
        self.status.setText(
            f"{len(drafts)} model{'s' if len(drafts) != 1 else ''} of the library can draft for "
            f"{target} (same tokenizer, smaller)."
            if drafts
            else f"No smaller model of the library shares {target}'s tokenizer: add one of "
            "its family to draft with it."
        )

    def _failed(self, words: str) -> None:
        self.scans += 1
        self.status.setText(f"The library could not be read: {words}")

    def save(self) -> None:
        """Keep both choices; refuse the draft method without a draft model."""
        method, draft = self.method.currentData(), self.draft.currentData()
        if method == "draft" and not draft:
            self.status.setText("Choose a draft model for this method, or another method.")
            return
        settings = Settings.load()
        settings.speculation, settings.draft_model = method, draft
        try:
            settings.save()
        except paths.ReadOnlyError as exc:
            self.status.setText(str(exc))
            return
        except OSError as exc:
            self.status.setText(f"The settings could not be saved: {exc.strerror or 'no room'}.")
            return
        self.accept()
