"""The conversation store against real SQLite files."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.conversations import (
    ConversationStore,
    NewerSchemaError,
    StoreError,
    StoreLockedError,
    UnknownConversationError,
    UnknownMessageError,
    schema,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "conversations.db"


@pytest.fixture
def store(db: Path):
    with ConversationStore.open(db) as opened:
        yield opened


def test_open_configures_sqlite(store: ConversationStore) -> None:
    conn = store._conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert schema.version(conn) == schema.LATEST
    assert store.recovered_from is None


def test_default_path_honours_stoke_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKE_HOME", str(tmp_path))
    with ConversationStore.open() as store:
        assert store.path == tmp_path / "data" / "conversations.db"
    assert store.path.exists()


def test_conversation_crud(store: ConversationStore) -> None:
    sampling = {"temperature": 0.7, "top_p": 0.95, "seed": 42}
    created = store.create_conversation("Plans", "Be brief.", sampling, "smollm2.gguf")
    got = store.get_conversation(created.id)
    assert got == created
    assert (got.title, got.system_prompt, got.sampling, got.model) == (
        "Plans",
        "Be brief.",
        sampling,
        "smollm2.gguf",
    )
    assert (got.pinned, got.deleted_at, got.draft, got.current_leaf_id) == (False, None, "", None)

    store.rename(created.id, "Renamed")
    store.set_system_prompt(created.id, None)
    store.set_sampling(created.id, {"min_p": 0.05})
    store.set_draft(created.id, "half a thou")
    store.set_model(created.id, None)
    store.set_pinned(created.id, True)
    got = store.get_conversation(created.id)
    assert (got.title, got.system_prompt, got.sampling, got.model, got.pinned) == (
        "Renamed",
        None,
        {"min_p": 0.05},
        None,
        True,
    )
    assert store.get_draft(created.id) == "half a thou"


def test_list_order_and_most_recent(store: ConversationStore) -> None:
    old = store.create_conversation("old")
    pinned = store.create_conversation("pinned")
    new = store.create_conversation("new")
    store.set_pinned(pinned.id, True)
    store.add_message(old.id, None, "user", "bump")
    assert [c.title for c in store.list_conversations()] == ["pinned", "old", "new"]
    assert [c.title for c in store.list_conversations(limit=2)] == ["pinned", "old"]
    assert store.most_recent().id == old.id
    store.delete(old.id)
    assert store.most_recent().id == new.id


def test_most_recent_of_empty_store(store: ConversationStore) -> None:
    assert store.most_recent() is None
    assert store.list_conversations() == []


def test_most_recent_empty_is_the_untouched_conversation(store: ConversationStore) -> None:
    assert store.most_recent_empty() is None
    talked = store.create_conversation()
    store.add_message(talked.id, None, "user", "hello")
    drafted = store.create_conversation()
    store.set_draft(drafted.id, "half a thought")
    assert store.most_recent_empty() is None  # one has a message, the other a draft
    untouched = store.create_conversation()
    assert store.most_recent_empty().id == untouched.id
    store.delete(untouched.id)
    assert store.most_recent_empty() is None


def test_id_prefix(store: ConversationStore) -> None:
    conversation = store.create_conversation("x")
    assert store.get_conversation(conversation.id[:4]).id == conversation.id
    assert store.get_conversation(conversation.id[:8].upper()).id == conversation.id
    with pytest.raises(UnknownConversationError):
        store.get_conversation(conversation.id[:3])


def test_ambiguous_prefix(store: ConversationStore) -> None:
    first = store.create_conversation().id
    store.create_conversation()
    store._conn.execute("UPDATE conversations SET id = 'beef' || substr(id, 5)")
    with pytest.raises(UnknownConversationError, match="matches several conversations"):
        store.get_conversation("beef")
    assert store.get_conversation("beef" + first[4:]).id == "beef" + first[4:]


def test_unknown_ids_have_helpful_messages(store: ConversationStore) -> None:
    with pytest.raises(UnknownConversationError) as caught:
        store.get_conversation("abc")
    assert str(caught.value) == (
        "No conversation with id 'abc'. Run `stoke chat --list` to see them."
    )
    with pytest.raises(UnknownConversationError):
        store.rename("nope-nope", "x")
    with pytest.raises(UnknownMessageError, match="No message with id 'zzz'"):
        store.get_message("zzz")
    with pytest.raises(UnknownMessageError):
        store.update_message("zzz", content="x")
    with pytest.raises(UnknownMessageError):
        store.path_to("zzz")


def test_add_message_moves_leaf_and_titles(store: ConversationStore) -> None:
    conversation = store.create_conversation()
    long_line = "Why is the sky blue " * 10
    user = store.add_message(conversation.id, None, "user", f"\n  {long_line}\nsecond line")
    got = store.get_conversation(conversation.id)
    assert got.current_leaf_id == user.id
    assert got.updated_at >= conversation.updated_at
    assert got.title.startswith("Why is the sky blue")
    assert len(got.title) <= 60
    assert got.title.endswith("…")
    reply = store.add_message(conversation.id, user.id, "assistant", "Rayleigh.")
    store.add_message(conversation.id, reply.id, "user", "A different question")
    assert store.get_conversation(conversation.id).title == got.title
    assert store.get_message(reply.id) == reply


def test_titled_conversation_keeps_title(store: ConversationStore) -> None:
    conversation = store.create_conversation("Mine")
    store.add_message(conversation.id, None, "user", "hello")
    assert store.get_conversation(conversation.id).title == "Mine"


def test_add_message_validates(store: ConversationStore) -> None:
    one = store.create_conversation()
    two = store.create_conversation()
    foreign = store.add_message(two.id, None, "user", "hi")
    with pytest.raises(UnknownMessageError):
        store.add_message(one.id, foreign.id, "assistant", "x")
    with pytest.raises(ValueError, match="role"):
        store.add_message(one.id, None, "system", "x")
    with pytest.raises(ValueError, match="status"):
        store.add_message(one.id, None, "user", "x", status="done")
    with pytest.raises(UnknownConversationError):
        store.add_message("missing", None, "user", "x")
    assert store.children(None, one.id) == []


def test_branches(store: ConversationStore) -> None:
    c = store.create_conversation().id
    u1 = store.add_message(c, None, "user", "first question")
    a1 = store.add_message(c, u1.id, "assistant", "answer one")
    a1b = store.add_message(c, u1.id, "assistant", "answer one, regenerated")
    u2 = store.add_message(c, a1b.id, "user", "follow-up")
    a2 = store.add_message(c, u2.id, "assistant", "answer two")
    u2b = store.add_message(c, a1b.id, "user", "follow-up, edited")
    a2b = store.add_message(c, u2b.id, "assistant", "answer to the edit")

    assert [m.id for m in store.current_path(c)] == [u1.id, a1b.id, u2b.id, a2b.id]
    assert [m.id for m in store.children(None, c)] == [u1.id]
    assert [m.id for m in store.children(u1.id, c)] == [a1.id, a1b.id]
    siblings, index = store.siblings(u2b.id)
    assert ([m.id for m in siblings], index) == ([u2.id, u2b.id], 1)
    siblings, index = store.siblings(a1.id)
    assert ([m.id for m in siblings], index) == ([a1.id, a1b.id], 0)

    assert store.leaf_of(u2.id).id == a2.id
    assert store.leaf_of(a1.id).id == a1.id
    assert store.leaf_of(u1.id).id == a2b.id

    store.set_current_leaf(c, store.leaf_of(u2.id).id)
    assert [m.id for m in store.current_path(c)] == [u1.id, a1b.id, u2.id, a2.id]
    assert [m.id for m in store.path_to(a1.id)] == [u1.id, a1.id]

    other = store.create_conversation().id
    with pytest.raises(UnknownMessageError, match=other):
        store.set_current_leaf(other, a1.id)
    assert store.current_path(other) == []


def test_token_ids_round_trip(db: Path) -> None:
    ids = [0, 1, 255, 65535, 65536, 129_279, 2**31, 2**32 - 1]
    with ConversationStore.open(db) as store:
        c = store.create_conversation().id
        u = store.add_message(c, None, "user", "hi", token_ids=[1, 2])
        a = store.add_message(
            c, u.id, "assistant", "ok", token_ids=ids, tokens_fingerprint="fp1", stats={"tps": 9.5}
        )
        empty = store.add_message(c, a.id, "user", "", token_ids=[])
        blob = store._conn.execute("SELECT token_ids FROM messages WHERE id = ?", (a.id,))
        assert blob.fetchone()[0] == b"".join(i.to_bytes(4, "little") for i in ids)
    with ConversationStore.open(db) as store:
        got = store.get_message(a.id)
        assert got.token_ids == ids
        assert (got.tokens_fingerprint, got.stats) == ("fp1", {"tps": 9.5})
        assert store.get_message(empty.id).token_ids == []
        assert store.get_message(store.path_to(u.id)[0].id).token_ids == [1, 2]


def test_streaming_reply_survives_close_as_interrupted(db: Path) -> None:
    with ConversationStore.open(db) as store:
        c = store.create_conversation().id
        u = store.add_message(c, None, "user", "count")
        reply = store.add_message(c, u.id, "assistant", "", status="streaming")
        store.update_message(reply.id, content="one two", token_ids=[11, 70000])
        assert store.get_message(reply.id).status == "streaming"
    with ConversationStore.open(db) as store:
        got = store.get_message(reply.id)
        assert (got.status, got.finish_reason) == ("interrupted", "interrupted")
        assert (got.content, got.token_ids) == ("one two", [11, 70000])
        assert store.recover_interrupted() == 0
        assert [h.message_id for h in store.search("two")] == [reply.id]


def test_update_message_finishes_a_reply(store: ConversationStore) -> None:
    c = store.create_conversation().id
    u = store.add_message(c, None, "user", "q")
    reply = store.add_message(c, u.id, "assistant", "", status="streaming")
    store.update_message(reply.id, content="partial words")
    assert store.search("partial") == []
    store.update_message(
        reply.id, content="final words", status="complete", finish_reason="stop", stats={"n": 2}
    )
    got = store.get_message(reply.id)
    assert (got.content, got.status, got.finish_reason, got.stats) == (
        "final words",
        "complete",
        "stop",
        {"n": 2},
    )
    assert got.updated_at >= got.created_at
    assert [h.message_id for h in store.search("final")] == [reply.id]
    store.update_message(reply.id, content="edited text")
    assert store.search("final") == []
    assert len(store.search("edited")) == 1
    with pytest.raises(ValueError):
        store.update_message(reply.id, status="bogus")


_WRITER = """
import sys, time
from app.conversations import ConversationStore
store = ConversationStore.open(sys.argv[1])
c = store.create_conversation().id
u = store.add_message(c, None, "user", "tell me a story")
reply = store.add_message(c, u.id, "assistant", "", status="streaming")
print(c, u.id, reply.id, flush=True)
n = 0
while True:
    n += 1
    store.update_message(reply.id, content="word " * n, token_ids=list(range(70000, 70000 + n)))
    if n == 20:
        print("streaming", flush=True)
    time.sleep(0.002)
"""


def test_kill_9_while_streaming(db: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_WRITER), str(db)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        conversation_id, user_id, reply_id = writer.stdout.readline().split()
        assert writer.stdout.readline().strip() == "streaming"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL
    with ConversationStore.open(db) as store:
        path = store.current_path(conversation_id)
        assert [m.id for m in path] == [user_id, reply_id]
        assert path[0].content == "tell me a story"
        reply = path[1]
        assert reply.status == "interrupted"
        words = reply.content.count("word")
        assert words >= 20
        assert reply.token_ids == list(range(70000, 70000 + words))


def test_search(store: ConversationStore) -> None:
    recipes = store.create_conversation("Bread recipes")
    c = store.create_conversation().id
    u = store.add_message(c, None, "user", "How do I knead sourdough?")
    a = store.add_message(c, u.id, "assistant", "Fold the dough (gently) every 30 minutes.")

    hits = store.search("bread")
    assert [(h.conversation_id, h.message_id, h.snippet) for h in hits] == [
        (recipes.id, None, "«Bread» recipes")
    ]
    hits = store.search("sourd")
    assert {(h.message_id, h.title) for h in hits} >= {(u.id, "How do I knead sourdough?")}
    assert [h.message_id for h in store.search("fold gently")] == [a.id]
    assert "«dough»" in store.search("dough")[0].snippet
    assert store.search("knead", limit=1)[0].message_id is None  # the title hit comes first
    for hostile in ['"', "AND OR", "*", "foo(", "NEAR(a b)", "a:b", "-x", "^", "\x00", "", "'"]:
        store.search(hostile)
    assert [h.message_id for h in store.search('gently)" AND')] == []
    assert [h.message_id for h in store.search('"gently"')] == [a.id]


def test_search_skips_deleted_and_purged(store: ConversationStore) -> None:
    c = store.create_conversation("Zebra facts").id
    store.add_message(c, None, "user", "stripes")
    store.delete(c)
    assert store.search("zebra") == []
    assert store.search("stripes") == []
    store.restore(c)
    assert len(store.search("zebra stripes")) == 0
    assert len(store.search("stripes")) == 1
    assert len(store.search("zebra")) == 1
    store.purge(c)
    assert store.search("stripes") == []
    assert store._conn.execute("SELECT count(*) FROM titles_fts").fetchone()[0] == 0


def test_soft_delete_restore_purge(store: ConversationStore) -> None:
    c = store.create_conversation("doomed").id
    u = store.add_message(c, None, "user", "hello")
    store.add_message(c, u.id, "assistant", "hi")
    store.delete(c)
    assert store.list_conversations() == []
    deleted = store.list_conversations(include_deleted=True)
    assert [x.id for x in deleted] == [c]
    assert deleted[0].deleted_at is not None
    assert store.get_conversation(c).deleted_at is not None
    store.restore(c)
    assert [x.id for x in store.list_conversations()] == [c]
    store.purge(c)
    with pytest.raises(UnknownConversationError):
        store.get_conversation(c)
    with pytest.raises(UnknownMessageError):
        store.get_message(u.id)
    assert store._conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0


def test_migrates_v1_database_with_data(db: Path) -> None:
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db, isolation_level=None)
    schema.migrate(conn, target=1)
    assert schema.version(conn) == 1
    conn.execute(
        "INSERT INTO conversations (id, title, created_at, updated_at, sampling, current_leaf_id)"
        " VALUES ('c0ffee00', 'Old times', 1.0, 2.0, '{\"seed\": 7}', 'm2')"
    )
    conn.execute(
        "INSERT INTO messages (id, conversation_id, parent_id, role, content, token_ids, status,"
        " created_at, updated_at) VALUES"
        " ('m1', 'c0ffee00', NULL, 'user', 'ancient question', NULL, 'complete', 1.0, 1.0),"
        " ('m2', 'c0ffee00', 'm1', 'assistant', 'half an ans', x'01000000', 'streaming', 2, 2)"
    )
    conn.close()
    with ConversationStore.open(db) as store:
        assert schema.version(store._conn) == schema.LATEST
        conversation = store.get_conversation("c0ff")
        assert (conversation.title, conversation.sampling) == ("Old times", {"seed": 7})
        path = store.current_path("c0ffee00")
        assert [(m.content, m.status, m.token_ids) for m in path] == [
            ("ancient question", "complete", None),
            ("half an ans", "interrupted", [1]),
        ]
        assert [h.message_id for h in store.search("ancient")] == ["m1"]
        assert [h.message_id for h in store.search("ans")] == ["m2"]
        assert [h.conversation_id for h in store.search("times")] == ["c0ffee00"]


def test_newer_schema_is_refused(db: Path) -> None:
    ConversationStore.open(db).close()
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {schema.LATEST + 1}")
    conn.close()
    with pytest.raises(NewerSchemaError, match="made by a newer Stoke") as caught:
        ConversationStore.open(db)
    assert isinstance(caught.value, StoreError)
    assert str(db) in str(caught.value)
    assert db.exists()
    assert not list(db.parent.glob("*.corrupt-*"))


def test_failed_migration_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    broken = (*schema.MIGRATIONS, (schema.LATEST + 1, "CREATE TABLE t (x);\nNOT SQL;"))
    monkeypatch.setattr(schema, "MIGRATIONS", broken)
    with pytest.raises(sqlite3.OperationalError):
        schema.migrate(conn, target=schema.LATEST + 1)
    assert schema.version(conn) == schema.LATEST
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 't'").fetchone()[0] == 0
    conn.close()


def test_corrupt_database_is_moved_aside(db: Path) -> None:
    db.parent.mkdir(parents=True)
    garbage = os.urandom(8192)
    db.write_bytes(garbage)
    Path(f"{db}-wal").write_bytes(b"old wal")
    with ConversationStore.open(db) as store:
        backup = store.recovered_from
        assert backup is not None
        assert backup.name.startswith("conversations.db.corrupt-")
        assert backup.read_bytes() == garbage
        assert Path(f"{backup}-wal").read_bytes() == b"old wal"
        c = store.create_conversation("fresh").id
        assert store.get_conversation(c).title == "fresh"
    db.write_bytes(garbage)
    with ConversationStore.open(db) as store:
        assert store.recovered_from not in (None, backup)
        assert store.recovered_from.read_bytes() == garbage
    assert backup.read_bytes() == garbage


def test_empty_file_is_a_new_database(db: Path) -> None:
    db.parent.mkdir(parents=True)
    db.touch()
    with ConversationStore.open(db) as store:
        assert store.recovered_from is None
        store.create_conversation()


def test_unwritable_location(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="file"):
        ConversationStore.open(blocker / "conversations.db")
    with pytest.raises(StoreError, match=str(tmp_path)):
        ConversationStore.open(tmp_path)


def test_locked_database(db: Path) -> None:
    with ConversationStore.open(db, busy_timeout=0.05) as store:
        c = store.create_conversation().id
        other = sqlite3.connect(db, isolation_level=None, timeout=0)
        other.execute("BEGIN EXCLUSIVE")
        with ConversationStore.open(db, busy_timeout=0.05) as reader:  # opening only reads
            assert reader.get_conversation(c).id == c
        with pytest.raises(StoreLockedError) as caught:
            store.rename(c, "x")
        assert str(db) in str(caught.value)
        assert "Close other Stoke windows" in str(caught.value)
        other.execute("ROLLBACK")
        other.close()
        store.rename(c, "x")
        assert store.get_conversation(c).title == "x"


def test_a_message_after_an_unanswered_one_keeps_the_tree_alternating(
    store: ConversationStore,
) -> None:
    """The app died after committing a message and before its reply began (the fault
    injection run found it): the next, different message follows an empty interrupted reply,
    never the unanswered user message itself; the same text again is still the same message."""
    conversation = store.create_conversation()
    first = store.append_user_message(conversation.id, "Name three colours.")
    assert store.append_user_message(conversation.id, "Name three colours.").id == first.id
    second = store.append_user_message(conversation.id, "Are you there?")
    path = store.current_path(conversation.id)
    assert [m.role for m in path] == ["user", "assistant", "user"]
    gap = path[1]
    assert (gap.content, gap.status, gap.finish_reason) == ("", "interrupted", "no reply")
    assert path[0].id == first.id and path[2].id == second.id and gap.parent_id == first.id
