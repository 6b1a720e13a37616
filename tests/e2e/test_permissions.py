"""Stoke's folders are private (issue 14, item 13): what a real `stoke` run creates (database,
engine log, KV snapshots, library and hash caches) is 0600 in 0700 folders, and what an older
version left wider is narrowed at the next start, links to the user's own files excepted."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.e2e.stoke_proc import stoke, tiny_gguf

pytestmark = pytest.mark.e2e


def _modes(home: Path) -> dict[str, int]:
    """Permission bits of everything under `home` (symlinks skipped), by relative path.
    `home` itself is left out: STOKE_HOME is the user's folder, Stoke's are inside it."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(home):
        for name in (*dirnames, *filenames):
            path = Path(dirpath, name)
            if not path.is_symlink():
                found[str(path.relative_to(home))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def _wide(modes: dict[str, int], home: Path) -> dict[str, str]:
    return {
        name: oct(mode)
        for name, mode in modes.items()
        if mode != (0o700 if (home / name).is_dir() else 0o600)
    }


def _use(home: Path, model: Path) -> None:
    """One turn (database, log, a KV snapshot at exit) and one import (library files)."""
    done = stoke(home, "chat", "--new", "--message", "Hi", "--max-tokens", "2", "--json")
    assert done.returncode == 0, done.stderr
    done = stoke(home, "models", "import", str(model))
    assert done.returncode == 0, done.stderr


def test_what_a_run_creates_is_private(stoke_home: Path, tmp_path: Path) -> None:
    _use(stoke_home, tiny_gguf(tmp_path / "tiny.gguf"))
    modes = _modes(stoke_home)
    for made in ("data", "cache", "config", "data/conversations.db", "cache/engine.log"):
        assert made in modes
    assert any(name.endswith(".kv") for name in modes)
    assert _wide(modes, stoke_home) == {}


def test_wider_files_from_before_are_narrowed_at_start(stoke_home: Path, tmp_path: Path) -> None:
    _use(stoke_home, tiny_gguf(tmp_path / "tiny.gguf"))
    outside = tiny_gguf(tmp_path / "linked.gguf")
    outside.chmod(0o644)
    (stoke_home / "data" / "models" / "linked.gguf").symlink_to(outside)
    (stoke_home / "config" / "settings.json").write_text("{}")
    for path in [stoke_home, *stoke_home.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)  # as an older version left them

    done = stoke(stoke_home, "models", "list")
    assert done.returncode == 0, done.stderr
    assert _wide(_modes(stoke_home), stoke_home) == {}
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644  # the user's own file, via a link
