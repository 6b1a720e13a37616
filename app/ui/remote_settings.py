"""Settings > Remote Server: chat through an OpenAI-compatible server instead of this machine.

The URL, model id, wire mode and an optional local GGUF (for exact token prompts) go to
settings.json; the API key goes to the keychain through app/remote_config.py, never to disk.
"Test" asks the server for its models off the UI thread, so a slow server never freezes the
window. Saving switches the window's engine at once (the main window reloads it in the
background, keeping the conversation open).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.engine.protocol import EngineError
from app.engine.remote import MODES, probe
from app.remote_config import api_key, remote_options, save_api_key
from app.settings import Settings
from app.ui.fit import fit_to_screen


class RemoteSettingsDialog(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Remote Server")
        self.settings = Settings.load()
        self.use_remote = QCheckBox("Chat through this server")
        self.use_remote.setChecked(self.settings.engine == "remote")
        self.url = QLineEdit(self.settings.remote_url or "")
        self.url.setPlaceholderText("http://gpu-box:8000")
        self.model = QLineEdit(self.settings.remote_model or "")
        self.model.setPlaceholderText("the server's only model")
        self.mode = QComboBox()
        self.mode.addItems(MODES)
        self.mode.setCurrentText(self.settings.remote_mode)
        self.tokenizer = QLineEdit(self.settings.remote_tokenizer or "")
        self.tokenizer.setPlaceholderText("optional: a GGUF of the same model")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        saved_key = api_key(self.settings.remote_url) if self.settings.remote_url else None
        self.key = QLineEdit(saved_key or "")
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.test_button = QPushButton("Test")
        self.test_button.clicked.connect(self.test)
        self._test: asyncio.Task | None = None

        tokenizer_row = QHBoxLayout()
        tokenizer_row.addWidget(self.tokenizer)
        tokenizer_row.addWidget(browse)
        form = QFormLayout()
        form.addRow(self.use_remote)
        form.addRow("URL", self.url)
        form.addRow("Model", self.model)
        form.addRow("Mode", self.mode)
        form.addRow("Tokenizer", tokenizer_row)
        form.addRow("API key", self.key)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.addButton(self.test_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.accepted.connect(self.save)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(
            QLabel("Token modes send Stoke's exact transcript, so the server's cache hits.")
        )
        layout.addWidget(self.status)
        layout.addWidget(buttons)
        fit_to_screen(self)

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Tokenizer GGUF", "", "GGUF (*.gguf)")
        if path:
            self.tokenizer.setText(path)

    def _edited(self) -> Settings:
        settings = Settings.load()
        settings.remote_url = self.url.text().strip() or None
        settings.remote_model = self.model.text().strip() or None
        settings.remote_mode = self.mode.currentText()
        settings.remote_tokenizer = self.tokenizer.text().strip() or None
        if self.use_remote.isChecked():
            settings.engine = "remote"
        elif settings.engine == "remote":
            settings.engine = "auto"
        return settings

    def save(self) -> None:
        """Keep the settings and the key; refuse a remote engine without a URL."""
        settings = self._edited()
        if settings.engine == "remote" and not settings.remote_url:
            self.status.setText("Give the server's URL to chat through it.")
            return
        settings.save()
        if settings.remote_url:
            self.status.setText(save_api_key(settings.remote_url, self.key.text()))
        self.accept()

    def test(self) -> asyncio.Task:
        """Ask the server for its models (in a worker thread); the answer shows below."""
        self.status.setText("Asking the server…")
        self.test_button.setEnabled(False)
        self._test = asyncio.ensure_future(self._probe(self._edited()))
        return self._test

    async def _probe(self, settings: Settings) -> None:
        try:
            remote = replace(remote_options(settings), api_key=self.key.text() or None)
            models = await asyncio.get_running_loop().run_in_executor(None, probe, remote)
        except EngineError as exc:
            self.status.setText(str(exc))
        else:
            self.status.setText(f"Reachable; it serves {', '.join(models) or 'no models'}.")
        finally:
            self.test_button.setEnabled(True)
