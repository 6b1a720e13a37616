"""Remote engine configuration: settings and flags become RemoteOptions, the key comes from
the environment or the keychain (never settings.json), and `stoke doctor` says whether the
server answers."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Iterator

import keyring
import pytest
from keyring.backends import fail

from app import doctor, paths
from app.cli import chat
from app.engine.protocol import EngineError
from app.launch import load_options_of
from app.remote_config import KEY_ENV, api_key, remote_options, save_api_key
from app.settings import Settings


def chat_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    chat.add_model_arguments(parser)
    return parser.parse_args(list(argv))


def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_flags_make_remote_load_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "from-env")
    options = load_options_of(
        chat_args("--remote-url", "http://gpu-box:8000/v1", "--remote-model", "m", "--ctx", "1000")
    )
    assert options.remote.url == "http://gpu-box:8000/v1"
    assert (options.remote.model, options.remote.mode, options.remote.api_key) == (
        "m",
        "auto",
        "from-env",
    )
    assert options.model_path == "" and options.n_ctx == 1000
    assert "from-env" not in repr(options)  # keys stay out of logs


def test_settings_choose_the_remote_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    settings = Settings(engine="remote", remote_url="http://a:1", remote_mode="chat")
    settings.save()
    options = load_options_of(chat_args())
    assert (options.remote.url, options.remote.mode) == ("http://a:1", "chat")
    assert load_options_of(chat_args("--engine", "llama.cpp")).remote is None


@pytest.fixture
def no_keychain() -> Iterator[None]:
    """The headless case (keyring's failing backend): nothing reaches a real keychain."""
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        yield
    finally:
        keyring.set_keyring(before)


def test_the_key_lives_in_the_keychain_or_memory_never_on_disk(
    monkeypatch: pytest.MonkeyPatch, no_keychain: None
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    save_api_key("http://a:1/", "sk-secret")
    assert api_key("http://a:1") == "sk-secret"
    assert api_key("http://b:1") is None  # one key per server
    Settings(remote_url="http://a:1").save()
    assert "sk-secret" not in (paths.config_dir() / "settings.json").read_text()
    monkeypatch.setenv(KEY_ENV, "env-wins")
    assert api_key("http://a:1") == "env-wins"
    monkeypatch.delenv(KEY_ENV)
    save_api_key("http://a:1", "")
    assert api_key("http://a:1") is None


def test_no_url_is_said_in_words() -> None:
    with pytest.raises(EngineError, match="needs a server URL"):
        remote_options(Settings(engine="remote"))


def test_doctor_reports_reachability() -> None:
    assert doctor.check_remote() == {"configured": False}
    Settings(remote_url=dead_url()).save()
    check = doctor.check_remote()
    assert check["configured"] and not check["ok"]
    assert "nothing is listening" in doctor._remote_line(check)
