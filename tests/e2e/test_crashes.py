"""kill -9 of the engine child and of the whole app: nothing committed is lost."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app import paths
from app.conversations import ConversationStore
from app.engine.host import EngineCrashedError, EngineState
from tests.e2e.conftest import both_engines, start_session

LONG_REPLY = "Count from 1 to 300, separated by commas."


@both_engines
def test_engine_killed_mid_reply_keeps_partial_and_restarts(
    store: ConversationStore, model_path, run, engine
):
    async def scenario():
        session = await start_session(store, model_path, engine=engine)
        states: list[EngineState] = []
        session.engine.add_state_listener(lambda state, detail: states.append(state))
        conversation = store.create_conversation(sampling={"temperature": 0, "max_tokens": 400})
        seen: list[int] = []

        def kill_after_some(event) -> None:
            seen.append(event.token_id)
            if len(seen) == 8:
                os.kill(session.engine.pid, signal.SIGKILL)

        try:
            with pytest.raises(EngineCrashedError) as crash:
                await session.send(conversation.id, LONG_REPLY, on_token=kill_after_some)
            after = await session.send(conversation.id, "Thanks!")
            return conversation, crash.value, seen, after, states
        finally:
            await session.engine.close()

    conversation, crash, seen, after, states = run(scenario())
    assert "stopped unexpectedly" in str(crash) and "SIGKILL" in str(crash)
    assert EngineState.CRASHED in states
    path = store.current_path(conversation.id)
    partial = path[1]
    assert partial.status == "interrupted" and partial.finish_reason == "crashed"
    assert partial.token_ids == seen[: len(partial.token_ids)] and len(partial.token_ids) >= 8
    assert partial.content  # the kept tokens' text
    assert after.status == "complete" and after.text
    assert [m.role for m in path] == ["user", "assistant", "user", "assistant"]


def _streaming_reply(db: Path) -> str:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            row = conn.execute(
                "SELECT content FROM messages WHERE role='assistant' AND status='streaming'"
            ).fetchone()
    except sqlite3.Error:
        return ""
    return row[0] if row else ""


def test_app_killed_mid_stream_loses_nothing(stoke_home: Path):
    env = {**os.environ, "STOKE_HOME": str(stoke_home)}
    app = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "chat",
            "--new",
            "--message",
            LONG_REPLY,
            "--temperature",
            "0",
            "--max-tokens",
            "600",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    db = paths.database_path()
    deadline = time.monotonic() + 300  # generous: a loaded CI machine starts slowly
    while len(_streaming_reply(db)) < 20:
        assert time.monotonic() < deadline, "the reply never started streaming"
        assert app.poll() is None, "the app ended before it could be killed"
        time.sleep(0.05)
    os.killpg(app.pid, signal.SIGKILL)  # the app and its engine child
    app.wait()

    with ConversationStore.open() as store:
        (conversation,) = store.list_conversations()
        user, reply = store.current_path(conversation.id)
    assert user.content == LONG_REPLY and user.status == "complete"
    assert reply.status == "interrupted"
    assert len(reply.content) >= 20 and reply.content.startswith("1")
    assert reply.token_ids
