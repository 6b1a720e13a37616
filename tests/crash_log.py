"""A crash log for test runs: where pytest dies by a signal (a native fault in llama.cpp, MLX or
Qt), the test that was running and the crashing thread's frames, printed last.

With STOKE_TEST_CRASH_LOG set, faulthandler writes its tracebacks to that file, after a line
naming the running test, instead of to stderr; each pytest-xdist worker to its own
(`FILE.gw0`, ...). `make test` runs `python -m tests.crash_log FILE` when pytest fails, so a
log's tail (all a CI page may show) ends with the crash's own frames, not pytest's outer ones.
tests/conftest.py registers the hooks.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path
from typing import IO

import pytest

FRAMES = 20
_log: IO[str] | None = None


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """After pytest's own faulthandler setup, so that the log replaces stderr as its file."""
    global _log
    path = os.environ.get("STOKE_TEST_CRASH_LOG")
    if not path:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    path = f"{path}.{worker}" if worker else path
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    # Open for the whole run; appending puts a dump after the running test's line.
    _log = open(path, "a", encoding="utf-8")  # noqa: SIM115
    _log.truncate(0)
    faulthandler.enable(file=_log, all_threads=True)


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _log is not None:
        _log.truncate(0)
        _log.write(f"test running: {nodeid}\n")
        _log.flush()


def report(text: str) -> list[str]:
    """The lines worth printing from a crash log's `text`: the test, the fatal error and the
    crashing thread's most recent frames short of pytest's own, the test again last; none
    when nothing crashed."""
    lines = text.splitlines()
    fatal = [line for line in lines if line.startswith("Fatal Python error")]
    if not fatal:
        return []
    out = [line for line in lines[:1] if line.startswith("test running:")] + fatal
    start = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), None)
    if start is not None:
        out.append(lines[start])
        frames = [line for line in _thread_block(lines[start + 1 :]) if not _pytests(line)]
        out += frames[:FRAMES]
    return out + out[:1]


def _thread_block(lines: list[str]) -> list[str]:
    end = next((i for i, line in enumerate(lines) if not line.startswith("  ")), len(lines))
    return lines[:end]


def _pytests(frame: str) -> bool:
    """pytest's and pluggy's own frames, which every test's stack ends in."""
    return any(part in frame for part in ("/_pytest/", "/pluggy/", "/pytest/__main__", "<frozen"))


def main(argv: list[str]) -> int:
    path = Path(argv[1])
    for log in [path, *sorted(path.parent.glob(f"{path.name}.gw*"))]:
        if log.exists():
            for line in report(log.read_text(encoding="utf-8", errors="replace")):
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
