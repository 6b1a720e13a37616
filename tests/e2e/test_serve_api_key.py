"""The API key stays out of `ps`: `stoke serve --api-key-file PATH` (and STOKE_API_KEY) give it
without putting it on the command line, and a key given with `--api-key` draws a warning."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "STOKE_API_KEY"}
    return {**env, "STOKE_HOME": str(home), **extra}


def _show_key(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", "serve", *args, "--show-key"],
        cwd=REPO,
        env=_env(home, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_key_on_the_command_line_draws_a_warning(stoke_home: Path) -> None:
    shown = _show_key(stoke_home, "--api-key", "sk-in-argv")
    assert shown.returncode == 0 and shown.stdout.strip() == "sk-in-argv"
    assert "--api-key-file" in shown.stderr and "ps" in shown.stderr
    quiet = _show_key(stoke_home, STOKE_API_KEY="sk-in-env")
    assert quiet.stdout.strip() == "sk-in-env" and "Warning" not in quiet.stderr


def test_a_key_file_is_read_and_checked(stoke_home: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n", "utf-8")
    key_file.chmod(0o600)
    shown = _show_key(stoke_home, "--api-key-file", str(key_file))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "sk-from-file" and "Warning" not in shown.stderr

    key_file.chmod(0o644)
    loose = _show_key(stoke_home, "--api-key-file", str(key_file))
    assert loose.stdout.strip() == "sk-from-file"
    assert "other users" in loose.stderr and "chmod 600" in loose.stderr

    for bad, words in ((tmp_path / "missing", "cannot read"), (tmp_path, "cannot read")):
        failed = _show_key(stoke_home, "--api-key-file", str(bad))
        assert failed.returncode == 1 and words in failed.stderr
        assert "Traceback" not in failed.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n", "utf-8")
    failed = _show_key(stoke_home, "--api-key-file", str(empty))
    assert failed.returncode == 1 and "empty" in failed.stderr


def test_stoke_serve_takes_its_key_from_the_file(stoke_home: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-served-from-file", "utf-8")
    key_file.chmod(0o600)
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", "0", "--api-key-file", str(key_file)],
        cwd=REPO,
        env=_env(stoke_home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        found = re.search(r"Serving (\S+) at (http://\S+/v1)", process.stdout.readline())
        assert found
        assert "--api-key-file" in process.stdout.readline()  # where the key came from
        client = openai.OpenAI(base_url=found[2], api_key="sk-served-from-file", max_retries=0)
        assert [m.id for m in client.models.list().data] == [found[1]]
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert "Warning" not in err and "sk-served-from-file" not in err
