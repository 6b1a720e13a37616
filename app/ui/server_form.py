"""Settings > Tools > Add or Edit: one MCP server's entry, as a form.

A server is either a command Stoke runs (the command, its arguments one per line, never one
shell string to split, environment variables as NAME=value lines, an optional folder) or a
URL it connects to (with NAME: value header lines, for a token). Saving writes mcp.json
through app/mcp/config.py; what it refuses (a name taken, a part it would not read back) is
said under the form in its words and the form stays open with everything typed kept.
"""

from __future__ import annotations

from collections.abc import Mapping

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from app.mcp import config
from app.mcp.config import Http, Server, Stdio
from app.ui.fit import fit_to_screen


def _lines(edit: QPlainTextEdit) -> list[str]:
    return [line.strip() for line in edit.toPlainText().splitlines() if line.strip()]


def _pairs(edit: QPlainTextEdit, separator: str, what: str) -> dict[str, str]:
    """NAME<separator>value lines as a mapping; ValueError in words for a line without one."""
    pairs: dict[str, str] = {}
    for line in _lines(edit):
        name, found, value = line.partition(separator)
        if not found or not name.strip():
            raise ValueError(f"“{line}” is not a {what} (NAME{separator}value).")
        pairs[name.strip()] = value.strip()
    return pairs


def _shown(pairs: Mapping[str, str], separator: str) -> str:
    return "\n".join(f"{name}{separator}{value}" for name, value in pairs.items())


class ServerForm(QDialog):
    """Adds a server (`editing` None) or changes entry `editing` of mcp.json."""

    def __init__(self, editing: Server | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Edit MCP server" if editing else "Add MCP server")
        self.setObjectName("mcp-server-form")
        self.editing = editing
        self.name = QLineEdit(self)
        self.name.setAccessibleName("Server name")
        self.runs = QRadioButton("Run a command on this machine", self)
        self.connects = QRadioButton("Connect to a URL (Streamable HTTP)", self)
        self.command = QLineEdit(self)
        self.command.setAccessibleName("Command")
        self.command.setPlaceholderText("For example: npx, uvx, or a full path")
        self.args = QPlainTextEdit(self)
        self.args.setAccessibleName("Arguments, one per line")
        self.env = QPlainTextEdit(self)
        self.env.setAccessibleName("Environment variables")
        self.env.setPlaceholderText("NAME=value, one per line")
        self.cwd = QLineEdit(self)
        self.cwd.setAccessibleName("Folder")
        self.cwd.setPlaceholderText("Optional: the folder it runs in")
        self.url = QLineEdit(self)
        self.url.setAccessibleName("URL")
        self.url.setPlaceholderText("https://example.com/mcp")
        self.headers = QPlainTextEdit(self)
        self.headers.setAccessibleName("Headers")
        self.headers.setPlaceholderText("Authorization: Bearer TOKEN, one per line")
        for edit in (self.args, self.env, self.headers):
            edit.setTabChangesFocus(True)
            edit.setMaximumHeight(90)
        self.problem = QLabel(self)
        self.problem.setObjectName("form-problem")
        self.problem.setWordWrap(True)
        self.problem.hide()

        form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow(self.runs)
        form.addRow("Command", self.command)
        form.addRow("Arguments", self.args)
        form.addRow("Environment", self.env)
        form.addRow("Folder", self.cwd)
        form.addRow(self.connects)
        form.addRow("URL", self.url)
        form.addRow("Headers", self.headers)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel, self
        )
        buttons.accepted.connect(self.save)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.problem)
        layout.addWidget(buttons)
        self.runs.toggled.connect(self._kind)
        self._fill(editing)
        fit_to_screen(self)

    def _fill(self, server: Server | None) -> None:
        launch = server.launch if server else Stdio("")
        self.name.setText(server.name if server else "")
        if isinstance(launch, Stdio):
            self.runs.setChecked(True)
            self.command.setText(launch.command)
            self.args.setPlainText("\n".join(launch.args))
            self.env.setPlainText(_shown(launch.env, "="))
            self.cwd.setText(launch.cwd or "")
        else:
            self.connects.setChecked(True)
            self.url.setText(launch.url)
            self.headers.setPlainText(_shown(launch.headers, ": "))
        self._kind()

    def _kind(self) -> None:
        running = self.runs.isChecked()
        for widget in (self.command, self.args, self.env, self.cwd):
            widget.setEnabled(running)
        for widget in (self.url, self.headers):
            widget.setEnabled(not running)

    def server(self) -> Server:
        """The entry as typed; ValueError in words for a line that cannot be read."""
        launch: Stdio | Http
        if self.runs.isChecked():
            launch = Stdio(
                self.command.text().strip(),
                tuple(_lines(self.args)),
                _pairs(self.env, "=", "variable"),
                self.cwd.text().strip() or None,
            )
        else:
            launch = Http(self.url.text().strip(), _pairs(self.headers, ":", "header"))
        old = self.editing
        return Server(
            self.name.text().strip(),
            launch,
            enabled=old.enabled if old else True,
            trusted=old.trusted if old else False,
            always_allow=old.always_allow if old else (),
        )

    def save(self) -> None:
        """Written to mcp.json and closed; or the reason why not, in words, under the form."""
        try:
            server = self.server()
            if self.editing is None:
                config.add_server(server)
            else:
                config.edit_server(self.editing.name, server)
        except (ValueError, config.ConfigError) as exc:
            self.problem.setText(str(exc))
            self.problem.show()
            return
        self.accept()
