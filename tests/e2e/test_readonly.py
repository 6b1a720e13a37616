"""A read-only data folder (issue 14, item 10): commands that only read work and say the folder
is read-only; commands that would save stop with those words, never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import VERDICT_FILE
from tests.e2e.stoke_proc import stoke, tiny_gguf

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, cpu_buffer_verdict: Path) -> Path:
    """A home that has been used: one conversation, one model, and no scan cache, so listing
    the library has to inspect the model again. Made once for the module: every test mounts
    it read-only, so none can change what the next one finds."""
    folder = tmp_path_factory.mktemp("used-home")
    home = folder / "stoke-home"
    if cpu_buffer_verdict.exists():  # as every test's own home has it (tests/conftest.py)
        (home / "cache").mkdir(parents=True, mode=0o700)
        shutil.copy2(cpu_buffer_verdict, home / "cache" / VERDICT_FILE)
    done = stoke(home, "chat", "--new", "--message", "Hi", "--max-tokens", "2", "--json")
    assert done.returncode == 0, done.stderr
    done = stoke(home, "models", "import", str(tiny_gguf(folder / "tiny.gguf")))
    assert done.returncode == 0, done.stderr
    (home / "cache" / "library-scan.json").unlink()
    return home


def _said_read_only(done, where: Path) -> None:
    out = done.stdout + done.stderr
    assert "Traceback" not in out and "Errno" not in out, out
    assert f"{where / 'data'}" in out and "read-only" in out, out


def test_commands_that_only_read_work(home: Path) -> None:
    listed = stoke(home, "models", "list", "--json", read_only=True)
    assert listed.returncode == 0, listed.stderr
    names = [m["name"] for m in json.loads(listed.stdout)["models"]]
    assert names == ["tiny", "SmolLM2-135M-Instruct.Q4_1"]  # and the bundled one
    _said_read_only(listed, home)

    info = stoke(home, "models", "info", "tiny", read_only=True)
    assert info.returncode == 0 and "tiny" in info.stdout, info.stderr

    doctor = stoke(home, "doctor", "--json", read_only=True)
    assert doctor.returncode == 0, doctor.stderr
    report = json.loads(doctor.stdout)
    assert "error" not in report["paths"], report["paths"]
    assert "read-only" in report["paths"]["read_only"]
    _said_read_only(doctor, home)


def test_chat_list_works(home: Path) -> None:
    listed = stoke(home, "chat", "--list", read_only=True)
    assert listed.returncode == 0, listed.stderr
    assert "Hi" in listed.stdout
    _said_read_only(listed, home)


@pytest.mark.parametrize(
    "argv",
    [
        ["chat", "--new", "--message", "Hi"],
        ["chat"],
        [],  # `stoke`: the terminal chat here, no display
        ["serve", "--port", "0"],
        ["models", "delete", "tiny", "--yes"],
        ["models", "rename", "tiny", "small"],
        ["models", "folders", "--add", "/"],
    ],
    ids=lambda argv: " ".join(argv) or "stoke",
)
def test_commands_that_write_say_the_folder_is_read_only(home: Path, argv: list[str]) -> None:
    done = stoke(home, *argv, read_only=True, stdin="Hi")
    assert done.returncode == 1, done.stdout + done.stderr
    _said_read_only(done, home)
    assert "STOKE_HOME" in done.stderr  # what to do about it


def test_a_json_turn_gets_a_json_error(home: Path) -> None:
    done = stoke(home, "chat", "--new", "--message", "Hi", "--json", read_only=True)
    assert done.returncode == 1
    error = json.loads(done.stdout)
    assert error["kind"] == "ReadOnlyError" and "read-only" in error["error"]
