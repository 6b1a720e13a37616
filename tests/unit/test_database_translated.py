"""`translated` turns SQLite's file errors into StoreErrors and leaves the rest as they are,
the sqlite3 module's own errors included (they carry no SQLite error code)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.conversations.database import translated
from app.conversations.errors import StoreLockedError


def test_a_closed_connection_error_passes_through_unchanged(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "a.db")
    conn.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed database"), translated(tmp_path):
        conn.execute("SELECT 1")


def test_a_locked_file_becomes_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with pytest.raises(StoreLockedError), translated(path):
            other.execute("BEGIN IMMEDIATE")
    finally:
        other.close()
        holder.close()
