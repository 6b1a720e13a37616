"""Tool calls in the store: schema v5's rebuild of a real v4 file, and tool messages kept."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from app.conversations import ConversationStore, ToolCall, schema
from app.conversations.database import connect

V4_COLUMNS = (
    "seq, id, conversation_id, parent_id, role, content, token_ids, tokens_fingerprint, status,"
    " finish_reason, stats, created_at, updated_at, writer, attachments"
)
WORDS = ("kettle", "lantern", "orchard", "quartz", "saffron", "tundra", "velvet", "zephyr")


@pytest.fixture
def v4(tmp_path: Path) -> Path:
    """A database made by schema v4, holding what v4 could hold: pinned, deleted, imported
    and drafted conversations, branches, token ids, stats, attachments, a streaming reply
    with its writer, and text the search index must keep finding."""
    path = tmp_path / "conversations.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    schema.migrate(conn, target=4)
    assert schema.version(conn) == 4
    conn.execute("BEGIN")
    for c in range(6):
        conn.execute(
            "INSERT INTO conversations (id, title, created_at, updated_at, pinned, deleted_at,"
            " system_prompt, sampling, current_leaf_id, draft, model, writer, imported_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
            (
                f"c{c:07x}",
                None if c == 5 else f"Conversation {c} about {WORDS[c]}",
                100.0 + c,
                200.0 + c,
                int(c == 1),
                300.0 if c == 2 else None,
                "Be brief." if c % 2 else None,
                json.dumps({"temperature": 0.1 * c, "seed": c}),
                f"draft {c}" if c == 3 else "",
                "SmolLM2-135M-Instruct.Q4_1" if c != 4 else None,
                "lease-gone" if c == 0 else None,
                400.0 if c == 4 else None,
            ),
        )
        parent = None
        for m in range(40):
            role = "user" if m % 2 == 0 else "assistant"
            seq = c * 100 + m + 1
            attachments = (
                json.dumps([{"name": "notes.md", "kind": "text", "tokens": 3, "text": "hi"}])
                if role == "user" and m % 10 == 0
                else None
            )
            conn.execute(
                f"INSERT INTO messages ({V4_COLUMNS}) VALUES"
                " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    seq,
                    f"m{seq}",
                    f"c{c:07x}",
                    parent,
                    role,
                    f"{WORDS[m % len(WORDS)]} message {m} ünïcode ✓ " + "x" * (m * 40),
                    None if role == "user" else bytes(range(m % 7 * 4)),
                    None if role == "user" else "fingerprint",
                    "streaming" if (c, m) == (0, 39) else "complete",
                    None if role == "user" else "stop",
                    None if role == "user" else json.dumps({"decode_tok_s": 100.0 + m}),
                    1000.0 + seq,
                    1000.5 + seq,
                    "lease-gone" if (c, m) == (0, 39) else None,
                    attachments,
                ),
            )
            if m == 20:  # a regeneration beside this reply: a branch the path does not take
                conn.execute(
                    f"INSERT INTO messages ({V4_COLUMNS}) VALUES"
                    " (?, ?, ?, ?, 'assistant', 'a branch not taken', NULL, NULL,"
                    " 'interrupted', 'interrupted', NULL, ?, ?, NULL, NULL)",
                    (c * 100 + 90, f"b{c}", f"c{c:07x}", parent, 2000.0, 2000.0),
                )
            parent = f"m{seq}"
        conn.execute(
            "UPDATE conversations SET current_leaf_id = ? WHERE id = ?", (parent, f"c{c:07x}")
        )
    conn.execute("COMMIT")
    conn.close()
    return path


def _rows(conn: sqlite3.Connection, table: str, columns: str) -> list[tuple]:
    return conn.execute(f"SELECT {columns} FROM {table} ORDER BY rowid").fetchall()


def _search(conn: sqlite3.Connection, word: str) -> list[int]:
    return [
        row[0]
        for row in conn.execute(
            "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? ORDER BY rowid", (word,)
        )
    ]


def _objects(conn: sqlite3.Connection) -> dict[str, str]:
    """The indexes and triggers on messages, by name, their SQL with spacing evened out."""
    return {
        name: re.sub(r"\s+", " ", sql)
        for name, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE tbl_name = 'messages'"
            " AND type IN ('index', 'trigger') AND sql IS NOT NULL"
        )
    }


def test_v5_rebuilds_a_v4_file_and_every_row_survives(v4: Path) -> None:
    before = sqlite3.connect(v4)
    conversations = _rows(before, "conversations", "*")
    messages = _rows(before, "messages", V4_COLUMNS)
    found = {word: _search(before, word) for word in WORDS}
    objects = _objects(before)
    before.close()
    assert len(messages) == 6 * 41 and all(found.values())

    conn = connect(v4, busy_timeout=3.0)  # what every open does: check, WAL, migrate
    try:
        assert schema.version(conn) == schema.LATEST >= 5
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        width = len(conversations[0])  # later versions add columns after these
        assert [row[:width] for row in _rows(conn, "conversations", "*")] == conversations
        assert _rows(conn, "messages", V4_COLUMNS) == messages
        assert _rows(conn, "messages", "tool_calls, tool_call_id, tool_name") == [
            (None, None, None)
        ] * len(messages)
        assert {word: _search(conn, word) for word in WORDS} == found
        assert _objects(conn) == objects  # the same indexes and search triggers, as they were
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        references = {row[2] for row in conn.execute("PRAGMA foreign_key_list(messages)")}
        assert references == {"messages", "conversations"}
    finally:
        conn.close()

    with ConversationStore.open(v4) as store:
        path = store.current_path("c0000000")
        assert len(path) == 40
        assert path[-1].status == "interrupted"  # its writer is gone
        assert path[1].token_ids == [0x03020100]
        assert path[-1].token_ids == [0x03020100, 0x07060504, 0x0B0A0908, 0x0F0E0D0C]
        assert path[0].attachments == [
            {"name": "notes.md", "kind": "text", "tokens": 3, "text": "hi"}
        ]
        assert [m.content for m in store.children("m120", "c0000001")] == [
            messages[61][5],
            "a branch not taken",
        ]
        store.purge("c0000003")  # the cascades still reach the rebuilt table
        assert store._conn.execute(
            "SELECT count(*) FROM messages WHERE conversation_id = 'c0000003'"
        ).fetchone() == (0,)
        assert all(hit.conversation_id != "c0000003" for hit in store.search("kettle"))


def test_a_failed_v5_leaves_the_v4_file_as_it_was(
    v4: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = sqlite3.connect(v4)
    messages = _rows(before, "messages", V4_COLUMNS)
    before.close()
    number, script = schema.MIGRATIONS[4]
    broken = (*schema.MIGRATIONS[:4], (number, script + "\nINSERT INTO nowhere VALUES (1);\n"))
    monkeypatch.setattr(schema, "MIGRATIONS", broken)
    conn = sqlite3.connect(v4, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError):
        schema.migrate(conn)
    assert schema.version(conn) == 4
    assert _rows(conn, "messages", V4_COLUMNS) == messages
    assert conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE name = 'messages_v5'"
    ).fetchone() == (0,)
    conn.close()


def test_tool_calls_and_results_are_kept(tmp_path: Path) -> None:
    with ConversationStore.open(tmp_path / "c.db") as store:
        cid = store.create_conversation().id
        question = store.add_message(cid, None, "user", "Weather in Paris and Oslo?")
        calls = (
            ToolCall("call_1", "get_weather", '{"city": "Paris"}'),
            ToolCall("call_2", "get_weather", '{"city":"Oslo","unit":"c"}'),
        )
        asked = store.add_message(
            cid, question.id, "assistant", "", tool_calls=calls, token_ids=[5, 6]
        )
        paris = store.add_message(
            cid, asked.id, "tool", "18 C, sunny", tool_call_id="call_1", tool_name="get_weather"
        )
        oslo = store.add_message(
            cid, paris.id, "tool", "3 C, snow", tool_call_id="call_2", tool_name="get_weather"
        )
        store.add_message(cid, oslo.id, "assistant", "Paris is warmer.")

        path = store.current_path(cid)
        assert [m.role for m in path] == ["user", "assistant", "tool", "tool", "assistant"]
        assert path[1].tool_calls == calls
        assert path[1].token_ids == [5, 6]
        assert [(m.tool_call_id, m.tool_name, m.content) for m in path[2:4]] == [
            ("call_1", "get_weather", "18 C, sunny"),
            ("call_2", "get_weather", "3 C, snow"),
        ]
        assert path[4].tool_calls == ()
        assert [hit.message_id for hit in store.search("snow")] == [oslo.id]


@pytest.mark.parametrize(
    ("role", "fields"),
    [
        ("user", {"tool_calls": (ToolCall("c", "f", "{}"),)}),
        ("tool", {"tool_calls": (ToolCall("c", "f", "{}"),)}),
        ("assistant", {"tool_call_id": "c"}),
        ("user", {"tool_name": "f"}),
    ],
)
def test_tool_fields_belong_to_their_roles(tmp_path: Path, role: str, fields: dict) -> None:
    with ConversationStore.open(tmp_path / "c.db") as store:
        cid = store.create_conversation().id
        with pytest.raises(ValueError, match=r"only an? (assistant|tool) message"):
            store.add_message(cid, None, role, "text", **fields)
        assert store.current_path(cid) == []
