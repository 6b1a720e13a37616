"""A damaged database or write-ahead log: what can be read is kept, and the user is told.

Real SQLite files, damaged the way a disk or a crash damages them: whole pages overwritten,
a byte of the log flipped.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.conversations import ConversationStore

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "conversations.db"


def _fill(db: Path, conversations: int, turns: int, size: int = 40) -> dict[str, list[str]]:
    """Conversations of `turns` question/answer pairs; returns each one's message texts."""
    texts: dict[str, list[str]] = {}
    with ConversationStore.open(db) as store:
        for c in range(conversations):
            conversation = store.create_conversation().id
            parent = None
            texts[conversation] = []
            for t in range(turns):
                for role in ("user", "assistant"):
                    text = f"{role} {c}-{t} pelican " + "x" * size
                    parent = store.add_message(
                        conversation, parent, role, text, token_ids=[c, t]
                    ).id
                    texts[conversation].append(text)
    return texts


def _pages(db: Path, table: str) -> list[int]:
    """The leaf pages of `table` (the last connection's close checkpointed the WAL)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY pageno",
            (table,),
        ).fetchall()
    return [row[0] for row in rows]


def _overwrite_page(db: Path, page: int) -> None:
    with db.open("r+b") as f:
        f.seek((page - 1) * 4096)
        f.write(os.urandom(4096))


def test_damaged_search_index_keeps_every_message(db: Path) -> None:
    texts = _fill(db, conversations=3, turns=7)  # 42 messages
    for page in _pages(db, "messages_fts_data"):
        _overwrite_page(db, page)
    original = db.read_bytes()

    with ConversationStore.open(db) as store:
        assert store.recovered_from is not None
        assert store.recovered_from.read_bytes() == original  # the damaged file, as it was
        assert any("42 messages" in notice and "3 conversations" in notice
                   for notice in store.notices), store.notices  # fmt: skip
        for conversation, expected in texts.items():
            assert [m.content for m in store.current_path(conversation)] == expected
            assert store.current_path(conversation)[-1].token_ids == [
                int(n) for n in expected[-1].split()[1].split("-")
            ]
        hits = store.search("pelican", limit=100)
        assert len([hit for hit in hits if hit.message_id is not None]) == 42
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_damaged_message_page_keeps_the_readable_rest(db: Path) -> None:
    _fill(db, conversations=1, turns=60, size=400)
    pages = _pages(db, "messages")
    assert len(pages) > 5
    _overwrite_page(db, pages[len(pages) // 2])

    with ConversationStore.open(db) as store:
        (conversation,) = store.list_conversations()
        kept = store._conn.execute(
            "SELECT count(*) FROM messages WHERE content LIKE '%pelican%'"
        ).fetchone()[0]
        assert 60 < kept < 120
        assert any(f"{kept} messages" in notice for notice in store.notices), store.notices
        path = store.current_path(conversation.id)
        assert path[-1].content.startswith("assistant 0-59 ")  # the latest turn is shown
        assert path[0].content.startswith("user 0-0 ")  # in one piece, across the gap
        assert [m.role for m in path] == ["user", "assistant"] * (len(path) // 2)
        assert store.search("pelican", limit=200)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def test_unreadable_file_says_nothing_was_recovered(db: Path) -> None:
    db.parent.mkdir(parents=True)
    db.write_bytes(b"not a database at all" * 300)
    with ConversationStore.open(db) as store:
        assert store.recovered_from is not None
        assert any("could be recovered" in n and "nothing" in n.lower() for n in store.notices)
        assert store.list_conversations() == []


_WRITER = """
import sys
from app.conversations import ConversationStore
store = ConversationStore.open(sys.argv[1])
c = store.create_conversation().id
u = store.add_message(c, None, "user", "first question")
store.add_message(c, u.id, "assistant", "first answer")
print(c, flush=True)
store.add_message(c, store.get_conversation(c).current_leaf_id, "user", "second question")
print("written", flush=True)
sys.stdin.readline()
"""


def _killed_writer(db: Path) -> str:
    """A process that wrote two turns into `db`'s WAL and was killed by SIGKILL; its
    conversation id."""
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_WRITER), str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        conversation = writer.stdout.readline().strip()
        assert writer.stdout.readline().strip() == "written"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stdin.close()
        writer.stdout.close()
    return conversation


def test_damaged_wal_is_copied_before_sqlite_drops_it(db: Path) -> None:
    """A killed process leaves its turns in the WAL; a flipped byte in the last frame makes
    SQLite ignore that commit, so the log is copied first and the user is told where."""
    conversation = _killed_writer(db)
    wal = Path(f"{db}-wal")
    damaged = bytearray(wal.read_bytes())
    damaged[-100] ^= 0xFF  # inside the last frame's page: the last commit fails its checksum
    wal.write_bytes(bytes(damaged))

    with ConversationStore.open(db) as store:
        contents = [m.content for m in store.current_path(conversation)]
        notices = list(store.notices)
    assert contents[:2] == ["first question", "first answer"]
    copies = list(db.parent.glob("conversations.db-wal.damaged-*"))
    assert [c.read_bytes() for c in copies] == [bytes(damaged)]
    assert any(str(copies[0]) in notice for notice in notices), notices


def test_intact_wal_is_not_copied(db: Path) -> None:
    conversation = _killed_writer(db)
    with ConversationStore.open(db) as store:
        assert store.current_path(conversation)[-1].content == "second question"
        assert store.notices == []
    assert list(db.parent.glob("*damaged*")) == []
