"""Where this machine's CPU verdict is kept (cpu_buffers.py decides it), in a module that does
not load llama.cpp: a benchmark gives its own STOKE_HOME a copy (`carry`), so that the engines
it starts do not probe the CPU again, seconds of probe children before its first timed turn.
The verdict is keyed by the CPU and the llama.cpp build, so a copy is as good as the original."""

from __future__ import annotations

import shutil
from pathlib import Path

from app import paths

CACHE_FILE = "cpu-buffers.json"


def carry(home: Path) -> Path:
    """`home`, a fresh STOKE_HOME, holding the current home's verdicts (where it has any)."""
    found = paths.cache_dir(create=False) / CACHE_FILE
    if found.is_file():
        cache = home / "cache"
        cache.mkdir(parents=True, mode=0o700, exist_ok=True)
        shutil.copy2(found, cache / CACHE_FILE)
    return home
