"""Which of Stoke's tables a record read from a damaged file's pages belongs to, and its row.

The schema that names each b-tree may be among the damage, so a record (pages.py) is told
apart by its columns, against the tables schema.py creates: it has at least as many as the
table's first version had and at most as many as it has now (ALTER TABLE ADD COLUMN leaves
older rows shorter; the rebuild of schema 5 kept the columns' order), and each value is of
its column's type (text for TEXT, a number for REAL, an integer for INTEGER, never NULL
where the column is NOT NULL; the INTEGER PRIMARY KEY reads NULL, its value being the
rowid). By these rules the conversations and messages tables cannot pass for each other nor
for SQLite's or the search index's own tables.

A record cut short (its overflow pages lost) still makes a row when it holds its table's
key part (a message's text, a conversation's times): the columns after the cut take their
defaults or a stand-in, and a reply's token ids go (they may be the part that was lost).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from app.conversations import schema
from app.conversations.pages import Record

TABLES = ("conversations", "messages")
# An incomplete record must hold its table's columns up to this one to make a row.
_KEY = {"conversations": "updated_at", "messages": "content"}
_DROPPED_WHEN_CUT = ("token_ids", "tokens_fingerprint")
_NEVER_COPIED = ("writer",)  # the lease of a process that is gone


@dataclass(frozen=True)
class Column:
    name: str
    affinity: str  # TEXT, REAL, INTEGER or BLOB, as the declared type gives it
    required: bool  # NOT NULL
    rowid: bool  # the INTEGER PRIMARY KEY, stored as NULL


@dataclass(frozen=True)
class Shape:
    table: str
    columns: tuple[Column, ...]
    least: int  # the column count of the table's first version

    def fits(self, record: Record) -> bool:
        values = record.values
        names = [column.name for column in self.columns]
        enough = self.least if record.complete else names.index(_KEY[self.table]) + 1
        return enough <= len(values) <= len(self.columns) and all(
            _of_type(value, column) for value, column in zip(values, self.columns, strict=False)
        )

    def rows(self, records: Iterable[Record]) -> list[dict[str, object]]:
        """The rows `records` (which fit) make, the best copy of each first: whole records
        before cut ones, then the latest updated (a freed page may hold an older copy)."""
        made = []
        ordered = sorted(records, key=lambda record: record.rowid)
        names = [column.name for column in self.columns]
        at = names.index("created_at")
        last_time = next((r.values[at] for r in ordered if len(r.values) > at), None)
        for record in ordered:
            row = {
                column.name: record.rowid if column.rowid else value
                for column, value in zip(self.columns, record.values, strict=False)
                if column.name not in _NEVER_COPIED
            }
            if not record.complete:
                for name in _DROPPED_WHEN_CUT:
                    row.pop(name, None)
            last_time = row.get("created_at", last_time)
            for column in self.columns[len(record.values) :]:
                if column.required and column.name not in row:
                    row[column.name] = _stand_in(column.name, row, last_time)
            made.append((record.complete, row))
        made.sort(key=lambda pair: (not pair[0], -_number(pair[1].get("updated_at"))))
        return [row for _complete, row in made]


def shapes(latest: sqlite3.Connection) -> list[Shape]:
    """Stoke's tables as `latest` (a database at schema.LATEST) has them."""
    first = sqlite3.connect(":memory:", isolation_level=None)
    try:
        schema.migrate(first, 1)
        return [
            Shape(table, tuple(_columns(latest, table)), len(list(_columns(first, table))))
            for table in TABLES
        ]
    finally:
        first.close()


def _columns(conn: sqlite3.Connection, table: str) -> Iterable[Column]:
    info = conn.execute(f"PRAGMA table_info({table})").fetchall()
    keys = [row for row in info if row[5]]
    for _cid, name, declared, notnull, _default, key in info:
        affinity = _affinity(declared)
        rowid = bool(key) and len(keys) == 1 and declared.upper() == "INTEGER"
        yield Column(name, affinity, bool(notnull) or (bool(key) and not rowid), rowid)


def _affinity(declared: str) -> str:
    """SQLite's rules (sqlite.org/datatype3.html#determination_of_column_affinity), as far
    as Stoke's declared types go."""
    declared = declared.upper()
    if "INT" in declared:
        return "INTEGER"
    if any(word in declared for word in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if any(word in declared for word in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "BLOB"


def _of_type(value: object, column: Column) -> bool:
    if column.rowid or value is None:
        return value is None and (column.rowid or not column.required)
    if column.affinity == "TEXT":
        return isinstance(value, str)
    if column.affinity == "INTEGER":
        return isinstance(value, int)
    if column.affinity == "REAL":
        return isinstance(value, int | float)
    return True


def _stand_in(name: str, row: dict[str, object], last_time: object) -> object:
    """A value for a NOT NULL column a cut record lost (salvage skips a row this leaves
    without one: the fresh database refuses it)."""
    if name == "status":
        return "complete" if row.get("role") == "user" else "interrupted"
    if name in ("created_at", "updated_at"):
        return row.get("created_at", last_time)
    return None


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
