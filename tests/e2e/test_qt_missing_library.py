"""`stoke` with a display but a broken Qt platform plugin: words and the packages to install,
never Qt's abort. The plugin's libxcb-cursor.so.0 is shadowed by an empty file, which makes
the real xcb plugin fail to load exactly as on a system without libxcb-cursor0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _xcb_libraries_missing() -> list[str]:
    """The system libraries Qt's xcb plugin lacks on this machine (ldd's "not found")."""
    import PySide6

    plugin = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    try:
        listing = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, timeout=30)
    except OSError:
        return []
    return [line.split()[0] for line in listing.stdout.splitlines() if "not found" in line]


# A machine without the plugin's other libraries (a bare CI box) fails on those first: the
# words then name them (the same path), but not the library these tests shadow.
pytestmark = pytest.mark.skipif(
    bool(_xcb_libraries_missing()),
    reason="this machine lacks Qt's xcb libraries itself: " + ", ".join(_xcb_libraries_missing()),
)


def stoke(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    return subprocess.run(
        [sys.executable, "-m", "app"],
        cwd=ROOT,
        env={**clean, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_xcb_library_is_named_with_its_packages(tmp_path: Path) -> None:
    shadow = tmp_path / "lib"
    shadow.mkdir()
    (shadow / "libxcb-cursor.so.0").write_bytes(b"")
    done = stoke(tmp_path, DISPLAY=":77", LD_LIBRARY_PATH=str(shadow))
    assert done.returncode == 1
    words = done.stderr
    assert "libxcb-cursor.so.0" in words
    assert (
        "sudo apt install libxcb-cursor0" in words and "sudo dnf install xcb-util-cursor" in words
    )
    assert "`stoke chat`" in words
    assert "qt.qpa.plugin" not in words and "Traceback" not in words
    assert "Available platform plugins" not in words


def test_a_display_that_does_not_answer_is_said(tmp_path: Path) -> None:
    done = stoke(tmp_path, DISPLAY=":77")
    assert done.returncode == 1
    assert "the display :77 does not answer" in done.stderr and "`stoke chat`" in done.stderr
    assert "qt.qpa" not in done.stderr and "Traceback" not in done.stderr
