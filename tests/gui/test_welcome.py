"""The first start opens a short welcome in plain words, not the expert Hardware dialog, with
the window rather than after the model loads; the Hardware dialog is one click away; the
second start shows neither."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication, QDialog

from app.engine.protocol import LoadOptions
from app.hardware.detect import detect
from app.models.default import default_model_path
from app.ui.app import first_run, open_window
from app.ui.hardware import HardwareWizard
from app.ui.welcome import ABOUT, CHECKING, Welcome, hardware_sentence
from tests.gui.harness import Harness


def test_first_run_welcomes_in_plain_words_and_the_second_shows_nothing(
    harness: Harness,
) -> None:
    window = harness.start()
    shown = first_run(window)
    assert isinstance(shown, Welcome) and not isinstance(shown, HardwareWizard)
    assert not window.findChildren(HardwareWizard)
    assert shown.about.text() == ABOUT
    assert shown.model.text() == (
        "The bundled model, SmolLM2-135M-Instruct.Q4_1, is ready: type a message below to start."
    )
    harness.wait_until(shown.checked)
    assert shown.hardware.text() != CHECKING
    assert shown.hardware.text() == hardware_sentence(detect())  # what the check found
    assert " GiB " in shown.hardware.text()  # memory in binary units, as everywhere
    for label in (shown.about, shown.model, shown.hardware):
        assert label.wordWrap() and "Traceback" not in label.text()
    assert shown.start_button.isDefault()
    closed: list[int] = []
    shown.finished.connect(closed.append)
    harness.act(shown.start_button.click)
    assert closed == [QDialog.DialogCode.Accepted.value]

    assert first_run(window) is None  # the second start: neither the welcome nor the wizard
    assert not window.findChildren(HardwareWizard)


def test_hardware_details_opens_the_hardware_dialog(harness: Harness) -> None:
    window = harness.start()
    shown = first_run(window)
    assert isinstance(shown, Welcome)
    closed: list[int] = []
    shown.finished.connect(closed.append)
    harness.act(shown.details_button.click)
    harness.wait_until(lambda: any(w.isVisible() for w in window.findChildren(HardwareWizard)))
    assert closed == [QDialog.DialogCode.Accepted.value]  # the welcome gave way to the dialog


def test_the_welcome_opens_with_the_window_while_the_model_loads(harness: Harness) -> None:
    """The app's own start: the welcome is up before the engine has loaded the model, says
    it is loading, then that it is ready."""
    load = LoadOptions(str(default_model_path()), n_ctx=4096)
    opening = harness.loop.create_task(open_window(load, None, "light", welcome=True))

    def welcome() -> Welcome | None:
        shown = [w for w in QApplication.topLevelWidgets() if isinstance(w, Welcome)]
        return shown[0] if shown and shown[0].isVisible() else None

    harness.wait_until(lambda: welcome() is not None)
    assert not opening.done()  # open_window still waits for the engine to load the model
    assert "is loading" in welcome().model.text()
    harness.window, harness.session = harness.run(opening)
    harness.run(harness.window.prewarm.idle())
    harness.wait_until(lambda: "is ready" in welcome().model.text())
