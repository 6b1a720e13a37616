"""The API key stays out of `ps`: `stoke serve --api-key-file PATH` (and STOKE_API_KEY) give it
without putting it on the command line, and a key given with `--api-key` draws a warning.

Where the key comes from is checked with `--show-key` through `stoke`'s own entry point in
this process (a new interpreter's imports cost seconds each); one real `stoke serve` process
takes its key from a file."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from tests.e2e.conftest import StokeHere

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "STOKE_API_KEY"}
    return {**env, "STOKE_HOME": str(home), **extra}


@pytest.fixture
def show_key(stoke_here: StokeHere, monkeypatch: pytest.MonkeyPatch) -> StokeHere:
    """`stoke serve ARGS --show-key`, STOKE_API_KEY unset unless given."""
    monkeypatch.delenv("STOKE_API_KEY", raising=False)
    return lambda *args, **env: stoke_here("serve", *args, "--show-key", **env)


def test_a_key_on_the_command_line_draws_a_warning(show_key: StokeHere) -> None:
    code, out, err = show_key("--api-key", "sk-in-argv")
    assert code == 0 and out.strip() == "sk-in-argv"
    assert "--api-key-file" in err and "ps" in err
    code, out, err = show_key(STOKE_API_KEY="sk-in-env")
    assert out.strip() == "sk-in-env" and "Warning" not in err


def test_a_key_file_is_read_and_checked(show_key: StokeHere, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n", "utf-8")
    key_file.chmod(0o600)
    code, out, err = show_key("--api-key-file", str(key_file))
    assert code == 0, err
    assert out.strip() == "sk-from-file" and "Warning" not in err

    key_file.chmod(0o644)
    code, out, err = show_key("--api-key-file", str(key_file))
    assert out.strip() == "sk-from-file"
    assert "other users" in err and "chmod 600" in err

    for bad, words in ((tmp_path / "missing", "cannot read"), (tmp_path, "cannot read")):
        code, out, err = show_key("--api-key-file", str(bad))
        assert code == 1 and words in err
        assert "Traceback" not in err
    empty = tmp_path / "empty"
    empty.write_text("\n", "utf-8")
    code, out, err = show_key("--api-key-file", str(empty))
    assert code == 1 and "empty" in err


def test_stoke_serve_takes_its_key_from_the_file(
    stoke_home: Path, tmp_path: Path, tiny_model: str
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-served-from-file", "utf-8")
    key_file.chmod(0o600)
    command = ["serve", "--model", tiny_model, "--port", "0", "--api-key-file", str(key_file)]
    process = subprocess.Popen(
        [sys.executable, "-m", "app", *command],
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
        assert client.models.list().data[0].id == found[1]  # the default, then the library
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert "Warning" not in err and "sk-served-from-file" not in err
