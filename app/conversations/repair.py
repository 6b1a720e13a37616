"""What a damaged database still holds: a write-ahead log SQLite would drop, readable rows.

SQLite stops reading a WAL at the first frame whose checksum fails and overwrites the rest on
the next write, silently: the last turns vanish. So before the first connection opens the
database, the log is walked frame by frame (the format is documented at
sqlite.org/fileformat2.html#walformat) and a damaged one is copied aside. A damaged database
file is moved aside by the store; `salvage` then copies every row that can still be read
into the fresh one, whose triggers rebuild the search index as the rows go in: through SQL
while SQL can read the file, and from its pages (pages.py, shapes.py) where it cannot,
before forest.py closes the holes the lost rows left.
"""

from __future__ import annotations

import mmap
import os
import shutil
import sqlite3
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from app.conversations import forest, pages, shapes

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
    return _frames(data)[1]


def committed_pages(database: Path) -> dict[int, bytes]:
    """The pages `database`'s WAL holds committed copies of, by page number (the newest
    copy of each; frames after the last commit, or past a damaged frame, are left out):
    what SQLite would read in place of the file's own pages."""
    try:
        data = Path(f"{database}-wal").read_bytes()
    except OSError:
        return {}
    pages: dict[int, bytes] = {}
    pending: dict[int, bytes] = {}
    for number, commit, page in _frames(data)[0]:
        pending[number] = page
        if commit:
            pages.update(pending)
            pending = {}
    return pages


def _frames(data: bytes) -> tuple[list[tuple[int, int, bytes]], bool]:
    """The current log's frames that pass their checksums, in order (page number, database
    size if it commits else 0, page), and whether one of the current log failed (or the
    header is unreadable) before its end."""
    if len(data) < _WAL_HEADER:
        return [], len(data) > 0
    magic, _version, page_size, _seq, salt1, salt2, check1, check2 = struct.unpack(
        ">8I", data[:_WAL_HEADER]
    )
    if magic not in _WAL_MAGIC or page_size < 512 or page_size & (page_size - 1):
        return [], True
    order = ">" if magic & 1 else "<"
    sums = _checksum(data[:24], 0, 0, order)
    if sums != (check1, check2):
        return [], True
    frames = []
    frame = _FRAME_HEADER + page_size
    for offset in range(_WAL_HEADER, len(data) - frame + 1, frame):
        header = data[offset : offset + _FRAME_HEADER]
        number, commit, frame_salt1, frame_salt2, sum1, sum2 = struct.unpack(">6I", header)
        if (frame_salt1, frame_salt2) != (salt1, salt2):
            return frames, False  # frames of an earlier log, already checkpointed
        page = data[offset + _FRAME_HEADER : offset + frame]
        sums = _checksum(header[:8] + page, *sums, order)
        if sums != (sum1, sum2):
            return frames, True
        frames.append((number, commit, page))
    return frames, False


def _checksum(data: bytes, s1: int, s2: int, order: str) -> tuple[int, int]:
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s1 = (s1 + words[i] + s2) & 0xFFFFFFFF
        s2 = (s2 + words[i + 1] + s1) & 0xFFFFFFFF
    return s1, s2


@dataclass(frozen=True)
class Salvaged:
    """What salvage brought into the fresh database."""

    conversations: int
    messages: int  # stand-ins for lost messages not counted
    stand_ins: int  # messages that say one was lost there (forest.py)


def salvage(damaged: Path, conn: sqlite3.Connection) -> Salvaged:
    """Copy the readable conversations and messages of the `damaged` file into `conn` (a
    fresh, migrated database in autocommit mode).

    First through SQL, in rowid order; where a page cannot be read the copy goes on past it
    and reads back whatever that skip passed over one row at a time. When SQL could not read
    both tables to their end (the header, the first page or the schema is damaged, the file
    was cut short, a page is lost), the file's pages are read as well (pages.py) and every
    row found there that SQL did not bring is added. Then forest.py makes the rows a whole
    that every conversation can show and continue.
    """
    conn.execute("PRAGMA foreign_keys = OFF")  # parents may be among the lost rows
    try:
        conn.execute("BEGIN IMMEDIATE")
        if not _copy_through_sql(damaged, conn):
            _copy_from_pages(damaged, conn)
        messages = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        stand_ins = forest.mend(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.execute("PRAGMA foreign_keys = ON")
    conversations = conn.execute("SELECT count(*) FROM conversations").fetchone()[0]
    return Salvaged(conversations, messages, stand_ins)


def _copy_through_sql(damaged: Path, conn: sqlite3.Connection) -> bool:
    """Copy what SQL reads of both tables; whether it read them whole."""
    try:
        source = sqlite3.connect(f"{damaged.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    whole = True
    try:
        for table in shapes.TABLES:
            columns = _shared_columns(source, conn, table)
            if not columns:
                whole = False
                continue
            reader = _Reader(source, table, columns)
            _insert(conn, table, columns, reader.rows())
            whole = whole and reader.whole
    finally:
        source.close()
    return whole


def _copy_from_pages(damaged: Path, conn: sqlite3.Connection) -> None:
    """Add the rows the file's pages (and its log's committed pages) hold that are not in
    `conn` yet."""
    tables = shapes.shapes(conn)
    found: dict[str, list[pages.Record]] = {shape.table: [] for shape in tables}
    try:
        with damaged.open("rb") as file:
            if os.fstat(file.fileno()).st_size == 0:
                return
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                for record in pages.records(data, committed_pages(damaged)):
                    shape = next((shape for shape in tables if shape.fits(record)), None)
                    if shape is not None:
                        found[shape.table].append(record)
    except OSError:
        return
    for shape in tables:
        for row in shape.rows(found[shape.table]):
            _insert(conn, shape.table, list(row), [tuple(row.values())])


def _insert(
    conn: sqlite3.Connection, table: str, columns: list[str], found: Iterable[tuple]
) -> None:
    """Insert each row that is not there yet (by its keys) and that the table accepts."""
    insert = (
        f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) "
        f"VALUES ({', '.join('?' * len(columns))})"
    )
    for row in found:
        try:
            conn.execute(insert, row)
        except sqlite3.Error:
            continue  # a row that reads but holds nonsense


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


class _Reader:
    """A table's rows through SQL, past the pages that cannot be read; `whole` turns False
    when one could not."""

    def __init__(self, source: sqlite3.Connection, table: str, columns: list[str]) -> None:
        self.source = source
        self.table = table
        self.select = f"SELECT rowid, {', '.join(columns)} FROM {table}"
        self.whole = True

    def rows(self) -> Iterator[tuple]:
        after = 0  # rowids Stoke's tables assign start at 1
        while True:
            try:
                for row in self.source.execute(
                    f"{self.select} WHERE rowid > ? ORDER BY rowid", (after,)
                ):
                    after = row[0]
                    yield row[1:]
                return
            except sqlite3.DatabaseError:
                self.whole = False
            resume = self._next_readable(after)
            if resume is None:
                return
            for rowid in range(after + 1, min(resume, after + 1 + _MAX_BACKFILL)):
                try:
                    row = self.source.execute(f"{self.select} WHERE rowid = ?", (rowid,)).fetchone()
                except sqlite3.DatabaseError:
                    continue
                if row is not None:
                    yield row[1:]
            after = resume - 1

    def _next_readable(self, after: int) -> int | None:
        """The first rowid past `after` a seek can reach, skipping ever further ahead (past
        the last row: the rowid just after the skip), or None if no seek works."""
        for bits in range(_MAX_SKIP_BITS):
            skip = after + (1 << bits)
            try:
                row = self.source.execute(
                    f"SELECT rowid FROM {self.table} WHERE rowid > ? ORDER BY rowid LIMIT 1",
                    (skip,),
                ).fetchone()
            except sqlite3.DatabaseError:
                continue
            return skip + 1 if row is None else row[0]
        return None
