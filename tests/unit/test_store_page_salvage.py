"""A database SQL can no longer open: its rows are read from its pages, and what was lost
leaves no hole the app trips on.

Real files made by the real store (40 conversations, 400 messages, replies with token ids
long enough to overflow their pages), damaged the way disks and crashes damage them: the
100-byte header zeroed, bytes of page 1 flipped, the file cut to half its length. What
recovery must bring back is what is still there: the user messages whose text a byte search
finds in the damaged file.
"""

from __future__ import annotations

import random
import re
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.conversations import ConversationStore, rows
from app.conversations.forest import LOST_MESSAGE
from tests.unit.test_store_salvage import _killed_writer, _overwrite_page, _pages


@dataclass(frozen=True)
class Made:
    path: Path
    replies: dict[str, list[int]]  # a reply's text -> its token ids


def _marker(conversation: int, turn: int) -> bytes:
    return f"kestrel{conversation:02d}x{turn}q".encode()


def _build(path: Path, conversations: int = 40, turns: int = 5) -> Made:
    """Conversations of question/answer turns through the real store. Each question's own
    marker comes after the 60 characters a title takes, so a byte search finds the message,
    not its conversation's title; replies carry 50 to 1,500 token ids (up to 6 kB: past
    what a 4 kB page holds, so their records overflow)."""
    rng = random.Random(33)
    replies = {}
    with ConversationStore.open(path) as store:
        for c in range(conversations):
            conversation = store.create_conversation().id
            parent = None
            for t in range(turns):
                question = f"question {c} {t} " + "why " * 16 + _marker(c, t).decode()
                parent = store.add_message(conversation, parent, "user", question).id
                tokens = [rng.randrange(50_000) for _ in range(rng.randrange(50, 1500))]
                reply = f"answer {c} {t} " + " ".join(f"w{token % 997}" for token in tokens)
                replies[reply] = tokens
                parent = store.add_message(
                    conversation,
                    parent,
                    "assistant",
                    reply,
                    token_ids=tokens,
                    tokens_fingerprint="fp",
                ).id
    return Made(path, replies)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    return _build(tmp_path_factory.mktemp("made") / "conversations.db")


@pytest.fixture
def db(made: Made, tmp_path: Path) -> Path:
    copy = tmp_path / "data" / "conversations.db"
    copy.parent.mkdir(mode=0o700)
    shutil.copyfile(made.path, copy)
    return copy


def _zero_header(data: bytearray) -> None:
    data[:100] = bytes(100)


def _flip_page_one(data: bytearray) -> None:
    for at in range(0, 4096, 37):
        data[at] ^= 0xFF


def _cut_in_half(data: bytearray) -> None:
    del data[len(data) // 2 :]


@pytest.mark.parametrize("damage", [_zero_header, _flip_page_one, _cut_in_half])
def test_pages_give_back_what_a_byte_search_finds(
    made: Made, db: Path, damage: Callable[[bytearray], None]
) -> None:
    data = bytearray(db.read_bytes())
    damage(data)
    db.write_bytes(bytes(data))
    present = {_marker(c, t) for c in range(40) for t in range(5) if _marker(c, t) in data}
    assert len(present) >= 100

    with ConversationStore.open(db) as store:
        assert store.recovered_from is not None
        assert store.recovered_from.read_bytes() == data  # kept aside, as it was
        conn = store._conn
        questions = [row[0] for row in conn.execute("SELECT content FROM messages")]
        back = {m.encode() for q in questions for m in re.findall(r"kestrel\d+x\dq", q)}
        assert len(back & present) >= 0.95 * len(present), (len(back & present), len(present))
        messages = conn.execute(
            "SELECT count(*) FROM messages WHERE content != ? AND finish_reason IS NOT 'lost'",
            (LOST_MESSAGE,),
        ).fetchone()[0]
        conversations = len(store.list_conversations())
        (notice,) = store.notices
        assert f"{conversations} conversations and {messages} messages were recovered" in notice
        for content, blob in conn.execute(
            "SELECT content, token_ids FROM messages WHERE token_ids IS NOT NULL"
        ):
            assert rows.unpack(blob) == made.replies[content]  # the reply's own ids
        kept_tokens = conn.execute(
            "SELECT count(*) FROM messages WHERE token_ids IS NOT NULL"
        ).fetchone()[0]
        assert (
            kept_tokens
            >= 0.9
            * conn.execute(
                "SELECT count(*) FROM messages WHERE role = 'assistant' AND content != ''"
            ).fetchone()[0]
        )
        for conversation in store.list_conversations():
            path = store.current_path(conversation.id)
            roles = [message.role for message in path]
            assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"] * (len(roles) % 2)
        assert store.search(min(back).decode())
    with sqlite3.connect(db) as check:
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert check.execute("PRAGMA foreign_key_check").fetchall() == []


def test_a_purged_conversation_stays_gone_when_the_header_is(db: Path) -> None:
    """Pages a delete freed keep their old rows until reused; with the header (and its list
    of free pages) gone, only the pages the tables' trees still reach are read."""
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute("PRAGMA secure_delete = OFF")  # as SQLite is mostly built: freed, not wiped
        conn.execute("PRAGMA foreign_keys = ON")
        purged = [
            row[0] for row in conn.execute("SELECT id FROM conversations ORDER BY rowid LIMIT 12")
        ]
        conn.executemany("DELETE FROM conversations WHERE id = ?", [(c,) for c in purged])
    conn.close()
    data = bytearray(db.read_bytes())
    _zero_header(data)
    db.write_bytes(bytes(data))
    freed = [_marker(c, t) for c in range(12) for t in range(5) if _marker(c, t) in data]
    assert len(freed) >= 20  # the purged questions, still in the file's bytes

    with ConversationStore.open(db) as store:
        kept = {c.id for c in store.list_conversations()}
        assert len(kept) == 28 and not kept & set(purged)
        assert store._conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 280


def test_turns_only_in_the_log_are_read_from_it(db: Path) -> None:
    """A process killed mid-session leaves its last turns in the write-ahead log: pages
    read from the file alone would miss them."""
    conversation = _killed_writer(db)
    data = bytearray(db.read_bytes())
    _zero_header(data)
    db.write_bytes(bytes(data))

    with ConversationStore.open(db) as store:
        assert [m.content for m in store.current_path(conversation)] == [
            "first question",
            "first answer",
            "second question",
        ]
        assert len(store.list_conversations()) == 41


def _mangle(db: Path, edit: Callable[[sqlite3.Connection, dict[str, list[str]]], None]) -> None:
    """Apply `edit` to the rows (ids of each conversation's messages, oldest first), then
    damage the search index so that the next open salvages the rows as they now are."""
    with sqlite3.connect(db, isolation_level=None) as conn:
        ids: dict[str, list[str]] = {}
        for conversation, message in conn.execute(
            "SELECT conversation_id, id FROM messages ORDER BY seq"
        ):
            ids.setdefault(conversation, []).append(message)
        edit(conn, ids)
    conn.close()
    for page in _pages(db, "messages_fts_data"):
        _overwrite_page(db, page)


def _parents(store: ConversationStore, leaf: str) -> list[str]:
    """Roles from the root down to `leaf`, by parent links, stopping at a circle."""
    by_id = {
        row[0]: row[1:] for row in store._conn.execute("SELECT id, parent_id, role FROM messages")
    }
    chain, at = [], leaf
    while at is not None and len(chain) <= len(by_id):
        parent, role = by_id[at]
        chain.append(role)
        at = parent
    return chain[::-1]


def test_lost_parents_leave_one_alternating_conversation(db: Path) -> None:
    lost: dict[str, str] = {}

    def edit(conn: sqlite3.Connection, ids: dict[str, list[str]]) -> None:
        first, second, third = list(ids)[:3]
        lost["reply"], lost["question"], lost["circle"] = first, second, third
        conn.execute("DELETE FROM messages WHERE id = ?", (ids[first][3],))  # a reply
        conn.execute("DELETE FROM messages WHERE id = ?", (ids[second][2],))  # a question
        conn.execute(  # the root now answers its own reply: no root left
            "UPDATE messages SET parent_id = ? WHERE id = ?", (ids[third][1], ids[third][0])
        )

    _mangle(db, edit)
    with ConversationStore.open(db) as store:
        assert any("a note in the conversation says so" in n for n in store.notices)
        for conversation, count in (("reply", 10), ("question", 10), ("circle", 10)):
            leaf = store.get_conversation(lost[conversation]).current_leaf_id
            roles = _parents(store, leaf)
            assert roles == ["user", "assistant"] * 5, (conversation, roles)
            path = store.current_path(lost[conversation])
            assert len(path) == count
            assert path[-1].content.startswith("answer ")  # the newest reply still shown
        gap = store.current_path(lost["reply"])[3]
        assert (gap.role, gap.content, gap.status) == ("assistant", "", "interrupted")
        note = store.current_path(lost["question"])[2]
        assert (note.role, note.content) == ("user", LOST_MESSAGE)


def test_token_ids_that_cannot_be_the_replys_are_dropped(made: Made, db: Path) -> None:
    """Ids read back from damaged bytes would feed the model a reply it never wrote; the
    text stays and is tokenized again."""
    replies: list[str] = []

    def edit(conn: sqlite3.Connection, ids: dict[str, list[str]]) -> None:
        replies.extend(
            message for conversation in list(ids)[:3] for message in ids[conversation][1:2]
        )
        for message, blob in zip(replies, (b"text, not ids", b"1234567", b""), strict=True):
            conn.execute("UPDATE messages SET token_ids = ? WHERE id = ?", (blob, message))

    _mangle(db, edit)
    with ConversationStore.open(db) as store:
        assert store.recovered_from is not None
        for message in replies:
            kept = store.get_message(message)
            assert kept.content.startswith("answer ")
            assert (kept.token_ids, kept.tokens_fingerprint) == (None, None)
        sound = store._conn.execute(
            "SELECT content, token_ids FROM messages WHERE token_ids IS NOT NULL"
        ).fetchall()
        assert len(sound) == 200 - 3
        assert all(rows.unpack(blob) == made.replies[content] for content, blob in sound)
