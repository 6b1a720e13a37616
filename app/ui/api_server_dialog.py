"""Settings > API Server: serve the OpenAI-compatible API from the app, and show its key.

The switch starts or stops the server at once, on the window's engine (app/server/control.py
does the work; this is only the widgets) and is remembered for the next start. The key is
shown hidden, with Show, Copy and New key; it lives in the system keychain, or in memory
when there is none (the label says which).
"""

from __future__ import annotations

import asyncio

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.engine.protocol import EngineError
from app.server.control import LocalServer
from app.settings import Settings


class ApiServerDialog(QDialog):
    def __init__(self, local: LocalServer, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("API Server")
        self.local = local
        self.task: asyncio.Task | None = None
        self.enabled = QCheckBox("Serve the OpenAI-compatible API on this machine (127.0.0.1)")
        self.enabled.setChecked(local.running)
        self.enabled.toggled.connect(self._toggled)
        self.port = QSpinBox()
        self.port.setRange(1024, 65535)
        self.port.setValue(Settings.load().serve_port)
        self.port.setEnabled(not local.running)
        self.key = QLineEdit()
        self.key.setReadOnly(True)
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setAccessibleName("API key")
        show = QCheckBox("Show")
        show.toggled.connect(
            lambda on: self.key.setEchoMode(
                QLineEdit.EchoMode.Normal if on else QLineEdit.EchoMode.Password
            )
        )
        copy = QPushButton("Copy")
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.key.text()))
        renew = QPushButton("New key")
        renew.setToolTip("Make a new key; the old one stops working at once")
        renew.clicked.connect(self.renew_key)
        self.where = QLabel()
        self.where.setWordWrap(True)
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setAccessibleName("API server status")

        key_row = QHBoxLayout()
        for widget in (self.key, show, copy, renew):
            key_row.addWidget(widget)
        form = QFormLayout()
        form.addRow(self.enabled)
        form.addRow("Port", self.port)
        form.addRow("API key", key_row)
        form.addRow("", self.where)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(buttons)
        self._show_key()
        self._show_status()

    def _show_key(self) -> None:
        key = self.local.api_key()
        self.key.setText(key.value)
        self.where.setText(key.where)

    def _show_status(self, error: str = "") -> None:
        server = self.local.server
        if error:
            self.status.setText(error)
        elif server is not None:
            self.status.setText(
                f"Serving {server.model_id} at {server.url} — {server.stats.completed} "
                "requests answered. Clients send the key as 'Authorization: Bearer KEY'."
            )
        else:
            self.status.setText("Not serving.")

    def _toggled(self, on: bool) -> None:
        self._remember(on)
        self.port.setEnabled(False)
        self.task = asyncio.ensure_future(self._switch(on))

    async def _switch(self, on: bool) -> None:
        error = ""
        try:
            if on:
                await self.local.start(self.port.value())
            else:
                await self.local.stop()
        except EngineError as exc:
            error = str(exc)
            self._remember(False)
            self.enabled.blockSignals(True)
            self.enabled.setChecked(False)
            self.enabled.blockSignals(False)
        self.port.setEnabled(not self.local.running)
        self._show_status(error)

    def _remember(self, on: bool) -> None:
        """Serve at the next start too (or not), on this port."""
        settings = Settings.load()
        settings.serve_on_start = on
        settings.serve_port = self.port.value()
        settings.save()

    def renew_key(self) -> None:
        self.local.renew_key()
        self._show_key()
