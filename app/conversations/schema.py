"""Versioned schema migrations.

`PRAGMA user_version` holds the version a database is at. Each migration runs in its own
transaction together with the version bump, so a failure leaves the database at the last good
version. Migrations are append-only: never edit one that has shipped, add the next.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

_V1_TABLES = """
CREATE TABLE conversations (
    id TEXT PRIMARY KEY,
    title TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    pinned INTEGER NOT NULL DEFAULT 0,
    deleted_at REAL,
    system_prompt TEXT,
    sampling TEXT NOT NULL DEFAULT '{}',
    current_leaf_id TEXT,
    draft TEXT NOT NULL DEFAULT '',
    model TEXT
);
-- seq is an explicit rowid: FTS5 external content keys on it, and VACUUM may renumber implicit
-- rowids.
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id TEXT REFERENCES messages(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    token_ids BLOB,
    tokens_fingerprint TEXT,
    status TEXT NOT NULL CHECK (status IN ('complete', 'streaming', 'interrupted', 'error')),
    finish_reason TEXT,
    stats TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX messages_by_parent ON messages(conversation_id, parent_id);
CREATE INDEX messages_streaming ON messages(status) WHERE status = 'streaming';
"""

# Streaming replies stay out of the index (rewriting it every ~100 ms would make each update
# cost as much as the whole reply); they enter it when they stop streaming.
_MESSAGES_FTS_TRIGGERS = """
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages
WHEN new.status != 'streaming' BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.seq, new.content);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF content, status ON messages
WHEN old.status != 'streaming' OR new.status != 'streaming' BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content)
        SELECT 'delete', old.seq, old.content WHERE old.status != 'streaming';
    INSERT INTO messages_fts(rowid, content)
        SELECT new.seq, new.content WHERE new.status != 'streaming';
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages
WHEN old.status != 'streaming' BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.seq, old.content);
END;
"""

_V2_SEARCH = (
    """
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages', content_rowid='seq');
"""
    + _MESSAGES_FTS_TRIGGERS
    + """INSERT INTO messages_fts(rowid, content) SELECT seq, content FROM messages
    WHERE status != 'streaming';

CREATE VIRTUAL TABLE titles_fts USING fts5(title, conversation_id UNINDEXED);
CREATE TRIGGER titles_fts_insert AFTER INSERT ON conversations
WHEN new.title IS NOT NULL BEGIN
    INSERT INTO titles_fts(title, conversation_id) VALUES (new.title, new.id);
END;
CREATE TRIGGER titles_fts_update AFTER UPDATE OF title ON conversations BEGIN
    DELETE FROM titles_fts WHERE conversation_id = old.id;
    INSERT INTO titles_fts(title, conversation_id)
        SELECT new.title, new.id WHERE new.title IS NOT NULL;
END;
CREATE TRIGGER titles_fts_delete AFTER DELETE ON conversations BEGIN
    DELETE FROM titles_fts WHERE conversation_id = old.id;
END;
INSERT INTO titles_fts(title, conversation_id) SELECT title, id FROM conversations
    WHERE title IS NOT NULL;
"""
)

# Who writes: the lease (app/conversations/leases.py) of the process streaming a reply, and
# of the process whose turn holds a conversation; NULL when nobody does.
_V3_WRITERS = """
ALTER TABLE messages ADD COLUMN writer TEXT;
ALTER TABLE conversations ADD COLUMN writer TEXT;
"""

# Files attached to a message (JSON: name, kind, token count, extracted text; the message's
# token_ids already hold their tokens), and when a conversation came from an export file.
_V4_ATTACHMENTS = """
ALTER TABLE messages ADD COLUMN attachments TEXT;
ALTER TABLE conversations ADD COLUMN imported_at REAL;
"""

# Tool calls: an assistant message's calls (JSON: id, name, arguments as JSON text) and the
# 'tool' role, whose message is one call's result (its text, the call's id, the function's
# name). SQLite cannot change a CHECK constraint in place, so messages is rebuilt the way
# sqlite.org/lang_altertable.html#otheralter says (migrate() turns foreign keys off around
# it, or dropping the old table would cascade into the new one): every row keeps its seq,
# so the search index, keyed on seq, stays valid; the indexes and the search triggers, which
# went with the old table, are made again as they were.
_V5_TOOLS = (
    """
CREATE TABLE messages_v5 (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id TEXT REFERENCES messages(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
    content TEXT NOT NULL,
    token_ids BLOB,
    tokens_fingerprint TEXT,
    status TEXT NOT NULL CHECK (status IN ('complete', 'streaming', 'interrupted', 'error')),
    finish_reason TEXT,
    stats TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    writer TEXT,
    attachments TEXT,
    tool_calls TEXT,
    tool_call_id TEXT,
    tool_name TEXT
);
INSERT INTO messages_v5 (seq, id, conversation_id, parent_id, role, content, token_ids,
    tokens_fingerprint, status, finish_reason, stats, created_at, updated_at, writer,
    attachments)
    SELECT seq, id, conversation_id, parent_id, role, content, token_ids, tokens_fingerprint,
    status, finish_reason, stats, created_at, updated_at, writer, attachments FROM messages;
DROP TABLE messages;
ALTER TABLE messages_v5 RENAME TO messages;
CREATE INDEX messages_by_parent ON messages(conversation_id, parent_id);
CREATE INDEX messages_streaming ON messages(status) WHERE status = 'streaming';
"""
    + _MESSAGES_FTS_TRIGGERS
)

# Conversations the API server beside the window served (app/conversations/served.py): when
# the first reply was kept, and the client that asked (its user agent; NULL when it sent none).
_V6_SERVED = """
ALTER TABLE conversations ADD COLUMN served_at REAL;
ALTER TABLE conversations ADD COLUMN served_to TEXT;
CREATE INDEX conversations_served ON conversations(served_at) WHERE served_at IS NOT NULL;
"""

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (1, _V1_TABLES),
    (2, _V2_SEARCH),
    (3, _V3_WRITERS),
    (4, _V4_ATTACHMENTS),
    (5, _V5_TOOLS),
    (6, _V6_SERVED),
)
LATEST = MIGRATIONS[-1][0]


def version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: sqlite3.Connection, target: int = LATEST) -> None:
    """Bring the database up to `target`. `conn` must be in autocommit mode.

    The version is read again under the write lock, so two processes opening an old database
    at once do not both apply the same migration. Foreign keys are off while migrations run
    (a table rebuild must not cascade; SQLite ignores the switch inside a transaction) and
    checked before each commit, so a migration that would leave a dangling reference rolls
    back instead.
    """
    if version(conn) >= target:
        return
    enforced = conn.execute("PRAGMA foreign_keys").fetchone()[0]
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        for number, script in MIGRATIONS:
            if number > target:
                break
            _apply(conn, number, script)
    finally:
        conn.execute(f"PRAGMA foreign_keys = {'ON' if enforced else 'OFF'}")


def _apply(conn: sqlite3.Connection, number: int, script: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        if version(conn) < number:
            dangling = _dangling(conn)
            for statement in _statements(script):
                conn.execute(statement)
            if _dangling(conn) > dangling:
                raise sqlite3.IntegrityError(
                    f"schema migration {number} would leave references to rows that are gone"
                )
            conn.execute(f"PRAGMA user_version = {number}")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _dangling(conn: sqlite3.Connection) -> int:
    """References to missing rows (a file written with foreign keys off may hold some
    already; a migration may add none)."""
    return len(conn.execute("PRAGMA foreign_key_check").fetchall())


def _statements(script: str) -> Iterator[str]:
    """Split a script into statements (executescript would commit the open transaction)."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            yield statement
            statement = ""
