"""An engine that protects itself: a first-decode crash is retried once with conservative
settings, recorded, and the next start loads that way without crashing (issue 13); but only
under the load settings that crashed, and a setting that cannot work is refused in words
before it reaches the engine, never blamed on the model (issue 33).

The crash is the worker's test hook (STOKE_TEST_CRASH_FIRST_DECODE): the engine process dies
by SIGSEGV at its first decode unless it loaded conservatively, as llama.cpp's AMX matmul does
on the machines it fails on; everything else is the real engine on the real default model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.conversations import ConversationStore
from app.engine import safe_mode
from app.engine.host import EngineClient, EngineCrashedError, EngineState
from app.engine.protocol import LoadOptions, SamplingParams
from app.session import ChatSession
from tests.e2e.stoke_proc import stoke

CRASH = {"STOKE_TEST_CRASH_FIRST_DECODE": "1"}


@pytest.fixture
def crashing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CRASH.items():
        monkeypatch.setenv(name, value)


async def _turn(store: ConversationStore, model_path: str, text: str, n_ctx: int = 2048):
    client = EngineClient(LoadOptions(model_path, n_ctx=n_ctx), backend="llama.cpp")
    states: list[tuple[EngineState, str]] = []
    notices: list[str] = []
    client.add_state_listener(lambda state, detail: states.append((state, detail)))
    client.add_notice_listener(notices.append)
    await client.start()
    session = ChatSession(store, client)
    conversation = store.create_conversation(sampling={"temperature": 0, "max_tokens": 12})
    try:
        result = await session.send(conversation.id, text)
        return result, states, notices, client.launch_options
    finally:
        await client.close()


def test_first_decode_crash_is_retried_safely_and_remembered(
    store: ConversationStore, tiny_model: str, run, crashing, monkeypatch: pytest.MonkeyPatch
):
    """The mechanism, not the words: on the tests' tiny model (SmolLM2's tokenizer)."""
    result, states, notices, launched = run(_turn(store, tiny_model, "Name three colours."))

    assert result.status == "complete" and result.text
    assert [s for s, _ in states].count(EngineState.CRASHED) == 1
    assert len(notices) == 1 and "conservative settings" in notices[0]
    assert "SIGSEGV" in notices[0] and "\n" not in notices[0]
    assert safe_mode.is_conservative(launched)
    crashed = LoadOptions(tiny_model, n_ctx=2048)
    record = safe_mode.SafeModeRecords().lookup("llama.cpp", crashed)
    assert record is not None and "SIGSEGV" in record["reason"]
    assert record["settings"]["n_ctx"] == 2048

    # The next start reads the record: conservative from the first load, no crash at all.
    again, states, notices, launched = run(_turn(store, tiny_model, "And three fruits?"))
    assert again.status == "complete" and again.text
    assert EngineState.CRASHED not in [s for s, _ in states]
    assert len(notices) == 1 and "crashed on this machine before" in notices[0]
    assert safe_mode.is_conservative(launched)

    # Other load settings (the crash gone with them): the record has expired, the model loads
    # with its own settings and says nothing.
    monkeypatch.delenv("STOKE_TEST_CRASH_FIRST_DECODE")
    fixed, states, notices, launched = run(_turn(store, tiny_model, "Three trees?", n_ctx=1024))
    assert fixed.status == "complete" and fixed.text
    assert notices == [] and not safe_mode.is_conservative(launched)
    assert safe_mode.SafeModeRecords().entries() == []


def test_a_second_crash_is_reported_as_before(store: ConversationStore, model_path, run):
    """Already conservative, a first-decode death is an ordinary crash: no silent loop."""

    async def scenario():
        options = safe_mode.conservative(LoadOptions(model_path, n_ctx=2048))
        client = EngineClient(options, backend="llama.cpp")
        notices: list[str] = []
        client.add_notice_listener(notices.append)
        await client.start()
        session = ChatSession(store, client)
        conversation = store.create_conversation(sampling={"temperature": 0, "max_tokens": 400})
        try:

            def kill(_event) -> None:
                os.kill(client.pid, signal.SIGSEGV)

            with pytest.raises(EngineCrashedError) as crash:
                await session.send(conversation.id, "Count to 100.", on_token=kill)
            return crash.value, notices
        finally:
            await client.close()

    crash, notices = run(scenario())
    assert "SIGSEGV" in str(crash) and notices == []


def test_cli_turn_completes_with_a_one_line_notice(stoke_home: Path, tiny_model: str):
    """`stoke chat` on the tiny model, a few greedy tokens: the notice is the point."""
    env = {**os.environ, "STOKE_HOME": str(stoke_home), **CRASH}
    command = [sys.executable, "-m", "app", "chat", "--model", tiny_model, "--new"]
    command += ["--message", "hi", "--temperature", "0", "--max-tokens", "8", "--json"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    output = json.loads(done.stdout.strip().splitlines()[-1])
    assert output["status"] == "complete" and output["reply"]
    assert len(output["notices"]) == 1 and "conservative settings" in output["notices"][0]
    assert "Traceback" not in done.stderr

    plain = subprocess.run(command[:-1], env=env, capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    notices = [line for line in plain.stderr.splitlines() if "conservative settings" in line]
    assert len(notices) == 1 and "crashed on this machine before" in notices[0]


def test_a_kill_in_the_first_decode_is_not_taken_for_a_runtime_fault(
    store: ConversationStore, model_path, run
):
    """SIGKILL (the OOM killer, a user) says nothing about buffer types: no safe mode."""

    async def scenario():
        client = EngineClient(LoadOptions(model_path, n_ctx=2048), backend="llama.cpp")
        notices: list[str] = []
        client.add_notice_listener(notices.append)

        def kill_at_start(state: EngineState, _detail: str) -> None:
            if state == EngineState.GENERATING and client.pid and not killed:
                killed.append(client.pid)
                os.kill(client.pid, signal.SIGKILL)

        killed: list[int] = []
        client.add_state_listener(kill_at_start)
        await client.start()
        session = ChatSession(store, client)
        conversation = store.create_conversation(sampling={"temperature": 0, "max_tokens": 8})
        try:
            with pytest.raises(EngineCrashedError) as crash:
                await session.send(conversation.id, "Name three colours.")
            return crash.value, notices, client.launch_options
        finally:
            await client.close()

    crash, notices, launched = run(scenario())
    assert "SIGKILL" in str(crash) and notices == []
    assert not safe_mode.is_conservative(launched)
    assert safe_mode.SafeModeRecords().entries() == []


def _no_record_blames_a_model() -> None:
    assert safe_mode.SafeModeRecords().entries() == []


def test_a_context_too_small_in_settings_is_said_in_words_and_blamed_on_no_model(
    stoke_home: Path, tiny_model: str
):
    """settings.json n_ctx 1 passed the settings check and aborted the engine (SIGABRT), and
    safe mode then blamed the model for good (issue 33): now the check names the field and
    the smallest context that works, and the turn runs on the default context."""
    settings = stoke_home / "config" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"n_ctx": 1}))
    turn = ("--new", "-m", "hi", "--json", "--max-tokens", "4")
    done = stoke(stoke_home, "chat", "--model", tiny_model, *turn)

    assert done.returncode == 0, done.stdout + done.stderr
    output = json.loads(done.stdout.strip().splitlines()[-1])
    assert output["status"] == "complete" and "notices" not in output
    assert "n_ctx = 1 is not a whole number of tokens from 256 (the smallest" in done.stderr
    assert "Traceback" not in done.stderr
    _no_record_blames_a_model()


def test_a_context_too_small_on_the_command_line_stops_in_words(stoke_home: Path):
    done = stoke(stoke_home, "chat", "--ctx", "1", "--new", "-m", "hi", "--json")

    assert done.returncode == 1
    error = json.loads(done.stdout.strip().splitlines()[-1])
    assert error["kind"] == "ModelLoadError"
    assert error["error"].startswith("A context of 1 token cannot hold a conversation")
    assert "256 or more" in error["error"]
    assert "Traceback" not in done.stdout + done.stderr
    _no_record_blames_a_model()


def test_a_prompt_longer_than_a_small_contexts_batch_is_prefilled_without_a_crash(
    store: ConversationStore, tiny_model: str, run
):
    """llama.cpp caps a batch at the context asked for (300 in one stream) and aborted the
    engine on the 512-token chunk of a 400-token prompt: a crash no model is to blame for."""

    async def scenario():
        client = EngineClient(
            LoadOptions(tiny_model, n_ctx=300, n_seq_max=1, snapshots=False), backend="llama.cpp"
        )
        notices: list[str] = []
        client.add_notice_listener(notices.append)
        await client.start()
        try:
            prompt = [100 + i % 5000 for i in range(400)]
            generation = await client.generate(prompt, SamplingParams.greedy(), 4)
            tokens = [event async for event in generation]
            return generation.stats, tokens, notices
        finally:
            await client.close()

    stats, tokens, notices = run(scenario())
    assert stats.prefilled_tokens == 400 and len(tokens) == stats.generated_tokens >= 1
    assert notices == []
    _no_record_blames_a_model()


def test_a_context_past_the_models_training_is_cut_in_words(tiny_model: str, run):
    async def scenario():
        client = EngineClient(LoadOptions(tiny_model, n_ctx=10_000), backend="llama.cpp")
        notices: list[str] = []
        client.add_notice_listener(notices.append)
        info = await client.start()
        await client.close()
        return info, notices

    info, notices = run(scenario())
    assert info.n_ctx == info.n_ctx_train == 8192
    assert notices == [
        f"{info.name} was trained on a context of 8,192 tokens: each conversation gets 8,192, "
        "not the 10,000 the settings ask for."
    ]
