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
    assert harness.run(loop.run_in_executor(None, ask, key)) > 0

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
