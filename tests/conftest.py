"""Shared fixtures: every test gets its own STOKE_HOME, so nothing touches the user's data.

Each home starts with this machine's CPU buffer-type verdict (engine/llamacpp/cpu_buffers.py),
probed once per test run, so every engine a test starts loads with the same safe buffer types
as the app would, without probing again in each fresh home. Tests of the probe itself remove it.

Qt runs offscreen in every test process, not only the window's: a test outside tests/gui that
makes a QApplication (the packaging icons) would otherwise abort the whole process where no
display exists, as on CI.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.crash_log import pytest_configure, pytest_runtest_logstart  # noqa: F401 (its hooks)

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

VERDICT_FILE = "cpu-buffers.json"


@pytest.fixture(scope="session")
def cpu_buffer_verdict(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probed verdict file, made once in a home of its own (none where llama.cpp is not
    importable: the GPU machine runs the MLX suite in a process without it)."""
    home = tmp_path_factory.mktemp("verdict-home")
    try:
        from app.engine.llamacpp import cpu_buffers
    except ImportError:
        return home / "cache" / VERDICT_FILE
    previous = os.environ.get("STOKE_HOME")
    os.environ["STOKE_HOME"] = str(home)
    try:
        cpu_buffers.machine_verdict(cache=home / "cache" / VERDICT_FILE)
    finally:
        if previous is None:
            os.environ.pop("STOKE_HOME", None)
        else:
            os.environ["STOKE_HOME"] = previous
    return home / "cache" / VERDICT_FILE


@pytest.fixture(autouse=True)
def stoke_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_buffer_verdict: Path) -> Path:
    home = tmp_path / "stoke-home"
    monkeypatch.setenv("STOKE_HOME", str(home))
    if cpu_buffer_verdict.exists():
        cache = home / "cache"
        cache.mkdir(parents=True, mode=0o700)
        shutil.copy2(cpu_buffer_verdict, cache / VERDICT_FILE)
    return home


@pytest.fixture
def unbudgeted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Speculation without its loss budget: every draft length the odds choose is verified.
    For tests of exactness with drafts that rarely pay (the budget, rightly, would stop them;
    its own test is in tests/unit/test_speculate.py)."""
    from app.engine import speculate

    monkeypatch.setattr(speculate.Budget, "affordable", lambda self, k, *_: k)
