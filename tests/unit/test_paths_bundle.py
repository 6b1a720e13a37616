"""paths.bundle_dir: where a frozen Stoke says it runs from (the installed .deb is checked for
real by tests/package/test_package.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app import paths


def test_a_python_installation_is_no_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(sys, "frozen", raising=False)
    assert paths.bundle_dir() is None


def test_the_launcher_symlink_leads_to_the_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/usr/bin/stoke is a link into /opt/stoke: the bundle is where the executable lies."""
    executable = tmp_path / "opt" / "stoke" / "stoke"
    executable.parent.mkdir(parents=True)
    executable.touch()
    launcher = tmp_path / "usr" / "bin" / "stoke"
    launcher.parent.mkdir(parents=True)
    launcher.symlink_to(Path("../../opt/stoke/stoke"))
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(launcher))
    assert paths.bundle_dir() == executable.parent.resolve()


def test_a_mac_app_is_named_by_its_dot_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    executable = tmp_path / "Stoke.app" / "Contents" / "MacOS" / "stoke"
    executable.parent.mkdir(parents=True)
    executable.touch()
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(executable))
    assert paths.bundle_dir() == (tmp_path / "Stoke.app").resolve()
