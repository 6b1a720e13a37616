"""Cold start to a drawn window, the frozen bundle beside `make run`, in one process.

Each run starts a fresh process with a fresh STOKE_HOME (a first start: no settings, no KV,
an empty store) and times from just before the process is spawned to the end of the main
window's first paint. Both sides run the same driver: it installs an event filter on the
QApplication, then calls `stoke`'s own main() (the GUI, as with no arguments); the frozen
side runs it through the bundle's `stoke -c` (packaging/stoke_entry.py), the source side
through .venv's Python, which is what `make run` starts. Runs alternate, so load on the
machine falls on both. Qt draws offscreen (QT_QPA_PLATFORM=offscreen, as on CI). With
--drop-caches (root, Linux) the page cache is emptied before every run, so each side reads
its files from disk as on the first start after a boot; without it the files are cached.

    python packaging/startup_bench.py BUNDLE_DIR [--runs 5] [--drop-caches] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRIVER = """
import os, sys, time
from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication

started = float(os.environ["STOKE_BENCH_T0"])
app = QApplication(sys.argv[:1])


class FirstPaint(QObject):
    def eventFilter(self, obj, event):
        if (
            event.type() == QEvent.Type.Paint
            and obj.isWidgetType()
            and type(obj.window()).__name__ == "MainWindow"
        ):
            app.removeEventFilter(self)
            QTimer.singleShot(0, self.report)  # runs once this paint is done
        return False

    def report(self):
        print("first-paint", time.time() - started, flush=True)
        os._exit(0)


first = FirstPaint()
app.installEventFilter(first)
from app.__main__ import main

main([])
"""


def first_paint(command: list[str], timeout: float = 300) -> float:
    """Seconds from spawning `command` (which runs DRIVER) to its first drawn window."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "STOKE_HOME": home, "QT_QPA_PLATFORM": "offscreen"}
        env["STOKE_BENCH_T0"] = repr(time.time())
        process = subprocess.Popen(
            command,
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its engine process goes with it
        )
        try:
            out, _ = process.communicate(timeout=timeout)
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    for line in out.splitlines():
        if line.startswith("first-paint "):
            return float(line.split()[1])
    raise RuntimeError(f"{command[0]} drew no window (exit {process.returncode})")


def drop_caches() -> None:
    """Empty the kernel's page cache (needs root): the next start reads from disk."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="the one-folder bundle (holds `stoke`)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--drop-caches", action="store_true", help="start from disk (root)")
    args = parser.parse_args()
    sides = {
        "frozen bundle": [str(args.bundle / "stoke"), "-c", DRIVER],
        "make run (.venv)": [str(ROOT / ".venv" / "bin" / "python"), "-c", DRIVER],
    }
    times: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(args.runs):
        for side, command in sides.items():
            if args.drop_caches:
                drop_caches()
            times[side].append(round(first_paint(command), 3))
    print(f"| start to first drawn window | median of {args.runs} | runs |")
    print("|---|---:|---|")
    for side, seconds in times.items():
        runs = ", ".join(f"{s:.2f}" for s in seconds)
        print(f"| {side} | {statistics.median(seconds):.2f} s | {runs} |")
    if args.json:
        report = {
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "platform": "offscreen",
            "page_cache": "dropped before each run" if args.drop_caches else "warm",
            "runs": times,
            "median_s": {side: statistics.median(s) for side, s in times.items()},
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
