"""An index that lost a row while its table kept it: found on open, rebuilt, and said.

SQLite's quick_check passes such a file (it does not compare indexes with their tables), yet
every query through the index misses the row: here a regenerated reply vanishes from its
question's alternatives.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from app.conversations import ConversationStore


def _drop_from_index(db: Path, index: str, seq: int) -> None:
    """Give `index` a b-tree built without row `seq`: a partial copy of it is made, the two
    swap root pages in the schema (writable_schema), and the copy, now the old tree, goes."""
    with sqlite3.connect(db, isolation_level=None) as conn:
        (definition,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = ?", (index,)
        ).fetchone()
        partial = definition.replace(f"INDEX {index}", "INDEX partial", 1)
        conn.execute(f"{partial} WHERE seq != {seq}")
        roots = dict(
            conn.execute(
                "SELECT name, rootpage FROM sqlite_master WHERE name IN (?, 'partial')", (index,)
            )
        )
        version = conn.execute("PRAGMA schema_version").fetchone()[0]
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute(
            "UPDATE sqlite_master SET rootpage = CASE name WHEN 'partial' THEN ? ELSE ? END"
            " WHERE name IN (?, 'partial')",
            (roots[index], roots["partial"], index),
        )
        conn.execute(f"PRAGMA schema_version = {version + 1}")
    conn.close()
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute("DROP INDEX partial")
    conn.close()


def test_an_index_that_lost_a_row_is_rebuilt_on_open(tmp_path: Path) -> None:
    db = tmp_path / "data" / "conversations.db"
    with ConversationStore.open(db) as store:
        conversation = store.create_conversation().id
        question = store.add_message(conversation, None, "user", "name a bird")
        store.add_message(conversation, question.id, "assistant", "a kestrel")
        again = store.add_message(conversation, question.id, "assistant", "a pelican")
        seq = store._conn.execute("SELECT seq FROM messages WHERE id = ?", (again.id,)).fetchone()
    _drop_from_index(db, "messages_by_parent", seq[0])
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA quick_check").fetchall() == [("ok",)]
        assert (
            "missing from index messages_by_parent"
            in conn.execute("PRAGMA integrity_check").fetchone()[0]
        )
        assert conn.execute(  # through the index: the regeneration is gone
            "SELECT count(*) FROM messages WHERE conversation_id = ? AND parent_id = ?",
            (conversation, question.id),
        ).fetchone() == (1,)
    conn.close()

    with ConversationStore.open(db) as store:
        assert store.recovered_from is None  # mended in place, nothing set aside
        (notice,) = store.notices
        assert "was damaged; it was rebuilt" in notice and "nothing was lost" in notice
        replies = store.children(question.id, conversation)
        assert [reply.content for reply in replies] == ["a kestrel", "a pelican"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()
