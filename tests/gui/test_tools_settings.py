"""Settings > Tools in the real window: mcp.json's servers with their states from the app's
pool (the tests' own MCP server over stdio, and one that fails to start), and every change a
person makes there written to mcp.json; the conversation's own switch for tools."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtWidgets import QApplication

from app.conversations import ConversationStore
from app.mcp import config, trust
from app.mcp.config import Http, Stdio
from app.settings import Settings
from app.ui.chat_tools import SERVERS_KEY
from app.ui.server_form import ServerForm
from app.ui.settings_panel import ConversationSettings
from app.ui.tools_dialog import ToolsDialog
from tests.gui.harness import Harness
from tests.unit.test_mcp_pool import tiny


def _lines(dialog: ToolsDialog) -> list[str]:
    return [dialog.list.item(i).text() for i in range(dialog.list.count())]


def _select(dialog: ToolsDialog, name: str) -> None:
    (row,) = [i for i, line in enumerate(_lines(dialog)) if line.startswith(f"{name} —")]
    dialog.list.setCurrentRow(row)


def _form() -> ServerForm:
    (form,) = [w for w in QApplication.topLevelWidgets() if isinstance(w, ServerForm)]
    return form


def test_servers_are_listed_with_their_states_and_changed_in_mcp_json(
    harness: Harness, tmp_path: Path
) -> None:
    config.add_servers([tiny(), tiny("broken", "--fail", "cannot find the database")])
    path = config.config_path()
    document = json.loads(path.read_text())
    document["mcpServers"]["odd"] = {"command": 3}
    path.write_text(json.dumps(document))
    window = harness.start()
    (menu_item,) = [a for a in window.actions() if a.objectName() == "tools"]
    harness.act(menu_item.trigger)
    (dialog,) = [w for w in QApplication.topLevelWidgets() if isinstance(w, ToolsDialog)]

    assert _lines(dialog)[:2] == ["tiny — stopped", "broken — stopped"]
    assert _lines(dialog)[2].startswith("odd — not used: mcpServers.odd")
    harness.act(dialog.connect_all)
    harness.wait_until(
        lambda: {s.phase for s in window.tools.states().values()} == {"ready", "failed"}
    )
    tiny_line, broken_line = _lines(dialog)[:2]
    assert tiny_line == "tiny — ready (6 tools)"
    assert broken_line.startswith("broken — failed:") and "cannot find the database" in broken_line
    assert dialog.list.horizontalScrollBar().maximum() == 0  # the reason wraps, read whole

    trust.set_always_allowed("tiny", "pid", True)  # the approval prompt's Always allow
    harness.act(dialog.refresh)
    _select(dialog, "tiny")
    assert dialog.always.text() == "Always allowed: pid" and dialog.forget_button.isVisible()
    harness.act(dialog.forget_button.click)
    assert config.load().server("tiny").always_allow == () and not dialog.always.isVisible()
    harness.act(lambda: dialog.trusted.setChecked(True))
    assert config.load().server("tiny").trusted and _lines(dialog)[0].endswith("· trusted")
    _select(dialog, "broken")
    harness.act(lambda: dialog.enabled.setChecked(False))
    assert not config.load().server("broken").enabled
    assert "broken — turned off" in _lines(dialog)

    harness.act(lambda: dialog.open_form(None))
    form = _form()
    form.name.setText("tiny")
    form.command.setText("python3")
    harness.act(form.save)
    assert form.isVisible() and "already an MCP server named “tiny”" in form.problem.text()
    form.name.setText("remote")
    form.connects.setChecked(True)
    form.url.setText("http://127.0.0.1:9/mcp")
    form.headers.setPlainText("Authorization: Bearer secret")
    harness.act(form.save)
    remote = config.load().server("remote")
    assert remote.launch == Http("http://127.0.0.1:9/mcp", {"Authorization": "Bearer secret"})
    assert "remote — stopped" in _lines(dialog)

    _select(dialog, "odd")  # a refused entry is fixed by editing it
    harness.act(lambda: dialog.open_form("odd"))
    form = _form()
    form.command.setText("python3")
    form.args.setPlainText("-m\nhttp.server")
    form.env.setPlainText("TOKEN=abc")
    harness.act(form.save)
    assert config.load().server("odd").launch == Stdio(
        "python3", ("-m", "http.server"), {"TOKEN": "abc"}
    )
    _select(dialog, "remote")
    harness.act(dialog.remove)
    assert config.load().server("remote") is None and "Removed “remote”." in dialog.said.text()

    other = tmp_path / "claude_desktop_config.json"
    entry = {"command": "uvx", "args": ["mcp-server-time"], "trusted": True}
    other.write_text(json.dumps({"mcpServers": {"time": entry, "tiny": {"command": "x"}}}))
    harness.act(lambda: dialog.import_from(other))
    time = config.load().server("time")
    assert time is not None and not time.trusted  # trust never comes from another app
    assert "Imported “time”" in dialog.said.text() and "“tiny” is already" in dialog.said.text()

    harness.act(lambda: dialog.rounds.setValue(3))
    assert Settings.load().tool_rounds == 3


def test_a_conversation_turns_its_tools_off_and_on(
    panel: ConversationSettings, store: ConversationStore
) -> None:
    conversation = store.create_conversation(sampling={"temperature": 0.5})
    panel.load(conversation.id)
    assert panel.use_tools.isChecked()  # on unless the conversation says otherwise
    panel.use_tools.setChecked(False)
    panel.flush()
    assert store.get_conversation(conversation.id).sampling == {
        "temperature": 0.5,
        SERVERS_KEY: [],
    }
    panel.load(conversation.id)
    assert not panel.use_tools.isChecked()
    panel.use_tools.setChecked(True)
    panel.flush()
    assert store.get_conversation(conversation.id).sampling == {"temperature": 0.5}
