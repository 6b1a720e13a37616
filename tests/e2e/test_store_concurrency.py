"""Several Stoke processes on one data folder, and the order a one-shot turn commits in.

Real subprocesses (`python -m app chat ...` and small writers) on a real SQLite file; every wait
is on a condition, with a generous deadline for a loaded machine.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from app import paths
from app.conversations import ConversationStore

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 300
LONG_REPLY = "Count from 1 to 1000, separated by commas."


def _stoke(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "app", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )


def _streaming_replies(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute(
                "SELECT count(*) FROM messages WHERE status = 'streaming' AND content != ''"
            ).fetchone()[0]
    except sqlite3.Error:
        return 0


def _wait_for(condition, what: str, *alive: subprocess.Popen) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        for process in alive:
            assert process.poll() is None, f"a process ended before {what}"
        time.sleep(0.05)


def test_two_one_shot_chats_on_one_conversation_take_turns() -> None:
    """The second writer waits for the first turn to end and appends after its reply: the
    tree stays user, reply, user, reply, with nothing off the current path."""
    with ConversationStore.open() as store:
        conversation = store.create_conversation().id
    first = _stoke(
        "chat", "-c", conversation, "-m", LONG_REPLY, "--json", "--temperature", "0",
        "--max-tokens", "1500",
    )  # fmt: skip
    _wait_for(lambda: _streaming_replies(paths.database_path()) > 0, "the first reply", first)
    second = _stoke(
        "chat", "-c", conversation, "-m", "And then?", "--json", "--temperature", "0",
        "--max-tokens", "16",
    )  # fmt: skip
    outputs = [p.communicate(timeout=DEADLINE_S) for p in (first, second)]
    for process, (out, err) in zip((first, second), outputs, strict=True):
        assert process.returncode == 0, err
        assert "Traceback" not in out + err
        assert json.loads(out.strip().splitlines()[-1])["status"] == "complete"
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    replies = [result["reply"] for result in results]
    first_stats, second_stats = (result["stats"] for result in results)
    # The second prompt holds the whole first turn: it was built after that reply ended.
    assert second_stats["prompt_tokens"] > (
        first_stats["prompt_tokens"] + first_stats["generated_tokens"]
    )

    with ConversationStore.open() as store:
        path = store.current_path(conversation)
        everything = store._conn.execute(
            "SELECT count(*) FROM messages WHERE conversation_id = ?", (conversation,)
        ).fetchone()[0]
    assert [(m.role, m.content) for m in path] == [
        ("user", LONG_REPLY),
        ("assistant", replies[0]),
        ("user", "And then?"),
        ("assistant", replies[1]),
    ]
    assert all(m.status == "complete" for m in path)
    assert everything == 4


_STREAMING_WRITER = """
import sys, time
from app.conversations import ConversationStore
store = ConversationStore.open()
c = store.create_conversation().id
u = store.add_message(c, None, "user", "tell me a story")
reply = store.add_message(c, u.id, "assistant", "once", status="streaming")
print(reply.id, flush=True)
sys.stdin.readline()  # streaming goes on until the test says stop
"""


def test_list_leaves_a_live_streaming_reply_alone() -> None:
    """`stoke chat --list` (or any opener) marks only replies whose writer is gone."""
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_STREAMING_WRITER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        reply_id = writer.stdout.readline().strip()
        listing = subprocess.run(
            [sys.executable, "-m", "app", "chat", "--list"],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            env=os.environ.copy(),
        )
        assert listing.returncode == 0, listing.stderr
        assert "tell me a story" in listing.stdout
        with ConversationStore.open() as store:
            assert store.get_message(reply_id).status == "streaming"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stdin.close()
        writer.stdout.close()
    with ConversationStore.open() as store:
        reply = store.get_message(reply_id)
    assert (reply.status, reply.content) == ("interrupted", "once")


def test_one_shot_keeps_the_typed_message_when_the_engine_fails(tmp_path: Path) -> None:
    """The message is committed before the engine starts, so a model that cannot load still
    leaves the typed text in the new conversation."""
    missing = tmp_path / "nowhere.gguf"
    done = subprocess.run(
        [sys.executable, "-m", "app", "chat", "--new", "-m", "keep me", "--json",
         "--model", str(missing)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=os.environ.copy(),
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["kind"] == "ModelLoadError"
    with ConversationStore.open() as store:
        (conversation,) = store.list_conversations()
        path = store.current_path(conversation.id)
    assert conversation.title == "keep me"
    assert [(m.role, m.content) for m in path] == [("user", "keep me")]
