"""Shared fixtures: every test gets its own STOKE_HOME, so nothing touches the user's data."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def stoke_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "stoke-home"
    monkeypatch.setenv("STOKE_HOME", str(home))
    return home
