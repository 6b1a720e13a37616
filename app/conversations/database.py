"""Opening the conversation database's SQLite file, and what can go wrong with the file.

Storage only. Connects (WAL, foreign keys, migrations), checks a file's health read-only before
opening it for writing (rebuilding an index that lost rows), turns SQLite's errors about the
file into StoreErrors in words (locked, damaged, disk full with how much to free, unreadable),
and handles a damaged file: moved aside under a new name, never deleted, its readable rows
salvaged into a fresh one (repair.py), a damaged write-ahead log copied before SQLite would
drop it.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from app.conversations import repair, schema
from app.conversations.errors import (
    CorruptDatabaseError,
    NewerSchemaError,
    StoreError,
    StoreFullError,
    StoreLockedError,
)

_LOCKED_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
_CORRUPT_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}
_MB = 1 << 20
_LOW_ROOM = _MB  # an I/O error with less free than this is a full disk
# integrity_check read a 50 MB database in 0.15 s on the 2-core EPYC (quick_check 0.08 s).
_FULL_CHECK_BYTES = 64 * _MB
_INDEX_DAMAGE = re.compile(
    r"(?:row \d+ missing from|wrong # of entries in|non-unique entry in UNIQUE) index (\S+)"
)


def make_folder(path: Path) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise StoreError(
            f"Cannot create the folder of the conversation database {path}: {error}"
        ) from error


def keep_damaged_wal(path: Path) -> Path | None:
    try:
        return repair.keep_damaged_wal(path)
    except OSError as error:
        raise StoreError(
            f"The conversation database's log {path}-wal is damaged, and a copy of it could "
            f"not be kept ({error.strerror}). Free some room there and start Stoke again."
        ) from error


def salvaged(path: Path, backup: Path, conn: sqlite3.Connection) -> str:
    """Copy what `backup` still holds into the fresh database; the sentence that says so."""
    with translated(path):
        found = repair.salvage(backup, conn)
    if found.messages == 0 and found.conversations == 0:
        return (
            f"The conversation database was damaged and nothing in it could be recovered; "
            f"it was moved to {backup} and a new one was started."
        )
    said = (
        f"The conversation database was damaged; it was moved to {backup}, and "
        f"{_count(found.conversations, 'conversation')} and {_count(found.messages, 'message')} "
        "were recovered from it into a new one."
    )
    if found.stand_ins:
        said += " Where a message before them was lost, a note in the conversation says so."
    return said


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def connect(
    path: Path, busy_timeout: float, notices: list[str] | None = None
) -> sqlite3.Connection:
    """The database, checked, opened for writing and migrated. When a damaged index had to
    be rebuilt first, the sentence that tells the user goes to `notices`."""
    damaged_indexes = _check_health(path, busy_timeout)
    with translated(path):
        conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    try:
        with translated(path):
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            found = schema.version(conn)
            if found > schema.LATEST:
                raise NewerSchemaError(path, found, schema.LATEST)
            if damaged_indexes:
                said = _reindex(path, conn, damaged_indexes)
                if notices is not None:
                    notices.append(said)
            schema.migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot write; immutable where the folder cannot be written at all.
    A missing database reads as empty; one of another schema version is refused in words."""
    if not path.is_file():
        conn = sqlite3.connect(":memory:", isolation_level=None)
        schema.migrate(conn)
        return conn
    immutable = not os.access(path.parent, os.W_OK)
    uri = f"{path.resolve().as_uri()}?mode=ro" + ("&immutable=1" if immutable else "")
    with translated(path):
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        try:
            found = schema.version(conn)
        except BaseException:
            conn.close()
            raise
    if found != schema.LATEST:
        conn.close()
        raise StoreError(
            f"The conversation database {path} is of another Stoke version (schema {found}, "
            f"this one reads {schema.LATEST}); open it once where its folder can be written."
        )
    return conn


def _check_health(path: Path, busy_timeout: float) -> list[str]:
    """Raise CorruptDatabaseError for a damaged file; return the indexes that no longer match
    their table (REINDEX mends those). Read-only, so the file and its WAL stay as found
    (closing a read-write connection would checkpoint the WAL into it).

    A file up to _FULL_CHECK_BYTES gets SQLite's integrity_check, the only check that sees an
    index missing a row; a larger one the quick_check, which skips comparing each index with
    its table (the costly part), so that opening a large database does not keep the window
    waiting."""
    if not path.is_file() or path.stat().st_size == 0:
        return []
    check = "integrity_check" if path.stat().st_size <= _FULL_CHECK_BYTES else "quick_check"
    with translated(path):
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=busy_timeout)
        try:
            found = [row[0] for row in conn.execute(f"PRAGMA {check}")]
        finally:
            conn.close()
    if found == ["ok"]:
        return []
    indexes = [_INDEX_DAMAGE.fullmatch(line) for line in found]
    if not all(indexes):
        raise CorruptDatabaseError(path, found[0])
    return sorted({match[1] for match in indexes if match})


def _reindex(path: Path, conn: sqlite3.Connection, indexes: list[str]) -> str:
    """Rebuild `indexes` from their tables and check the whole file again; a table that
    breaks its index's rules (two rows with one id) makes the file a damaged one."""
    try:
        for name in indexes:
            conn.execute(f'REINDEX "{name.replace(chr(34), chr(34) * 2)}"')
        found = [row[0] for row in conn.execute("PRAGMA integrity_check")]
    except sqlite3.IntegrityError as error:
        raise CorruptDatabaseError(path, str(error)) from error
    if found != ["ok"]:
        raise CorruptDatabaseError(path, found[0])
    return (
        "An index the conversation database keeps to find its records quickly was damaged; "
        "it was rebuilt from the records themselves, and nothing was lost."
    )


@contextmanager
def translated(path: Path) -> Iterator[None]:
    """Turn SQLite's errors about the file (not about our SQL) into user-facing StoreErrors."""
    try:
        yield
    except sqlite3.DatabaseError as error:
        # The sqlite3 module's own errors (a closed connection) carry no SQLite code.
        code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF
        if code in _LOCKED_CODES:
            raise StoreLockedError(path) from error
        if code in _CORRUPT_CODES:
            raise CorruptDatabaseError(path, str(error)) from error
        if code == sqlite3.SQLITE_FULL or (code == sqlite3.SQLITE_IOERR and _low_room(path)):
            raise StoreFullError(path, _room_to_free(path)) from error
        if code in {
            sqlite3.SQLITE_CANTOPEN,
            sqlite3.SQLITE_READONLY,
            sqlite3.SQLITE_PERM,
            sqlite3.SQLITE_IOERR,
            sqlite3.SQLITE_FULL,
        }:
            raise StoreError(f"Cannot use the conversation database {path}: {error}") from error
        raise


def _low_room(path: Path) -> bool:
    try:
        return shutil.disk_usage(path.parent).free < _LOW_ROOM
    except OSError:
        return False


def _room_to_free(path: Path) -> int:
    """MB to free: enough for the log to grow and be folded back into the database, with a
    margin, and never a token amount."""
    size = 0
    for suffix in ("", "-wal"):
        with suppress(OSError):
            size += Path(f"{path}{suffix}").stat().st_size
    return max(50, math.ceil(size / 10 / _MB))


def move_aside(path: Path) -> Path:
    """Rename the damaged database (and its -wal/-shm) to a name no file has yet."""
    stem = f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
    backup = path.with_name(stem)
    attempt = 1
    while any(Path(f"{backup}{suffix}").exists() for suffix in ("", "-wal", "-shm")):
        backup = path.with_name(f"{stem}-{attempt}")
        attempt += 1
    try:
        for suffix in ("", "-wal", "-shm"):
            source = Path(f"{path}{suffix}")
            if source.exists():
                source.rename(f"{backup}{suffix}")
    except OSError as error:
        raise StoreError(
            f"The conversation database {path} is damaged and could not be moved aside: {error}"
        ) from error
    return backup
