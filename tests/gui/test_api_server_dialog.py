"""Settings > API Server: left on, the app serves at start-up on the window's own engine; the
dialog shows the key (hidden), a new key locks the old one out, and the switch stops it."""

from __future__ import annotations

import asyncio
import socket

import openai
import pytest
from PySide6.QtWidgets import QLineEdit

from app.settings import Settings
from tests.gui.harness import Harness


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_api_server_setting_serves_the_window_engine(harness: Harness) -> None:
    port = _free_port()
    settings = Settings.load()
    settings.serve_on_start, settings.serve_port = True, port
    settings.save()
    window = harness.start()
    assert window.api_server.running  # the setting was left on

    dialog = window.open_api_server_settings()
    assert dialog.enabled.isChecked() and not dialog.port.isEnabled()
    assert f"127.0.0.1:{port}/v1" in dialog.status.text()
    key = dialog.key.text()
    assert key and dialog.key.echoMode() == QLineEdit.EchoMode.Password
    assert "keychain" in dialog.where.text() or "until Stoke quits" in dialog.where.text()

    model = window.api_server.server.model_id

    def ask(api_key: str) -> int:  # a client in another thread: the loop keeps serving
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=api_key)
        reply = client.with_options(max_retries=0).chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
        )
        return reply.usage.completion_tokens

    loop = asyncio.get_event_loop()
    assert "0 requests answered" in dialog.status.text()
    assert harness.run(loop.run_in_executor(None, ask, key)) > 0
    assert "1 request answered" in dialog.status.text()  # live while the dialog is open

    harness.act(dialog.renew_key)
    assert dialog.key.text() != key
    with pytest.raises(openai.AuthenticationError):
        harness.run(loop.run_in_executor(None, ask, key))
    assert harness.run(loop.run_in_executor(None, ask, dialog.key.text())) > 0

    harness.act(lambda: dialog.enabled.setChecked(False))
    harness.run(asyncio.shield(dialog.task))
    assert not window.api_server.running and dialog.status.text() == "Not serving."
    assert not Settings.load().serve_on_start
    with pytest.raises(openai.APIConnectionError):
        harness.run(loop.run_in_executor(None, ask, dialog.key.text()))


@pytest.mark.parametrize("theme_name", ["light", "dark"])
def test_serving_fits_the_dialog_in_both_themes(harness: Harness, theme_name: str) -> None:
    from PySide6.QtCore import QRect
    from PySide6.QtGui import QPalette
    from PySide6.QtWidgets import QApplication, QCheckBox, QLabel, QPushButton

    window = harness.start()
    window.apply_theme(theme_name)
    dialog = window.open_api_server_settings()
    harness.wait_until(dialog.isVisible)
    dialog.port.setValue(_free_port())
    harness.act(lambda: dialog.enabled.setChecked(True))
    harness.run(asyncio.shield(dialog.task))
    assert window.api_server.running and dialog.status.text().startswith("Serving ")
    harness.act(lambda: None)  # the refit's layout pass

    def inside(widget) -> QRect:
        return QRect(widget.mapTo(dialog, widget.rect().topLeft()), widget.size())

    for label in (dialog.status, dialog.where):  # wrapped to their full height, not clipped
        assert label.wordWrap()
        assert label.height() >= label.heightForWidth(label.width()) > 0
    found = [w for kind in (QLabel, QCheckBox, QPushButton) for w in dialog.findChildren(kind)]
    shown = [w for w in found if w.isVisible()]
    shown += [dialog.key, dialog.port]
    for a in shown:  # nothing overlaps anything else
        for b in shown:
            if a is not b and not a.isAncestorOf(b) and not b.isAncestorOf(a):
                assert not inside(a).intersects(inside(b)), (a.objectName(), b.objectName())
    for button in (dialog.copy_button, dialog.renew_button, dialog.show_key, dialog.close_button):
        assert button.width() >= button.sizeHint().width()  # not squashed
    metrics = dialog.key.fontMetrics()
    assert dialog.key.width() >= metrics.horizontalAdvance(dialog.key.text())
    assert dialog.key.width() >= dialog.key_width()
    assert dialog.width() >= dialog.sizeHint().width() or dialog.layout().hasHeightForWidth()
    assert dialog.close_button.icon().isNull()  # no dark-on-dark icon
    # the checkbox indicators have a frame drawn from the palette, visible on either theme
    assert "QCheckBox::indicator" in dialog.styleSheet()
    palette = QApplication.instance().palette()
    frame = palette.color(QPalette.ColorRole.PlaceholderText)
    base = palette.color(QPalette.ColorRole.Window)
    assert abs(frame.lightness() - base.lightness()) > 60
    image = dialog.enabled.grab().toImage()
    indicator = dialog.enabled.style().subElementRect(
        dialog.enabled.style().SubElement.SE_CheckBoxIndicator, _option(dialog.enabled), None
    )
    edge = image.pixelColor(indicator.left(), indicator.center().y())
    assert abs(edge.lightness() - base.lightness()) > 40, "checkbox frame blends in"
    dialog.grab().save(f"/tmp/api_server_{theme_name}.png")
    harness.run(window.api_server.stop())


def _option(box):
    from PySide6.QtWidgets import QStyleOptionButton

    option = QStyleOptionButton()
    option.initFrom(box)
    return option
