"""Shared fixtures: every test gets its own STOKE_HOME, so nothing touches the user's data.

Each home starts with this machine's CPU buffer-type verdict (engine/llamacpp/cpu_buffers.py),
so every engine a test starts loads with the same safe buffer types as the app would, without
probing again in each fresh home. It is probed once and kept in build/test-cache/ under the
verdict's own key (this CPU and llama.cpp build), shared by the pytest-xdist workers (a file
lock: the first probes, the others read) and by the window tests' process and later runs.
Tests of the probe itself remove it from their home and probe again.

Qt runs offscreen in every test process, not only the window's: a test outside tests/gui that
makes a QApplication (the packaging icons) would otherwise abort the whole process where no
display exists, as on CI.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from filelock import FileLock

from app.engine.llamacpp import verdict_file
from tests.crash_log import pytest_configure, pytest_runtest_logstart  # noqa: F401 (its hooks)

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

VERDICT_FILE = verdict_file.CACHE_FILE  # the name the app keeps it under
SHARED_VERDICT = Path(__file__).resolve().parents[1] / "build" / "test-cache" / VERDICT_FILE


@pytest.fixture(scope="session")
def cpu_buffer_verdict(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probed verdict file (none where llama.cpp is not importable: the GPU machine runs
    the MLX suite in a process without it)."""
    home = tmp_path_factory.mktemp("verdict-home")
    try:
        from app.engine.llamacpp import cpu_buffers
    except ImportError:
        return home / "cache" / VERDICT_FILE
    previous = os.environ.get("STOKE_HOME")
    os.environ["STOKE_HOME"] = str(home)
    try:
        SHARED_VERDICT.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{SHARED_VERDICT}.lock"):
            cpu_buffers.machine_verdict(cache=SHARED_VERDICT)
        if SHARED_VERDICT.exists():
            (home / "cache").mkdir(parents=True, exist_ok=True)
            shutil.copy2(SHARED_VERDICT, home / "cache" / VERDICT_FILE)
    finally:
        if previous is None:
            os.environ.pop("STOKE_HOME", None)
        else:
            os.environ["STOKE_HOME"] = previous
    return home / "cache" / VERDICT_FILE


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tests' tiny chat model (tests/tiny_model.py): SmolLM2's tokenizer, random weights;
    for the engine's tests and the window's alike, where the reply's words do not matter."""
    from app.models.default import default_model_path
    from tests.tiny_model import write_tiny_chat_model

    folder = tmp_path_factory.mktemp("tiny-model")
    return str(write_tiny_chat_model(default_model_path(), folder / "tiny-chat.gguf"))


@pytest.fixture(autouse=True)
def stoke_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_buffer_verdict: Path) -> Path:
    home = tmp_path / "stoke-home"
    monkeypatch.setenv("STOKE_HOME", str(home))
    return seeded(home, cpu_buffer_verdict)


def seeded(home: Path, verdict: Path) -> Path:
    """`home` holding this machine's CPU buffer verdict (when there is one): an engine in a
    home without it probes the CPU again."""
    if verdict.exists():
        cache = home / "cache"
        cache.mkdir(parents=True, mode=0o700, exist_ok=True)
        shutil.copy2(verdict, cache / VERDICT_FILE)
    return home


@pytest.fixture
def unbudgeted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Speculation without its loss budget: every draft length the odds choose is verified.
    For tests of exactness with drafts that rarely pay (the budget, rightly, would stop them;
    its own test is in tests/unit/test_speculate.py)."""
    from app.engine import speculate

    monkeypatch.setattr(speculate.Budget, "affordable", lambda self, k, *_: k)
