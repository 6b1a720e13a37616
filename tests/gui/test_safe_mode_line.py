"""The settings panel's safe-mode line: over the real engine client (no engine process), it
says when the model loads conservatively after a crash here and Clear forgets that; in the
window, Clear also reloads the model with its own settings (issue 33)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot

from app.engine.host import EngineClient, EngineState
from app.engine.protocol import LoadOptions
from app.engine.safe_mode import SafeModeRecords, is_conservative
from app.models.default import default_model_path
from app.ui.safe_mode_line import SafeModeLine
from tests.gui.harness import Harness


def test_the_line_shows_the_record_and_clear_removes_it(qtbot: QtBot, tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    options = LoadOptions(str(model), n_ctx=300)
    engine = EngineClient(options, backend="llama.cpp")
    panel = QWidget()  # as in the window: the line sits in the settings panel
    line = SafeModeLine(engine, panel)
    qtbot.addWidget(panel)
    panel.show()
    assert not line.isVisible()  # no record: nothing to say

    SafeModeRecords().record("llama.cpp", options, "killed by SIGABRT")
    engine._set_state(EngineState.READY, "")  # a load finished: the line asks again
    assert line.isVisible()
    assert line.text.text().startswith("Safe mode: model.gguf loads on llama.cpp with conservative")
    assert "killed by SIGABRT" in line.text.text() and "n_ctx=300" in line.text.text()

    with qtbot.waitSignal(line.cleared, timeout=1000):
        qtbot.mouseClick(line.clear_button, Qt.MouseButton.LeftButton)
    assert not line.isVisible()
    assert SafeModeRecords().entries() == []


def test_clear_in_the_window_reloads_the_model_with_its_own_settings(harness: Harness) -> None:
    crashed = LoadOptions(str(default_model_path()), n_ctx=4096)
    SafeModeRecords().record("llama.cpp", crashed, "killed by SIGSEGV")
    window = harness.start()
    engine = window.session.engine
    assert is_conservative(engine.launch_options)
    harness.act(window.toggle_settings)
    harness.wait_until(window.safe_mode_line.isVisible)

    harness.act(window.safe_mode_line.clear_button.click)
    harness.run(asyncio.shield(window.model_switcher.reloading))
    assert engine.info is not None and not is_conservative(engine.launch_options)
    assert not window.safe_mode_line.isVisible() and SafeModeRecords().entries() == []
