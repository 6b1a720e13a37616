"""What the engine host learned about crashing on this machine, and the settings that avoid it.

A runtime can crash on hardware its authors never tried (llama.cpp's AMX matmul on some Intel
CPUs, llama.cpp #20824): the engine process dies by a signal in the first decode after a load.
The host then retries once with `conservative` settings and records the model here, so the next
start loads it that way at once instead of crashing first. A record is keyed by this CPU (model
name and feature flags), the engine and the model file (path, size, modification time): another
CPU, engine or file starts afresh. The file is a cache: losing it costs one more crash, no data.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

from app import paths
from app.engine.protocol import LoadOptions
from app.stored import Entries, Fields, Stored, Value, text

CHANGES = "no extra CPU buffer types, no flash attention"  # what `conservative` turns off
RECORDS_FILE = "engine-safe-mode.json"


def cpu_identity() -> dict[str, str]:
    """The CPU as far as a runtime's code paths can tell: model name, architecture, flags."""
    name, flags = platform.processor() or "unknown", ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and name in ("unknown", "", platform.machine()):
                name = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    digest = hashlib.sha256(flags.encode()).hexdigest()[:16]
    return {"model": name, "machine": platform.machine(), "flags_sha256": digest}


def conservative(options: LoadOptions) -> LoadOptions:
    """The same load without llama.cpp's extra CPU buffer types or flash attention."""
    return replace(options, cpu_buffers="none", flash_attn=False)


def is_conservative(options: LoadOptions) -> bool:
    return options.cpu_buffers == "none" and not options.flash_attn


def _model_key(engine: str, model_path: str) -> str | None:
    try:
        stat = Path(model_path).stat()
    except OSError:
        return None
    cpu = cpu_identity()
    parts = (
        cpu["model"],
        cpu["machine"],
        cpu["flags_sha256"],
        engine,
        str(Path(model_path).resolve()),
        str(stat.st_size),
        str(stat.st_mtime_ns),
    )
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


# The records (engine-safe-mode.json, a cache): a damaged record or field is dropped.
RECORDS = Stored(
    Entries(
        Fields(
            {
                k: Value(text, "words")
                for k in ("model", "engine", "reason", "changes", "recorded_at")
            }
        )
    ),
    keep=False,
)


class SafeModeRecords:
    """The models that crashed here and now load conservatively, in one JSON file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or paths.cache_dir() / RECORDS_FILE

    def _read(self) -> dict[str, dict]:
        """Missing or damaged: nothing recorded (a cache, not data; app/stored.py checks it)."""
        return RECORDS.read(self.path).value

    def lookup(self, engine: str, model_path: str) -> dict | None:
        """The record of this model on this machine and engine, if it crashed here before."""
        key = _model_key(engine, model_path)
        record = self._read().get(key) if key else None
        return record if isinstance(record, dict) else None

    def record(self, engine: str, model_path: str, reason: str) -> None:
        key = _model_key(engine, model_path)
        if key is None:
            return
        records = self._read()
        records[key] = {
            "model": Path(model_path).name,
            "engine": engine,
            "reason": reason,
            "changes": CHANGES,
            "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        with contextlib.suppress(OSError):  # a cache: failing to write costs one more crash
            paths.write_private(self.path, json.dumps(records, indent=2))
