"""One turn at a time per conversation, across stores and processes, on a real SQLite file."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.conversations import ConversationBusyError, ConversationStore
from app.session import ChatSession

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "conversations.db"


def test_a_held_turn_is_refused_to_another_store_until_released(db: Path) -> None:
    with ConversationStore.open(db) as first, ConversationStore.open(db) as second:
        c = first.create_conversation().id
        assert first.claim_turn(c) is None
        assert first.claim_turn(c) is None  # the holder may claim again
        assert second.claim_turn(c) == os.getpid()
        first.release_turn(c)
        assert second.claim_turn(c) is None
        assert first.claim_turn(c) == os.getpid()
    with ConversationStore.open(db) as third:  # closing gave the turn back
        assert third.claim_turn(c) is None


def test_append_reads_the_leaf_it_moves(db: Path) -> None:
    with ConversationStore.open(db) as first, ConversationStore.open(db) as second:
        c = first.create_conversation().id
        question = first.append_user_message(c, "q")
        answer = second.add_message(c, question.id, "assistant", "a")
        follow_up = first.append_user_message(c, "and?")  # sees the other store's answer
        assert follow_up.parent_id == answer.id
        assert first.append_user_message(c, "and?").id == follow_up.id  # unanswered: no twin
        assert [m.content for m in second.current_path(c)] == ["q", "a", "and?"]


_HOLDER = """
import sys
from app.conversations import ConversationStore
store = ConversationStore.open(sys.argv[1])
c = store.create_conversation().id
assert store.claim_turn(c) is None
u = store.append_user_message(c, "mine")
reply = store.add_message(c, u.id, "assistant", "half", status="streaming")
print(c, reply.id, flush=True)
sys.stdin.readline()
"""


def test_a_dead_holders_turn_is_taken_over(db: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLDER), str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        c, reply_id = holder.stdout.readline().split()
        with ConversationStore.open(db) as store:
            assert store.claim_turn(c) == holder.pid
            assert store.get_message(reply_id).status == "streaming"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdin.close()
        holder.stdout.close()
    with ConversationStore.open(db) as store:
        assert store.claim_turn(c) is None
        assert store.get_message(reply_id).status == "interrupted"


def test_a_waiting_send_stops_on_cancel_with_words(db: Path) -> None:
    """Waiting for another process's turn can be given up; the user is told why."""
    with ConversationStore.open(db) as first, ConversationStore.open(db) as second:
        c = first.create_conversation().id
        assert first.claim_turn(c) is None
        session = ChatSession(second, engine=None)  # never reaches the engine

        async def send_then_cancel() -> None:
            sending = asyncio.ensure_future(session.send(c, "hello"))
            while not sending.done() and second.claim_turn(c) is not None:
                await asyncio.sleep(0.01)  # the send is waiting: give up on it
                session.cancel()
            await sending

        with pytest.raises(ConversationBusyError) as caught:
            asyncio.run(send_then_cancel())
        assert f"process {os.getpid()}" in str(caught.value)
        assert "not sent" in str(caught.value)
        assert first.current_path(c) == []
