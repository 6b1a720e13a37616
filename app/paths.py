"""Every on-disk location Stoke uses, from platformdirs.

`STOKE_HOME` (one folder for data, cache and config) exists for tests and portable installs.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "stoke"


def _root(kind: str) -> Path:
    home = os.environ.get("STOKE_HOME")
    if home:
        return Path(home) / kind
    if kind == "data":
        return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    if kind == "cache":
        return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    return _ensure(_root("data"))


def cache_dir() -> Path:
    return _ensure(_root("cache"))


def config_dir() -> Path:
    return _ensure(_root("config"))


def database_path() -> Path:
    """The conversation store (SQLite, WAL)."""
    return data_dir() / "conversations.db"


def kv_dir(fingerprint: str) -> Path:
    """KV snapshots of one model."""
    return _ensure(cache_dir() / "kv" / fingerprint)


def models_dir() -> Path:
    return _ensure(data_dir() / "models")
