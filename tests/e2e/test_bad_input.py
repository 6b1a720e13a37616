"""Every bad input a user can reach gives words, not a traceback, and loses nothing.

The words and the store's care are the app's, whatever model answers, so the turns run on the
tests' tiny model (tests/tiny_model.py: SmolLM2's tokenizer and template, random weights)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app import paths
from app.conversations import ConversationStore
from app.engine.protocol import ContextOverflowError
from tests.e2e.conftest import start_session


def stoke(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )


def one_shot(model: str, *args: str) -> tuple[int, dict]:
    done = stoke(
        "chat", "--model", model, "--json", "--temperature", "0", "--max-tokens", "16", *args
    )
    assert "Traceback" not in done.stderr + done.stdout
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def model_path(tiny_model: str) -> str:
    return tiny_model


def test_one_shot_json_new_then_continue(model_path: str):
    code, first = one_shot(model_path, "--new", "--message", "Hello!")
    assert code == 0 and first["status"] == "complete" and first["reply"]
    assert first["stats"]["prompt_tokens"] == first["stats"]["prefilled_tokens"]
    conversation = first["conversation_id"]
    code, second = one_shot(model_path, "--conversation", conversation, "--message", "Thanks.")
    assert code == 0 and second["conversation_id"] == first["conversation_id"]
    assert second["stats"]["prompt_tokens"] > first["stats"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "Model file not found"),
        (b"", "empty or truncated"),
        (b"PK\x03\x04 this is a zip file, not a model" * 4, "not a GGUF model file"),
    ],
)
def test_bad_model_files(tmp_path: Path, content: bytes | None, expected: str):
    model = tmp_path / "model.gguf"
    if content is not None:
        model.write_bytes(content)
    code, error = one_shot(str(model), "--new", "--message", "hi")
    assert code == 1 and expected in error["error"] and error["kind"] == "ModelLoadError"


def test_truncated_gguf(tmp_path: Path, model_path: str):
    model = tmp_path / "truncated.gguf"
    model.write_bytes(Path(model_path).read_bytes()[: 4 << 20])
    code, error = one_shot(str(model), "--new", "--message", "hi")
    assert code == 1 and error["kind"] == "ModelLoadError"
    assert "Could not load the model truncated.gguf" in error["error"]
    assert "truncated" in error["error"]


def test_empty_message_and_unknown_conversation(model_path: str):
    code, error = one_shot(model_path, "--new", "--message", "   ")
    assert code == 1 and error["error"] == "The message is empty. Type something to send."
    code, error = one_shot(model_path, "--conversation", "abcdef12", "--message", "hi")
    assert code == 1 and "No conversation with id 'abcdef12'" in error["error"]


def test_database_locked():
    ConversationStore.open().close()
    holder = sqlite3.connect(paths.database_path())
    holder.execute("BEGIN EXCLUSIVE")
    try:
        done = stoke("chat", "--new", "--message", "hi")  # writes (a listing only reads)
    finally:
        holder.rollback()
        holder.close()
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "is locked by another program" in done.stderr


def test_corrupt_database_is_moved_aside_not_overwritten(model_path: str):
    db = paths.database_path()
    garbage = b"this is not a database" * 100
    db.write_bytes(garbage)
    code, reply = one_shot(model_path, "--new", "--message", "hi")
    assert code == 0 and reply["status"] == "complete"
    backups = list(db.parent.glob(db.name + ".corrupt-*"))
    assert [b.read_bytes() for b in backups if b.suffix != ".db-wal"] == [garbage]


def test_context_overflow_offers_drop_or_new(model_path: str):
    long_message = "Tell me about the sea. " * 60  # about 360 tokens
    code, error = one_shot(model_path, "--ctx", "256", "--new", "--message", long_message)
    # The message alone does not fit: leaving older turns out cannot help, so it is not offered.
    assert code == 1 and error["kind"] == "MessageTooLongError"
    assert error["n_ctx"] == 256 and error["prompt_tokens"] > 256
    assert "Your message alone is" in error["error"] and "Drop" not in error["error"]
    with ConversationStore.open() as store:
        (conversation,) = store.list_conversations()
        (kept,) = store.current_path(conversation.id)
    assert kept.content == long_message  # the typed message is never lost


def test_drop_oldest_keeps_system_prompt(store: ConversationStore, model_path, run):
    system = "You are a pirate."

    async def scenario():
        session = await start_session(store, model_path, n_ctx=512)
        try:
            conversation = store.create_conversation(
                system_prompt=system, sampling={"temperature": 0, "max_tokens": 16}
            )
            turn = "Describe a calm blue ocean at dawn in detail, please. " * 5
            overflow = None
            for _ in range(12):
                try:
                    await session.send(conversation.id, turn)
                except ContextOverflowError as exc:
                    overflow = exc
                    break
            assert overflow is not None, "the conversation never outgrew 512 tokens"
            result = await session.send(conversation.id, turn, drop_oldest=True)
            history = store.path_to(result.user_message_id)
            conversation = store.get_conversation(conversation.id)
            window = session.transcript(conversation, history[result.dropped_turns :])
            return overflow, result, window
        finally:
            await session.engine.close()

    overflow, result, window = run(scenario())
    assert overflow.n_ctx == 512 and overflow.prompt_tokens >= 512
    assert result.status == "complete" and result.dropped_turns >= 2
    assert window.turns[0].role == "system" and window.turns[0].text == system
    assert result.stats.prompt_tokens == len(window.prompt()) <= 512
