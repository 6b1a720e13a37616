"""Every test process runs where no display exists (CI): Qt is offscreen outside tests/gui too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_qapp_test_outside_the_window_suite_runs_without_a_display() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "DISPLAY")}
    env.update(PYTHONPATH=str(ROOT), WAYLAND_DISPLAY="")
    test = "tests/unit/test_packaging.py::test_hicolor_has_every_size_drawn_from_the_app_icon"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout
