"""Settings > Remote Server: what it saves (settings.json, the key in the keychain only) and
what its Test button says about a server that is not there."""

from __future__ import annotations

import argparse
import asyncio
import socket
from collections.abc import Iterator

import keyring
import pytest
import qasync
from keyring.backends import fail

from app import paths
from app.launch import load_options_of
from app.remote_config import KEY_ENV
from app.settings import Settings
from app.ui.remote_settings import RemoteSettingsDialog


@pytest.fixture
def no_keychain(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(KEY_ENV, raising=False)
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        yield
    finally:
        keyring.set_keyring(before)


def test_save_switches_the_engine_and_keeps_the_key_off_disk(qapp, no_keychain) -> None:
    dialog = RemoteSettingsDialog()
    dialog.use_remote.setChecked(True)
    dialog.save()
    assert "URL" in dialog.status.text() and Settings.load().engine == "auto"
    dialog.url.setText("http://gpu-box:8000")
    dialog.mode.setCurrentText("tokens")
    dialog.key.setText("sk-remote")
    dialog.save()
    settings = Settings.load()
    assert (settings.engine, settings.remote_url, settings.remote_mode) == (
        "remote",
        "http://gpu-box:8000",
        "tokens",
    )
    assert "sk-remote" not in (paths.config_dir() / "settings.json").read_text()
    options = load_options_of(argparse.Namespace(model=None, ctx=None))
    assert options.remote.api_key == "sk-remote" and options.remote.mode == "tokens"
    reopened = RemoteSettingsDialog()
    assert reopened.key.text() == "sk-remote" and reopened.use_remote.isChecked()


def test_test_button_says_why_a_server_cannot_be_reached(qapp, no_keychain) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        loop = qasync.QEventLoop(qapp, already_running=False)
        asyncio.set_event_loop(loop)
        try:
            dialog = RemoteSettingsDialog()
            dialog.url.setText(url)
            loop.run_until_complete(asyncio.wait_for(loop.create_task(_test(dialog)), 30))
        finally:
            loop.close()
            asyncio.set_event_loop(None)
    assert "nothing is listening" in dialog.status.text()
    assert dialog.test_button.isEnabled()


async def _test(dialog: RemoteSettingsDialog) -> None:
    await dialog.test()
