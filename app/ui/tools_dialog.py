"""Settings > Tools: the MCP servers of mcp.json, each with its state, and what a person does
with them: add, edit, remove, turn on or off, trust, forget the tools always allowed, import
another app's, connect now; and the rounds of tool calls one chat turn may take.

A server's state is the app-wide pool's (chat_tools.py), heard as it changes: stopped until
first needed (or Connect), starting, ready with its number of tools, failed with why in words.
An entry mcp.json refuses is listed with why, and can be edited (that is how it is fixed) or
removed; a file refused whole is said above the list, and nothing can be changed until it is
fixed by hand. Each change is written at once (no Apply to forget); one that changes what a
server runs restarts the pool, so the next use reads the file again. Trust never restarts
anything: the runner reads it at each call. Every refusal is a sentence in the dialog.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QSignalBlocker, Qt
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QListView,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.mcp import config, other_apps, trust
from app.mcp.client import ServerState
from app.mcp.config import McpConfig, Server
from app.settings import Settings
from app.ui.chat_tools import ChatTools
from app.ui.fit import fit_to_screen
from app.ui.server_form import ServerForm

NAME_ROLE = Qt.ItemDataRole.UserRole


def state_words(server: Server, state: ServerState | None) -> str:
    """A server's line in the list: its name and where it stands."""
    where = str(state or ServerState("stopped")) if server.enabled else "turned off"
    return f"{server.name} — {where}" + (" · trusted" if server.trusted else "")


class ToolsDialog(QDialog):
    """Settings > Tools (see the module's docstring)."""

    def __init__(self, tools: ChatTools, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Tools")
        self.setObjectName("tools-settings")
        self.tools = tools
        self.task: asyncio.Task | None = None
        self.found = McpConfig()
        self.problem = QLabel(self)
        self.problem.setObjectName("tools-problem")
        self.problem.setWordWrap(True)
        self.list = QListWidget(self)
        self.list.setAccessibleName("MCP servers")
        # a failed server's reason is read whole, wrapped, not behind a sideways scroll
        self.list.setWordWrap(True)
        self.list.setResizeMode(QListView.ResizeMode.Adjust)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.add_button = QPushButton("Add…", self)
        self.edit_button = QPushButton("Edit…", self)
        self.remove_button = QPushButton("Remove", self)
        self.import_button = QToolButton(self)
        self.import_button.setText("Import…")
        self.import_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.import_menu = QMenu(self.import_button)
        self.import_button.setMenu(self.import_menu)
        self.import_menu.aboutToShow.connect(self._fill_import_menu)
        self.connect_button = QPushButton("Connect", self)
        self.connect_button.setToolTip(
            "Start the servers that are turned on now, to see their tools (they start by "
            "themselves when a chat first needs them)"
        )
        self.enabled = QCheckBox("Turned on (its tools are offered in chats)", self)
        self.trusted = QCheckBox("Trusted: run its tools without asking", self)
        self.always = QLabel(self)
        self.always.setObjectName("always-allowed")
        self.always.setWordWrap(True)
        self.forget_button = QPushButton("Ask again", self)
        self.forget_button.setToolTip("Ask before each call of these tools again")
        self.rounds = QSpinBox(self)
        self.rounds.setRange(1, 1000)
        self.rounds.setAccessibleName("Rounds of tool calls per turn")
        self.rounds.setToolTip(
            "The most rounds of tool calls one reply may take before it stops; Continue "
            "lets the model go on"
        )
        self.rounds.setValue(Settings.load().tool_rounds)
        self.said = QLabel(self)
        self.said.setObjectName("tools-said")
        self.said.setWordWrap(True)

        buttons_row = QHBoxLayout()
        for button in (
            self.add_button,
            self.edit_button,
            self.remove_button,
            self.import_button,
            self.connect_button,
        ):
            buttons_row.addWidget(button)
        buttons_row.addStretch(1)
        form = QFormLayout()
        form.addRow("Rounds per turn", self.rounds)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        close.button(QDialogButtonBox.StandardButton.Close).setIcon(QIcon())
        close.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(
            QLabel("MCP servers give the model tools; you approve each call unless you trust it.")
        )
        layout.addWidget(self.problem)
        layout.addWidget(self.list, 1)
        layout.addLayout(buttons_row)
        layout.addWidget(self.enabled)
        layout.addWidget(self.trusted)
        always_row = QHBoxLayout()
        always_row.addWidget(self.always, 1)
        always_row.addWidget(self.forget_button)
        layout.addLayout(always_row)
        layout.addLayout(form)
        layout.addWidget(self.said)
        layout.addWidget(close)
        self.resize(560, 420)

        self.add_button.clicked.connect(lambda: self.open_form(None))
        self.edit_button.clicked.connect(lambda: self.open_form(self.selected()))
        self.remove_button.clicked.connect(self.remove)
        self.connect_button.clicked.connect(self.connect_all)
        self.enabled.toggled.connect(self._enabled)
        self.trusted.toggled.connect(self._trusted)
        self.forget_button.clicked.connect(self.forget_always)
        self.rounds.valueChanged.connect(self._rounds)
        self.list.currentItemChanged.connect(lambda *_: self._show_selected())
        tools.state_changed.connect(self._state_changed)  # a bound slot: gone with the dialog
        self.refresh()
        fit_to_screen(self)

    # -- what is shown --

    def selected(self) -> str | None:
        item = self.list.currentItem()
        return None if item is None else item.data(NAME_ROLE)

    def refresh(self) -> None:
        """The list as mcp.json and the pool have it now, the selection kept."""
        keep = self.selected()
        self.found = config.load()
        self.problem.setText(self.found.problem or "")
        self.problem.setVisible(self.found.problem is not None)
        states = self.tools.states()
        with QSignalBlocker(self.list):
            self.list.clear()
            for server in self.found.servers:
                self._item(server.name, state_words(server, states.get(server.name)))
            for name, why in self.found.refused.items():
                self._item(name, f"{name} — not used: {why}")
            names = [self.list.item(i).data(NAME_ROLE) for i in range(self.list.count())]
            self.list.setCurrentRow(names.index(keep) if keep in names else 0)
        editable = self.found.problem is None
        for button in (self.add_button, self.import_button):
            button.setEnabled(editable)
        self._show_selected()

    def _item(self, name: str, text: str) -> None:
        item = QListWidgetItem(text, self.list)
        item.setData(NAME_ROLE, name)

    def _show_selected(self) -> None:
        name = self.selected()
        server = self.found.server(name) if name else None
        for button in (self.edit_button, self.remove_button):
            button.setEnabled(name is not None)
        for box, on in (
            (self.enabled, server is not None and server.enabled),
            (self.trusted, server is not None and server.trusted),
        ):
            with QSignalBlocker(box):
                box.setChecked(on)
            box.setEnabled(server is not None)
        allowed = server.always_allow if server is not None else ()
        self.always.setText("Always allowed: " + ", ".join(allowed) if allowed else "")
        self.always.setVisible(bool(allowed))
        self.forget_button.setVisible(bool(allowed))

    def _state_changed(self, _name: str, _state: ServerState) -> None:
        self.refresh()

    def say(self, text: str) -> None:
        self.said.setText(text)

    # -- changes --

    def open_form(self, name: str | None) -> ServerForm:
        """Add (None) or Edit the named entry; the list follows once it is saved."""
        editing = None
        if name is not None:
            editing = self.found.server(name) or self._refused(name)
        form = ServerForm(editing, self)
        form.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        form.accepted.connect(self._changed)
        form.open()
        return form

    def _refused(self, name: str) -> Server:
        """A refused entry to fix: its name, and a command to fill in."""
        return Server(name, config.Stdio(""))

    def remove(self) -> None:
        name = self.selected()
        if name is not None and self._edit(lambda: config.remove_server(name)):
            self.say(f"Removed “{name}”.")

    def forget_always(self) -> None:
        """The selected server's tools ask before each call again (those always allowed)."""
        name = self.selected()
        if name is not None:
            self._edit(lambda: config.update(name, always_allow=()), restart=False)

    def import_from(self, path: Path) -> None:
        """Another app's servers added (trust never comes along); what was left out, said."""
        try:
            done = other_apps.import_from(path)
        except config.ConfigError as exc:
            self.say(str(exc))
            return
        added = ", ".join(f"“{name}”" for name in done.added) or "no server"
        self.say(" ".join([f"Imported {added} from {path}.", *done.left_out]))
        self._changed()

    def connect_all(self) -> asyncio.Task:
        """Start every server that is turned on, to show its tools or why it failed."""
        self.task = asyncio.ensure_future(self.tools.pool.tools())  # states say how it went
        return self.task

    def _fill_import_menu(self) -> None:
        self.import_menu.clear()
        for found in other_apps.known_files():
            action = self.import_menu.addAction(f"From {found.app} ({found.path})")
            action.triggered.connect(lambda _=False, p=found.path: self.import_from(p))
        other = self.import_menu.addAction("From a file…")
        other.triggered.connect(self._import_file)

    def _import_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import MCP servers", "", "JSON (*.json)")
        if path:
            self.import_from(Path(path))

    def _enabled(self, on: bool) -> None:
        name = self.selected()
        if name is not None:
            self._edit(lambda: config.update(name, enabled=on))

    def _trusted(self, on: bool) -> None:
        name = self.selected()
        if name is not None:
            self._edit(lambda: trust.set_trusted(name, on), restart=False)

    def _rounds(self, value: int) -> None:
        settings = Settings.load()
        settings.tool_rounds = value
        settings.save()

    def _edit(self, change: Callable[[], object], restart: bool = True) -> bool:
        """Run a change of mcp.json; its refusal said in words."""
        try:
            change()
        except config.ConfigError as exc:
            self.say(str(exc))
            self.refresh()
            return False
        if restart:
            self._changed()
        else:
            self.refresh()
        return True

    def _changed(self) -> None:
        self.tools.reconfigured()
        self.refresh()
