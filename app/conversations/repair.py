"""What a damaged database still holds: a write-ahead log SQLite would drop, readable rows.

SQLite stops reading a WAL at the first frame whose checksum fails and overwrites the rest on
the next write, silently: the last turns vanish. So before the first connection opens the
database, the log is walked frame by frame (the format is documented at
sqlite.org/fileformat2.html#walformat) and a damaged one is copied aside. A damaged database
file is moved aside by the store; `salvage` then copies every row that can still be read
into the fresh one, whose triggers rebuild the search index as the rows go in.
"""

from __future__ import annotations

import shutil
import sqlite3
import struct
import time
from collections.abc import Iterator
from pathlib import Path

_WAL_MAGIC = (0x377F0682, 0x377F0683)  # checksums in little- / big-endian words
_WAL_HEADER = 32
_FRAME_HEADER = 24
_MAX_SKIP_BITS = 40  # how far past a damaged page the next readable row is looked for
_MAX_BACKFILL = 100_000


def keep_damaged_wal(database: Path) -> Path | None:
    """Copy `database`'s WAL aside if a committed part of it would not be applied; the copy's
    path, or None when the log is intact (or absent)."""
    wal = Path(f"{database}-wal")
    try:
        data = wal.read_bytes()
    except OSError:
        return None
    if len(data) <= _WAL_HEADER or not _wal_damaged(data):
        return None
    stem = f"{wal.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    copy, attempt = wal.with_name(stem), 1
    while copy.exists():
        copy, attempt = wal.with_name(f"{stem}-{attempt}"), attempt + 1
    shutil.copyfile(wal, copy)
    copy.chmod(0o600)
    return copy


def _wal_damaged(data: bytes) -> bool:
    """True when a frame of the current log (its salts match the header) fails its checksum,
    or the header itself is unreadable: SQLite would then ignore that frame and all after."""
    magic, _version, page_size, _seq, salt1, salt2, check1, check2 = struct.unpack(
        ">8I", data[:_WAL_HEADER]
    )
    if magic not in _WAL_MAGIC or page_size < 512 or page_size & (page_size - 1):
        return True
    order = ">" if magic & 1 else "<"
    sums = _checksum(data[:24], 0, 0, order)
    if sums != (check1, check2):
        return True
    frame = _FRAME_HEADER + page_size
    for offset in range(_WAL_HEADER, len(data) - frame + 1, frame):
        header = data[offset : offset + _FRAME_HEADER]
        _page, _commit, frame_salt1, frame_salt2, sum1, sum2 = struct.unpack(">6I", header)
        if (frame_salt1, frame_salt2) != (salt1, salt2):
            return False  # frames of an earlier log, already checkpointed
        page = data[offset + _FRAME_HEADER : offset + frame]
        sums = _checksum(header[:8] + page, *sums, order)
        if sums != (sum1, sum2):
            return True
    return False


def _checksum(data: bytes, s1: int, s2: int, order: str) -> tuple[int, int]:
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s1 = (s1 + words[i] + s2) & 0xFFFFFFFF
        s2 = (s2 + words[i + 1] + s1) & 0xFFFFFFFF
    return s1, s2


def salvage(damaged: Path, conn: sqlite3.Connection) -> tuple[int, int]:
    """Copy the readable conversations and messages of the `damaged` file into `conn` (a
    fresh, migrated database in autocommit mode); returns (conversations, messages) now held.

    Rows are copied in rowid order; where a page cannot be read the copy goes on past it and
    reads back whatever that skip passed over one row at a time. Messages whose parent was
    lost become roots, messages whose conversation was lost get one, and a lost current leaf
    becomes the conversation's newest message, so everything recovered can be opened.
    """
    try:
        source = sqlite3.connect(f"{damaged.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return 0, 0
    conn.execute("PRAGMA foreign_keys = OFF")  # parents may be among the lost rows
    try:
        conn.execute("BEGIN IMMEDIATE")
        for table in ("conversations", "messages"):
            columns = _shared_columns(source, conn, table)
            if not columns:
                continue
            insert = (
                f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) "
                f"VALUES ({', '.join('?' * len(columns))})"
            )
            for row in _readable_rows(source, table, columns):
                try:
                    conn.execute(insert, row)
                except sqlite3.Error:
                    continue  # a row that reads but holds nonsense
        _reconnect(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        source.close()
        conn.execute("PRAGMA foreign_keys = ON")
    return (
        conn.execute("SELECT count(*) FROM conversations").fetchone()[0],
        conn.execute("SELECT count(*) FROM messages").fetchone()[0],
    )


def _shared_columns(
    source: sqlite3.Connection, target: sqlite3.Connection, table: str
) -> list[str]:
    """The columns both schemas have, bar the writer lease (its process is gone)."""
    try:
        found = {row[1] for row in source.execute(f"PRAGMA table_info({table})")}
    except sqlite3.Error:
        return []
    wanted = [row[1] for row in target.execute(f"PRAGMA table_info({table})")]
    return [name for name in wanted if name in found and name != "writer"]


def _readable_rows(source: sqlite3.Connection, table: str, columns: list[str]) -> Iterator[tuple]:
    select = f"SELECT rowid, {', '.join(columns)} FROM {table}"
    after = 0  # rowids Stoke's tables assign start at 1
    while True:
        try:
            for row in source.execute(f"{select} WHERE rowid > ? ORDER BY rowid", (after,)):
                after = row[0]
                yield row[1:]
            return
        except sqlite3.DatabaseError:
            pass
        resume = _next_readable(source, table, after)
        if resume is None:
            return
        for rowid in range(after + 1, min(resume, after + 1 + _MAX_BACKFILL)):
            try:
                row = source.execute(f"{select} WHERE rowid = ?", (rowid,)).fetchone()
            except sqlite3.DatabaseError:
                continue
            if row is not None:
                yield row[1:]
        after = resume - 1


def _next_readable(source: sqlite3.Connection, table: str, after: int) -> int | None:
    """The first rowid past `after` a seek can reach, skipping ever further ahead (past the
    last row: the rowid just after the skip), or None if no seek works."""
    for bits in range(_MAX_SKIP_BITS):
        skip = after + (1 << bits)
        try:
            row = source.execute(
                f"SELECT rowid FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT 1", (skip,)
            ).fetchone()
        except sqlite3.DatabaseError:
            continue
        return skip + 1 if row is None else row[0]
    return None


def _reconnect(conn: sqlite3.Connection) -> None:
    """Make the recovered rows a well-formed forest that every conversation can show."""
    conn.execute(
        "INSERT INTO conversations (id, title, created_at, updated_at)"
        " SELECT conversation_id, 'Recovered conversation', min(created_at), max(updated_at)"
        " FROM messages WHERE conversation_id NOT IN (SELECT id FROM conversations)"
        " GROUP BY conversation_id"
    )
    conn.execute(
        "UPDATE messages SET parent_id = NULL WHERE parent_id IS NOT NULL AND parent_id NOT IN"
        " (SELECT p.id FROM messages p WHERE p.conversation_id = messages.conversation_id)"
    )
    conn.execute(
        "UPDATE conversations SET current_leaf_id = (SELECT m.id FROM messages m"
        " WHERE m.conversation_id = conversations.id ORDER BY m.created_at DESC, m.seq DESC"
        " LIMIT 1) WHERE current_leaf_id IS NULL OR current_leaf_id NOT IN"
        " (SELECT m.id FROM messages m WHERE m.conversation_id = conversations.id)"
    )
