"""API conversations in the store: schema v6 on a populated v5 file, and served turns kept
as one conversation per history (continued branches, new branches, new conversations)."""

from __future__ import annotations

import hashlib
import io
import json
import sqlite3
from pathlib import Path

import pytest
from PIL import Image

from app.conversations import ConversationStore, StoreError, ToolCall, schema
from app.conversations.database import connect
from app.conversations.served import ServedMessage, ServedTurn, keep

FP = "fingerprint-a"
SYSTEM = "You are a weather assistant.\n\n# Tools\n..."
CALL = ToolCall("call_1", "get_weather", '{"city": "Paris"}')


@pytest.fixture
def v5(tmp_path: Path) -> Path:
    """A database made by schema v5, with what v5 holds: plain, pinned, deleted and imported
    conversations, a tool call and its result, token ids and searchable text."""
    path = tmp_path / "conversations.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    schema.migrate(conn, target=5)
    conn.execute("BEGIN")
    for c in range(4):
        conn.execute(
            "INSERT INTO conversations (id, title, created_at, updated_at, pinned, deleted_at,"
            " system_prompt, sampling, current_leaf_id, draft, model, imported_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, '{}', NULL, '', 'SmolLM2', ?)",
            (
                f"c{c}",
                f"Conversation {c} about lanterns",
                100.0 + c,
                200.0 + c,
                int(c == 1),
                300.0 if c == 2 else None,
                SYSTEM if c == 0 else None,
                400.0 if c == 3 else None,
            ),
        )
        rows = [
            ("user", "Weather in Paris?", None, None, None, None),
            ("assistant", "", bytes(range(8)), json.dumps([CALL.record()]), None, None),
            ("tool", "18 C", None, None, "call_1", "get_weather"),
            ("assistant", "It is 18 C, lantern weather.", bytes(range(4)), None, None, None),
        ]
        parent = None
        for m, (role, content, ids, calls, call_id, name) in enumerate(rows):
            values = (c * 10 + m, f"m{c}{m}", f"c{c}", parent, role, content, ids, FP, 1.0, 1.0)
            conn.execute(
                "INSERT INTO messages (seq, id, conversation_id, parent_id, role, content,"
                " token_ids, tokens_fingerprint, status, created_at, updated_at, tool_calls,"
                " tool_call_id, tool_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'complete', ?, ?, ?,"
                " ?, ?)",
                (*values, calls, call_id, name),
            )
            parent = f"m{c}{m}"
        conn.execute("UPDATE conversations SET current_leaf_id = ? WHERE id = ?", (parent, f"c{c}"))
    conn.execute("COMMIT")
    conn.close()
    return path


def test_v6_adds_served_columns_to_a_v5_file_and_keeps_every_row(v5: Path) -> None:
    before = sqlite3.connect(v5)
    conversations = before.execute("SELECT * FROM conversations ORDER BY id").fetchall()
    messages = before.execute("SELECT * FROM messages ORDER BY seq").fetchall()
    found = before.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'lantern'")
    hits = found.fetchall()
    before.close()
    assert schema.version(sqlite3.connect(v5)) == 5 and len(messages) == 16 and hits

    conn = connect(v5, busy_timeout=3.0)  # what every open does: check, WAL, migrate
    try:
        assert schema.version(conn) == schema.LATEST == 6
        after = conn.execute("SELECT * FROM conversations ORDER BY id").fetchall()
        assert [row[: len(conversations[0])] for row in after] == conversations
        assert [row[len(conversations[0]) :] for row in after] == [(None, None)] * 4
        assert conn.execute("SELECT * FROM messages ORDER BY seq").fetchall() == messages
        again = conn.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'lantern'")
        assert again.fetchall() == hits
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(conversations)")}
        assert "conversations_served" in indexes
    finally:
        conn.close()

    with ConversationStore.open(v5) as store:
        listed = store.list_conversations()
        assert [c.id for c in listed] == ["c1", "c3", "c0"]  # pinned first; c2 is deleted
        assert all(c.served_at is None and c.served_to is None for c in listed)
        assert store.get_conversation("c3").imported_at == 400.0
        path = store.current_path("c0")
        assert path[1].tool_calls == (CALL,) and path[2].tool_name == "get_weather"
        # a window conversation is never taken for an API one, however alike
        assert keep(store, _turn(_history(), "More?", (9,))).new


def test_a_failed_v6_leaves_the_v5_file_as_it_was(
    v5: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    number, script = schema.MIGRATIONS[5]
    broken = (*schema.MIGRATIONS[:5], (number, script + "\nINSERT INTO nowhere VALUES (1);\n"))
    monkeypatch.setattr(schema, "MIGRATIONS", broken)
    conn = sqlite3.connect(v5, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError):
        schema.migrate(conn)
    assert schema.version(conn) == 5
    columns = {row[1] for row in conn.execute("PRAGMA table_info(conversations)")}
    assert "served_at" not in columns
    conn.close()


def _history() -> tuple[ServedMessage, ...]:
    """A first round of a tool loop: the question, the call (exact ids), its result."""
    return (
        ServedMessage("user", "Weather in Paris?"),
        ServedMessage("assistant", "", (CALL,), token_ids=(11, 12), tokens_fingerprint=FP),
        ServedMessage("tool", "18 C", tool_call_id="call_1"),
    )


def _turn(
    history: tuple[ServedMessage, ...],
    text: str,
    tokens: tuple[int, ...],
    calls: tuple[ToolCall, ...] = (),
    client: str | None = "OpenAI/Python 1.0",
) -> ServedTurn:
    reply = ServedMessage("assistant", text, calls, token_ids=tokens, tokens_fingerprint=FP)
    return ServedTurn(SYSTEM, history, reply, "SmolLM2", client, "stop", {"prompt_tokens": 9})


@pytest.fixture
def store(tmp_path: Path):
    with ConversationStore.open(tmp_path / "c.db") as opened:
        yield opened


def test_a_tool_loop_is_one_conversation(store: ConversationStore) -> None:
    first = keep(store, _turn(_history()[:1], "", (11, 12), (CALL,)))
    assert first.new
    conversation = store.get_conversation(first.conversation_id)
    assert conversation.served_at is not None and conversation.served_to == "OpenAI/Python 1.0"
    assert conversation.title == "Weather in Paris?" and conversation.system_prompt == SYSTEM
    assert conversation.model == "SmolLM2"

    # the client sends the call back re-serialized: its exact ids still match
    resent = ToolCall("call_1", "get_weather", '{ "city" :"Paris" }')
    history = (
        _history()[0],
        ServedMessage("assistant", "", (resent,), token_ids=(11, 12), tokens_fingerprint=FP),
        _history()[2],
    )
    second = keep(store, _turn(history, "It is 18 C.", (21, 22, 23)))
    assert (second.conversation_id, second.new) == (first.conversation_id, False)
    path = store.current_path(first.conversation_id)
    assert [m.role for m in path] == ["user", "assistant", "tool", "assistant"]
    assert path[1].tool_calls == (CALL,) and path[1].token_ids == [11, 12]
    assert (path[2].tool_call_id, path[2].tool_name) == ("call_1", "get_weather")
    assert path[3].token_ids == [21, 22, 23] and path[3].tokens_fingerprint == FP
    assert path[3].finish_reason == "stop" and path[3].stats == {"prompt_tokens": 9}
    assert path[3].id == second.reply_id
    assert len(store.list_conversations()) == 1


def test_calls_without_ids_match_by_name_and_parsed_arguments(store: ConversationStore) -> None:
    first = keep(store, _turn(_history()[:1], "", (11, 12), (CALL,)))
    resent = ToolCall("x", "get_weather", '{"city":"Paris"}')  # sent back without the ids
    history = (_history()[0], ServedMessage("assistant", "", (resent,)), _history()[2])
    assert not keep(store, _turn(history, "Sunny.", (30,))).new
    other = ToolCall("x", "get_weather", '{"city":"Oslo"}')
    history = (_history()[0], ServedMessage("assistant", "", (other,)), _history()[2])
    # Oslo leaves the branch before any reply of it: another conversation that asks the same
    oslo = keep(store, _turn(history, "Cold.", (31,)))
    assert oslo.new and oslo.conversation_id != first.conversation_id
    path = store.current_path(first.conversation_id)
    assert [m.content for m in path] == ["Weather in Paris?", "", "18 C", "Sunny."]


def test_what_continues_no_reply_opens_a_new_conversation(store: ConversationStore) -> None:
    a = keep(store, _turn(_history()[:1], "", (11, 12), (CALL,)))
    # the same first question from another client: no reply of the stored one in its history
    b = keep(store, _turn(_history()[:1], "Let me look.", (40,)))
    assert a.new and b.new and a.conversation_id != b.conversation_id
    # another system prompt is another conversation, even with the same messages
    other = ServedTurn("Be brief.", _history(), _turn((), "x", (1,)).reply)
    assert keep(store, other).new
    # a deleted conversation is not continued
    store.delete(a.conversation_id)
    assert keep(store, _turn(_history(), "Sunny.", (50,))).new


def test_a_retry_is_a_regeneration_beside_the_reply(store: ConversationStore) -> None:
    first = keep(store, _turn(_history()[:1], "", (11, 12), (CALL,)))
    keep(store, _turn(_history(), "It is 18 C.", (21,)))
    again = keep(store, _turn(_history(), "Sunny, 18 C.", (22,)))
    assert again.conversation_id == first.conversation_id
    alternatives, index = store.siblings(again.reply_id)
    assert [m.content for m in alternatives] == ["It is 18 C.", "Sunny, 18 C."] and index == 1
    # the deepest branch wins: a follow-up after the second answer goes under it
    follow = (*_history(), ServedMessage("assistant", "Sunny, 18 C.", token_ids=(22,)))
    follow += (ServedMessage("user", "And tomorrow?"),)
    deeper = keep(store, _turn(follow, "Rain.", (60,)))
    assert store.get_message(deeper.reply_id).parent_id is not None
    assert store.path_to(deeper.reply_id)[3].id == again.reply_id


def test_a_served_picture_is_kept_as_an_image_attachment_and_matched_by_its_hash(
    store: ConversationStore, stoke_home: Path
) -> None:
    out = io.BytesIO()
    Image.new("RGB", (20, 10), (9, 99, 9)).save(out, "PNG")
    picture = out.getvalue()
    asked = ServedMessage("user", "What is this?", images=(picture,))
    first = keep(store, _turn((asked,), "A green field.", (70,)))
    [user, _] = store.current_path(first.conversation_id)
    [record] = user.attachments
    assert user.content == "What is this?" and record["kind"] == "image"
    assert record["digest"] == hashlib.sha256(picture).hexdigest()
    assert (record["name"], record["width"], record["height"]) == ("Image 1", 20, 10)
    # the follow-up resends the picture: it continues the conversation; another picture
    # under the same words does not
    said = ServedMessage("assistant", "A green field.", token_ids=(70,), tokens_fingerprint=FP)
    follow = (asked, said, ServedMessage("user", "Is it spring?"))
    assert not keep(store, _turn(follow, "Yes.", (71,))).new
    other = ServedMessage("user", "What is this?", images=(picture + b"\0",))
    assert keep(store, _turn((other, *follow[1:]), "Yes.", (72,))).new


def test_a_read_only_store_refuses_in_words(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    ConversationStore.open(path).close()
    with ConversationStore.open(path) as store:
        store._conn.execute("PRAGMA query_only = ON")  # as a read-only file answers writes
        with pytest.raises(StoreError) as refused:
            keep(store, _turn(_history()[:1], "Hi", (1,)))
    assert "conversation database" in str(refused.value)
