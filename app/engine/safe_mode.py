"""What the engine host learned about crashing on this machine, and the settings that avoid it.

A runtime can crash on hardware its authors never tried (llama.cpp's AMX matmul on some Intel
CPUs, llama.cpp #20824): the engine process dies by a signal in the first decode after a load.
The host then retries once with `conservative` settings and records the model here, so the next
start loads it that way at once instead of crashing first.

A record blames the model only under the load settings that crashed. It is kept per CPU (model
name and feature flags), engine and model file (path, size, modification time), and holds the
`crash_settings` of the load (every LoadOptions field that changes what the runtime runs): a
load of the same model with other settings finds it expired, and removes it, so fixing a
setting ends safe mode without anyone deleting a file. `clear` removes records on demand (the
window's settings panel, `stoke doctor --reset-safe-mode`). The file is a cache: losing it
costs one more crash, no data.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import platform
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from app import paths
from app.engine.protocol import LoadOptions
from app.stored import Entries, Fields, Stored, Value, text

CHANGES = "no extra CPU buffer types, no flash attention"  # what `conservative` turns off
RECORDS_FILE = "engine-safe-mode.json"
# LoadOptions fields that do not change what the runtime runs: the model (its file is in the
# key), where snapshots go and how big, what to do after a crash, and the engine (in the key).
_NOT_RUN = frozenset(
    {
        "model_path",
        "chat_template",
        "snapshots",
        "kv_ram_budget",
        "kv_disk_budget",
        "remote",
        "rpc_on_drop",
        "engine",
    }
)
_DEFAULTS = LoadOptions(model_path="")


@functools.cache
def cpu_identity() -> dict[str, str]:
    """The CPU as far as a runtime's code paths can tell: model name, architecture, flags
    (read once per process: the CPU does not change under it)."""
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


def crash_settings(options: LoadOptions) -> dict[str, Any]:
    """The load settings a crash may depend on, as JSON values (tuples as lists)."""
    return {
        f.name: json.loads(json.dumps(getattr(options, f.name)))
        for f in fields(LoadOptions)
        if f.name not in _NOT_RUN
    }


def words(record: dict[str, Any]) -> str:
    """One record in one sentence: the model, what safe mode turns off, and the crash it
    answers (when, how, under which settings that differ from the defaults)."""
    defaults = crash_settings(_DEFAULTS)
    settings = record.get("settings") if isinstance(record.get("settings"), dict) else {}
    changed = [f"{k}={v}" for k, v in settings.items() if defaults.get(k, v) != v]
    under = f"with {', '.join(changed)}" if changed else "with the default load settings"
    return (
        f"{record.get('model', 'A model')} loads on {record.get('engine', 'its engine')} with "
        f"conservative settings ({record.get('changes', CHANGES)}): it crashed here "
        f"({record.get('reason', 'a crash')}, {record.get('recorded_at', 'earlier')}) {under}."
    )


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
                **{
                    k: Value(text, "words")
                    for k in ("model", "path", "engine", "reason", "changes", "recorded_at")
                },
                "settings": Value(lambda v: isinstance(v, dict), "the load settings"),
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

    def _write(self, records: dict[str, dict]) -> None:
        with contextlib.suppress(OSError):  # a cache: failing to write costs one more crash
            paths.write_private(self.path, json.dumps(records, indent=2))

    def lookup(self, engine: str, options: LoadOptions, *, expire: bool = True) -> dict | None:
        """The record this load follows: its model crashed here on this engine under these
        same settings. A record of the model under other settings has expired: None, and
        with `expire` (a load; a report leaves the file alone) it is removed."""
        key = _model_key(engine, options.model_path)
        records = self._read()
        record = records.get(key) if key else None
        if not isinstance(record, dict):
            return None
        if record.get("settings") != crash_settings(options):
            if expire:
                del records[key]
                self._write(records)
            return None
        return record

    def record(self, engine: str, options: LoadOptions, reason: str) -> dict | None:
        """Blame the model under `options`' settings (replacing its earlier record); the
        record written, or None for a model file that is gone."""
        key = _model_key(engine, options.model_path)
        if key is None:
            return None
        records = self._read()
        records[key] = {
            "model": Path(options.model_path).name,
            "path": str(Path(options.model_path).resolve()),
            "engine": engine,
            "reason": reason,
            "changes": CHANGES,
            "settings": crash_settings(options),
            "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        self._write(records)
        return records[key]

    def entries(self) -> list[dict]:
        """Every record, as stored (for reports: whether one applies depends on the load)."""
        return [r for r in self._read().values() if isinstance(r, dict)]

    def clear(self, model_path: str | None = None) -> list[dict]:
        """Remove every record (None), or those of one model file on any engine; the
        records removed. The next load of those models uses their own settings."""
        records = self._read()
        real = None if model_path is None else str(Path(model_path).resolve())
        gone = {
            k: r
            for k, r in records.items()
            if real is None or (isinstance(r, dict) and r.get("path") == real)
        }
        if gone:
            self._write({k: r for k, r in records.items() if k not in gone})
        return [r for r in gone.values() if isinstance(r, dict)]
