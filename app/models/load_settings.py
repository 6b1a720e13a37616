"""How each model is loaded on this machine: the plan the hardware wizard applied to it.

One JSON file under the config dir holds every model's settings, keyed by the model's
fingerprint (`app.engine.model_file.fingerprint`), so a moved or renamed file keeps them and a
different file at the same path (a re-download, another quantization) does not inherit them.
The path is stored alongside for people reading the file. The options are
`planner.load_options(plan)` plus "engine": JSON arrays come back as tuples, as the plan holds
them, so a saved dict loads back equal.

Writes go to a private temp file that replaces the old one, so a crash never leaves half a
file. Reads are checked (`LOAD_SETTINGS_FILE`, app/stored.py): a file that cannot be read as
settings is kept aside as `load_settings.json.damaged` (then `-2`, `-3`: never over an earlier
copy) and ignored, like `settings.json`; an entry without options, or an option of the wrong
type, is left out alone.
"""

from __future__ import annotations

import json
import os
import typing
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app import paths
from app.engine.model_file import fingerprint
from app.engine.protocol import LoadOptions
from app.stored import Entries, Fields, Stored, Value, of_type, one_of, text

FILE_NAME = "load_settings.json"
FORMAT_VERSION = 1
_HINTS = typing.get_type_hints(LoadOptions)
# The options: LoadOptions' fields as JSON holds them (what the engine is handed: no model
# path, no remote server), each checked against its type.
_OPTIONS = Fields(
    {
        f.name: Value(of_type(_HINTS[f.name]), f"{f.type} (LoadOptions.{f.name})")
        for f in fields(LoadOptions)
        if f.name not in ("model_path", "remote")
    }
)
LOAD_SETTINGS_FILE = Stored(
    Fields(
        {
            "version": Value(one_of(FORMAT_VERSION), f"{FORMAT_VERSION} (this Stoke's format)"),
            "models": Entries(
                Fields(
                    {
                        "model_path": Value(text, "a path"),
                        "saved_at": Value(text, "a time"),
                        "options": _OPTIONS,
                    },
                    required=("options",),
                )
            ),
        },
        required=("version", "models"),
    ),
    keep=True,
    empty=lambda: {"version": FORMAT_VERSION, "models": {}},
)


def settings_path() -> Path:
    return paths.config_dir() / FILE_NAME


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def _read(path: Path) -> dict[str, Any]:
    """Every model's entry; a damaged file is kept aside and reads as empty, a damaged entry
    or option is left out alone (app/stored.py)."""
    return LOAD_SETTINGS_FILE.read(path).value["models"]


def _write(path: Path, models: dict[str, Any]) -> None:
    text = json.dumps({"version": FORMAT_VERSION, "models": models}, indent=2, sort_keys=True)
    paths.write_private(path, text)


def save(model_path: str | os.PathLike[str], options: dict[str, Any]) -> None:
    """Store `options` as the load settings of the model at `model_path` (which must exist).
    Raises TypeError for options JSON cannot hold, and ValueError (naming them) for options a
    load cannot take, which a read would drop: both before anything is written."""
    problems: list[str] = []
    _OPTIONS.clean(json.loads(json.dumps(options)), "options", problems)
    if problems:
        raise ValueError("; ".join(problems))
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
    return None if entry is None else _tuples(entry["options"])
