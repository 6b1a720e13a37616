"""KV snapshot faults through the real `stoke chat` (issue 14): a folder where the snapshot file
of a conversation belongs is a bad snapshot like any other, so the next turn prefills instead
of failing, and a good snapshot is written in its place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def _chat(home: Path, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "app", "chat", "--max-tokens", "4", "--json", *args],
        cwd=REPO,
        env={**os.environ, "STOKE_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_folder_in_place_of_a_snapshot_does_not_fail_the_turn(stoke_home: Path) -> None:
    first = _chat(stoke_home, "--new", "--message", "Hi")
    (file,) = (stoke_home / "cache" / "kv").rglob("*.kv")  # written when the engine stopped
    file.unlink()
    file.mkdir()
    (file / "stray").write_bytes(b"x")

    second = _chat(stoke_home, "--conversation", first["conversation_id"], "--message", "More?")
    assert second["status"] in ("complete", "length")
    assert second["stats"]["restored_tokens"] == 0  # nothing trusted from the folder
    assert file.is_file()  # the good snapshot of this turn took its place
