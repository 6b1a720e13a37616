"""How each model is loaded on this machine: the plan the hardware wizard applied to it.

One JSON file under the config dir holds every model's settings, keyed by the model's
fingerprint (`app.engine.model_file.fingerprint`), so a moved or renamed file keeps them and a
different file at the same path (a re-download, another quantization) does not inherit them.
The path is stored alongside for people reading the file. The options are
`planner.load_options(plan)` plus "engine": JSON arrays come back as tuples, as the plan holds
them, so a saved dict loads back equal.

Writes go to a private temp file that replaces the old one, so a crash never leaves half a
file; a file that cannot be read as settings is kept aside as `load_settings.json.damaged`
(then `-2`, `-3`: never over an earlier copy) and ignored, like `settings.json`.
"""

from __future__ import annotations

import contextlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app import paths
from app.engine.model_file import fingerprint

FILE_NAME = "load_settings.json"
FORMAT_VERSION = 1


def settings_path() -> Path:
    return paths.config_dir() / FILE_NAME


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def _read(path: Path) -> dict[str, Any]:
    """Every model's entry; a damaged file is moved aside and reads as empty."""
    try:
        raw = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        raw = None
    if (
        isinstance(raw, dict)
        and raw.get("version") == FORMAT_VERSION
        and isinstance(raw.get("models"), dict)
    ):
        return raw["models"]
    with contextlib.suppress(OSError):  # a read-only folder: ignored all the same
        paths.keep_aside(path)
    return {}


def _write(path: Path, models: dict[str, Any]) -> None:
    text = json.dumps({"version": FORMAT_VERSION, "models": models}, indent=2, sort_keys=True)
    paths.write_private(path, text)


def save(model_path: str | os.PathLike[str], options: dict[str, Any]) -> None:
    """Store `options` as the load settings of the model at `model_path` (which must exist).
    Raises TypeError for options JSON cannot hold, before anything is written."""
    json.dumps(options)
    key = fingerprint(model_path, hash_content=False)
    path = settings_path()
    models = _read(path)
    models[key] = {
        "model_path": str(Path(model_path).expanduser().resolve()),
        "saved_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "options": options,
    }
    _write(path, models)


def load(model_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The saved load settings of the model at `model_path`; None when it has none (or the
    file is gone or unreadable)."""
    try:
        key = fingerprint(model_path, hash_content=False)
    except OSError:
        return None
    entry = _read(settings_path()).get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("options"), dict):
        return None
    return _tuples(entry["options"])
