"""Before Qt starts: can the window's platform plugin load here? Said in words if not.

Qt aborts the whole process when its platform plugin cannot load (on X11 most often for a
missing libxcb-cursor0 since Qt 6.5), printing its own plugin diagnostics. So `stoke`
first creates a QGuiApplication in a child `python -c` with the same environment and
Qt's plugin debugging on; if that child fails, the library the plugin could not load is
read from its output and named with the Debian/Ubuntu and Fedora packages that hold it.
Nothing here imports Qt: the parent never risks the abort.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

PROBE_TIMEOUT_S = 30.0
_PROBE = "import sys\nfrom PySide6.QtGui import QGuiApplication\nQGuiApplication(sys.argv[:1])\n"
_CHECKED_PLATFORMS = ("", "xcb", "wayland")  # "" is Qt's own choice on a desktop
_FAILED_LIBRARY = re.compile(r"libq\w+\.so: (?:\S*/)?(lib[\w.+-]+?\.so[\d.]*): ")
TERMINAL_CHAT = "Meanwhile `stoke chat` chats with the same model in this terminal."

# library -> (Debian/Ubuntu package, Fedora package)
PACKAGES: dict[str, tuple[str, str]] = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
    "libwayland-client.so.0": ("libwayland-client0", "libwayland-client"),
    "libwayland-cursor.so.0": ("libwayland-cursor0", "libwayland-cursor"),
}


def _needs_check() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return os.environ.get("QT_QPA_PLATFORM", "").split(":")[0] in _CHECKED_PLATFORMS


def window_problem() -> str | None:
    """Why a window cannot open here, in words with the fix; None when it can (or when the
    check cannot tell, so the app tries as before)."""
    if not _needs_check():
        return None
    env = {**os.environ, "QT_DEBUG_PLUGINS": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode == 0:
        return None
    return explain(done.stderr)


def explain(output: str) -> str:
    """The words for a failed start, from Qt's plugin diagnostics."""
    found = _FAILED_LIBRARY.search(output)
    if found:
        library = found.group(1)
        debian, fedora = PACKAGES.get(library, ("", ""))
        if debian:
            how = (
                f"Install it with `sudo apt install {debian}` (Debian, Ubuntu) or "
                f"`sudo dnf install {fedora}` (Fedora), then start stoke again."
            )
        else:
            how = f"Install the package that provides {library}, then start stoke again."
        return (
            f"the window cannot open: Qt's display plugin needs the system library "
            f"{library}, which is missing or damaged. {how} {TERMINAL_CHAT}"
        )
    if "could not connect to display" in output:
        display = os.environ.get("DISPLAY", "")
        return (
            f"the window cannot open: the display {display} does not answer (is the X "
            f"server running, and may this user use it?). {TERMINAL_CHAT}"
        )
    return (
        "the window cannot open: Qt could not start its display plugin here. "
        f"`QT_DEBUG_PLUGINS=1 stoke` shows Qt's own details. {TERMINAL_CHAT}"
    )
