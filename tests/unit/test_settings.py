"""settings.json as people leave it: not an object, wrong types, damaged twice. Each bad field
falls back alone, the file is named, every damaged copy is kept, and the warning comes once;
`stoke`, `stoke chat` and `stoke serve` start on such a file instead of a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app import paths
from app.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def settings_file(text: str) -> Path:
    path = paths.config_dir() / "settings.json"
    path.write_text(text, "utf-8")
    return path


@pytest.mark.parametrize("text", ["null", "[1, 2, 3]", '"a string"', "42"])
def test_json_that_is_not_an_object_gives_defaults_and_is_kept(text: str) -> None:
    path = settings_file(text)
    settings, problem = Settings.load_checked()
    assert settings == Settings()
    assert problem is not None and str(path) in problem and "not an object" in problem
    assert (path.parent / "settings.json.damaged").read_text("utf-8") == text
    assert Settings.load_checked() == (Settings(), None)  # said once


def test_a_wrong_field_falls_back_alone_and_is_named() -> None:
    path = settings_file(
        json.dumps(
            {"n_ctx": "big", "resident_conversations": 0, "n_gpu_layers": 12, "serve_port": True}
        )
    )
    settings, problem = Settings.load_checked()
    assert settings.n_ctx == Settings().n_ctx
    assert settings.resident_conversations == Settings().resident_conversations
    assert settings.serve_port == Settings().serve_port  # true is not a port
    assert settings.n_gpu_layers == 12  # the good field is kept
    assert problem is not None and str(path) in problem
    for name in ("n_ctx", "resident_conversations", "serve_port"):
        assert name in problem
    assert "n_gpu_layers" not in problem
    # repaired in place: the good field stays, the bad ones are gone, the original is kept
    assert json.loads(path.read_text("utf-8")) == {"n_gpu_layers": 12}
    kept = json.loads((path.parent / "settings.json.damaged").read_text("utf-8"))
    assert kept["n_ctx"] == "big"
    assert Settings.load_checked() == (settings, None)


@pytest.mark.parametrize("n_ctx", [1, 255])
def test_a_context_too_small_to_work_is_refused_in_words(n_ctx: int) -> None:
    """n_ctx 1 passed this check and then aborted the engine (issue 33): llama.cpp's batches
    are capped at the context asked for, and a conversation needs more than a few tokens."""
    settings_file(json.dumps({"n_ctx": n_ctx}))
    settings, problem = Settings.load_checked()
    assert settings.n_ctx == Settings().n_ctx
    assert problem is not None
    assert f"n_ctx = {n_ctx} is not a whole number of tokens from 256 (the smallest" in problem
    settings_file(json.dumps({"n_ctx": 256}))
    assert Settings.load_checked() == (Settings(n_ctx=256), None)


def test_every_damaged_copy_is_kept() -> None:
    folder = paths.config_dir()
    for text in ("{first", "{second", "null"):
        settings_file(text)
        assert Settings.load_checked()[1] is not None
    assert (folder / "settings.json.damaged").read_text("utf-8") == "{first"
    assert (folder / "settings.json.damaged-2").read_text("utf-8") == "{second"
    assert (folder / "settings.json.damaged-3").read_text("utf-8") == "null"


def test_saved_settings_are_private() -> None:
    Settings(n_ctx=4096).save()
    path = paths.config_dir() / "settings.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert Settings.load() == Settings(n_ctx=4096)


# --- the commands, as processes ---------------------------------------------------------------


def _env(home: Path) -> dict[str, str]:
    """No display, so `stoke` alone is the terminal chat."""
    hidden = ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")
    return {k: v for k, v in os.environ.items() if k not in hidden} | {"STOKE_HOME": str(home)}


@pytest.mark.parametrize(
    "argv", [["chat", "--new", "--max-tokens", "2"], []], ids=["stoke chat", "stoke"]
)
def test_chat_starts_on_a_settings_file_that_is_not_an_object(
    stoke_home: Path, argv: list[str]
) -> None:
    path = settings_file("[1, 2, 3]")
    done = subprocess.run(
        [sys.executable, "-m", "app", *argv],
        cwd=REPO,
        env=_env(stoke_home),
        input="Hi",  # a message on stdin: one turn, then exit
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # the reply
    assert done.stderr.count(str(path)) == 1, done.stderr  # said once


def test_serve_starts_on_a_settings_file_with_wrong_types(stoke_home: Path) -> None:
    path = settings_file('{"n_ctx": "big", "resident_conversations": 0}')
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", "0", "--api-key", "sk-test"],
        cwd=REPO,
        env=_env(stoke_home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()  # not left running into the next tests
            process.communicate()
            pytest.fail("stoke serve did not stop within 120 s of Ctrl+C")
    assert "Serving" in line, line + err
    assert "Traceback" not in err, err
    assert err.count(str(path)) == 1, err
    assert "n_ctx" in err and "resident_conversations" in err, err
