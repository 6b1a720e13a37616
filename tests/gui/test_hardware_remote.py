"""Settings > Hardware's other machines: rpc-servers written as `stoke plan --rpc` takes them,
asked in the background, planned with, and kept for `stoke doctor` on Apply."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.hardware.detect import Hardware
from app.hardware.memory import GIB
from app.hardware.synthetic_gguf import write_deepseek4
from app.models import load_settings
from app.settings import Settings
from app.ui.hardware import HardwareWizard
from tests.gui.test_hardware_wizard import PLAN_TIMEOUT_MS, READ_TIMEOUT_MS, machine, settle


@pytest.fixture(scope="module")
def flash(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_deepseek4(tmp_path_factory.mktemp("flash") / "flash.gguf", mode="full")


@pytest.fixture
def open_wizard(qtbot: QtBot) -> Callable[..., HardwareWizard]:
    def opener(model: Path, hardware: Hardware) -> HardwareWizard:
        wizard = HardwareWizard(str(model), hardware)
        qtbot.addWidget(wizard)
        wizard.show()
        qtbot.waitExposed(wizard)
        settle(qtbot, wizard, READ_TIMEOUT_MS)
        return wizard

    return opener


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_described_machine_joins_the_plan_and_is_kept_on_apply(
    open_wizard: Callable[..., HardwareWizard],
    flash: Path,
    qtbot: QtBot,
) -> None:
    wizard = open_wizard(flash, machine(2, 24, 64))
    assert wizard.plan.rpc_servers == ()
    endpoint = f"127.0.0.1:{closed_port()}"  # not running: described by its size
    wizard.remote.edit.setText(f"{endpoint}=96GiB@10GbE")
    qtbot.mouseClick(wizard.remote.check_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(wizard.remote.devices), timeout=PLAN_TIMEOUT_MS)
    status = wizard.remote.status.text()
    assert f"RPC0[{endpoint}]: 96.0 GiB for the plan" in status
    assert f"{endpoint} was described, not measured: nothing listens at {endpoint}" in status
    qtbot.waitUntil(lambda: wizard.idle() and wizard.plan.rpc_servers == (endpoint,))
    p = settle(qtbot, wizard)
    assert p.device_order == (f"RPC0[{endpoint}]", "CUDA0", "CUDA1")
    assert p.device(f"RPC0[{endpoint}]").budget <= 96 * GIB and p.links

    with qtbot.waitSignal(wizard.applied, timeout=PLAN_TIMEOUT_MS):
        qtbot.mouseClick(wizard.apply_button, Qt.MouseButton.LeftButton)
    saved = load_settings.load(flash)
    assert list(saved["rpc_servers"]) == [endpoint]
    assert list(saved["devices"]) == list(p.device_order)
    assert Settings.load().rpc_servers == f"{endpoint}=96GiB@10GbE"


def test_a_line_that_is_not_an_address_is_said_in_words(
    open_wizard: Callable[..., HardwareWizard],
    flash: Path,
    qtbot: QtBot,
) -> None:
    wizard = open_wizard(flash, machine(1, 24, 64))
    wizard.remote.edit.setText("mac.local")
    qtbot.mouseClick(wizard.remote.check_button, Qt.MouseButton.LeftButton)
    assert wizard.remote.status.text() == (
        "'mac.local' is not HOST:PORT (an rpc-server's address, e.g. mac:50052)."
    )
    assert wizard.remote.devices == []
