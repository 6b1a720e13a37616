"""Every dialog opens no larger than the screen's available geometry (a 960 x 600 laptop
here), with its buttons on screen: Hardware, Models, Welcome, API Server, Remote Server,
Speculative Decoding, Import, Tools (with its server form) and a tool call's approval, the
first two of which opened at about 1100 x 900 and 1120 x 725."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QAbstractButton, QApplication, QDialog, QScrollArea, QWidget

from app.models.default import default_model_path
from app.tool_loop import CallRequest
from app.toolcalls.tools import ToolCall
from app.ui import fit
from app.ui.approval import ApprovalDialog
from app.ui.hardware import HardwareWizard
from app.ui.models import ImportDialog
from app.ui.remote_settings import RemoteSettingsDialog
from app.ui.server_form import ServerForm
from app.ui.speculation_dialog import SpeculationDialog
from app.ui.welcome import Welcome
from tests.gui.harness import Harness
from tests.gui.test_hardware_wizard import machine

SCREEN = QRect(0, 0, 960, 600)


@pytest.fixture(autouse=True)
def small_screen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fit, "available_geometry", lambda widget: SCREEN)


def scrolled(widget: QWidget) -> bool:
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QScrollArea):
            return True
        parent = parent.parentWidget()
    return False


def assert_fits(dialog: QDialog) -> None:
    """Within the screen, and every button outside a scroll area shown whole inside it."""
    dialog.show()
    QApplication.processEvents()
    assert dialog.width() <= SCREEN.width() and dialog.height() <= SCREEN.height(), (
        dialog.windowTitle(),
        dialog.size(),
    )
    buttons = [
        b
        for b in dialog.findChildren(QAbstractButton)
        if b.isVisible() and not scrolled(b) and b.objectName() != "qt_scrollarea_viewport"
    ]
    assert buttons, dialog.windowTitle()
    for button in buttons:
        rect = QRect(button.mapTo(dialog, QPoint(0, 0)), button.size())
        assert dialog.rect().contains(rect), (dialog.windowTitle(), button.text(), rect)


def test_the_hardware_wizard_fits_and_its_cards_scroll(qtbot) -> None:
    wizard = HardwareWizard(str(default_model_path()), machine(0, 0, 64))
    qtbot.addWidget(wizard)
    assert_fits(wizard)
    assert wizard.apply_button.isVisible()
    assert wizard.findChild(QScrollArea).verticalScrollBar().maximum() > 0  # the rest scrolls


def test_welcome_import_remote_and_speculation_settings_fit(qtbot) -> None:
    model = str(default_model_path())
    for dialog in (
        Welcome(model, ready=False),  # the longer sentence, while the model loads
        ImportDialog(),
        RemoteSettingsDialog(),
        SpeculationDialog(model),
        ServerForm(None),
        ApprovalDialog(CallRequest("tiny", "pid", {}, ToolCall("call-1", "pid", "{}"))),
    ):
        qtbot.addWidget(dialog)
        assert_fits(dialog)


def test_the_models_and_api_server_dialogs_fit(harness: Harness) -> None:
    window = harness.start()
    models = window.open_models()
    harness.wait_until(lambda: not models.busy)
    assert_fits(models)
    api = window.open_api_server_settings()
    assert_fits(api)
    tools = window.open_tools_settings()
    assert_fits(tools)
