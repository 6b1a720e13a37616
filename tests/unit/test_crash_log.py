"""tests/crash_log.py: a pytest run that dies by a signal names its test and frames last."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import crash_log

ROOT = Path(__file__).resolve().parents[2]

CRASHING = """
import os


def test_fine():
    pass


def helper_that_aborts():
    os.abort()


def test_that_crashes():
    helper_that_aborts()
"""


def run_pytest(tmp_path: Path, log: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_child.py").write_text(CRASHING)
    env = dict(os.environ, STOKE_TEST_CRASH_LOG=str(log), PYTHONPATH=str(ROOT))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.crash_log",
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_child.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_crashing_test_is_named_with_its_frames_last(tmp_path: Path) -> None:
    log = tmp_path / "build" / "crash.log"
    child = run_pytest(tmp_path, log)
    assert child.returncode != 0
    printed = subprocess.run(
        [sys.executable, "-m", "tests.crash_log", str(log)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert printed[0] == printed[-1] == "test running: test_child.py::test_that_crashes"
    assert "Fatal Python error: Aborted" in printed
    frames = [line for line in printed if line.startswith("  File ")]
    assert "in helper_that_aborts" in frames[0]
    assert "in test_that_crashes" in frames[1]
    assert not any("_pytest" in frame for frame in frames)


def test_a_run_without_a_crash_prints_nothing() -> None:
    assert crash_log.report("test running: tests/unit/test_x.py::test_y\n") == []
    assert crash_log.report("") == []
