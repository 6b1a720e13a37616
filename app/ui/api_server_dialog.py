"""Settings > API Server: serve the OpenAI-compatible API from the app, and show its key.

The switch starts or stops the server at once, on the window's engine (app/server/control.py
does the work; this is only the widgets) and is remembered for the next start. "Keep API
conversations in the window" (on by default) puts what clients ask and get in the sidebar,
marked API, from the next reply on. The key is
shown hidden, with Show, Copy and New key; it lives in the system keychain, or in memory
when there is none (the label says which).

Its texts change while it is open (serving starts, a port is taken), so it refits itself to
their wrapped height each time instead of letting them overlap; the key field is as wide as
the key, and the buttons keep their own width. Style (checkboxes in the dark theme) comes
api_server.qss.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from PySide6.QtGui import QGuiApplication, QIcon, QResizeEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from app import resources
from app.engine.protocol import EngineError
from app.server.control import LocalServer
from app.settings import Settings
from app.ui import theme
from app.ui.fit import fit_to_screen

_MIN_WIDTH = 520  # room for the longest status line to wrap into two or three lines
_FIELD_PADDING = 8  # a line edit's frame and inner padding on each side


def stylesheet() -> str:
    """The dialog's style sheet, its checked boxes ticked with icons/check.svg."""
    return theme.stylesheet("api_server.qss", check=resources.path("icons/check.svg").as_posix())


class ApiServerDialog(QDialog):
    def __init__(self, local: LocalServer, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("API Server")
        self.setObjectName("api-server")
        self.setStyleSheet(stylesheet())
        self.local = local
        self.task: asyncio.Task | None = None
        self._watched: list[Callable[[], None]] | None = None  # the served count's listeners
        self.finished.connect(lambda _code: self._watch(None))
        self.enabled = QCheckBox("Serve the OpenAI-compatible API on this machine (127.0.0.1)")
        self.enabled.setChecked(local.running)
        self.enabled.toggled.connect(self._toggled)
        self.keep = QCheckBox("Keep API conversations in the window")
        self.keep.setToolTip(
            "Each conversation a client holds with this server appears in the sidebar, "
            "marked API, and can be continued here"
        )
        self.keep.setChecked(local.keeping)
        self.keep.setEnabled(local.sink is not None)
        self.keep.toggled.connect(local.set_keeping)
        self.port = QSpinBox()
        self.port.setRange(1024, 65535)
        self.port.setValue(Settings.load().serve_port)
        self.port.setEnabled(not local.running)
        self.key = QLineEdit()
        self.key.setObjectName("api-key")
        self.key.setReadOnly(True)
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setAccessibleName("API key")
        show = self.show_key = QCheckBox("Show")
        show.toggled.connect(
            lambda on: self.key.setEchoMode(
                QLineEdit.EchoMode.Normal if on else QLineEdit.EchoMode.Password
            )
        )
        copy = self.copy_button = QPushButton("Copy")
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.key.text()))
        renew = self.renew_button = QPushButton("New key")
        renew.setToolTip("Make a new key; the old one stops working at once")
        renew.clicked.connect(self.renew_key)
        self.where = QLabel()
        self.where.setWordWrap(True)
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setAccessibleName("API server status")

        key_row = QHBoxLayout()
        key_row.addWidget(self.key, 1)
        for widget in (show, copy, renew):
            widget.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
            key_row.addWidget(widget)
        form = QFormLayout()
        form.addRow(self.enabled)
        form.addRow(self.keep)
        form.addRow("Port", self.port)
        form.addRow("API key", key_row)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        self.close_button = buttons.button(QDialogButtonBox.StandardButton.Close)
        self.close_button.setIcon(QIcon())  # the platform's icon is dark on dark in the dark theme
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.where)
        layout.addWidget(self.status)
        layout.addStretch(1)
        layout.addWidget(buttons)
        self._show_key()
        self._show_status()
        fit_to_screen(self)

    def key_width(self) -> int:
        """Pixels the key field needs to show the whole key, hidden or shown."""
        self.key.ensurePolished()  # the style sheet's font, not the default one
        metrics = self.key.fontMetrics()
        text = self.key.text()
        bullets = self.key.style().styleHint(QStyle.StyleHint.SH_LineEdit_PasswordCharacter)
        widest = max(
            metrics.horizontalAdvance(text), metrics.horizontalAdvance(chr(bullets) * len(text))
        )
        margins = self.key.textMargins()
        return widest + margins.left() + margins.right() + 2 * _FIELD_PADDING

    def _fit(self) -> None:
        """Grow to the wrapped height of the texts, so none overlaps another."""
        self.key.setMinimumWidth(self.key_width())
        layout = self.layout()
        layout.invalidate()
        layout.activate()
        width = max(self.width(), layout.minimumSize().width(), _MIN_WIDTH)
        height = layout.totalHeightForWidth(width)
        self.setMinimumSize(layout.minimumSize().width(), height)
        if self.width() < width or self.height() < height:
            self.resize(width, max(self.height(), height))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.setMinimumHeight(self.layout().totalHeightForWidth(self.width()))

    def _show_key(self) -> None:
        key = self.local.api_key()
        self.key.setText(key.value)
        self.where.setText(key.where)
        self._fit()

    def _show_status(self, error: str = "") -> None:
        server = self.local.server
        if error:
            self.status.setText(error)
        elif server is not None:
            count = server.stats.completed
            self.status.setText(
                f"Serving {server.model_id} at {server.url} — {count:,} "
                f"{'request' if count == 1 else 'requests'} answered. Clients send the key "
                "as 'Authorization: Bearer KEY'."
            )
        else:
            self.status.setText("Not serving.")
        self._watch(server.stats.listeners if server is not None and not error else None)
        self._fit()

    def _watch(self, listeners: list[Callable[[], None]] | None) -> None:
        """Follow the running server's count while the dialog is open (and only then)."""
        if self._watched is not None and self._show_status in self._watched:
            self._watched.remove(self._show_status)
        self._watched = listeners
        if listeners is not None and self._show_status not in listeners:
            listeners.append(self._show_status)

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
