"""A long prompt's prefill on the real engine: progress chunk by chunk, USER_CHUNK tokens
where someone watches (the window's ChatSession) and whole n_batch steps for an API request
(stoke serve), and a Stop that lands within one chunk (asserted on the engine's own
counters, never on time). The chunks are the engine's whatever the weights, so they are read
on the tests' tiny model (tests/tiny_model.py); the Stop, which must land before the prompt
is read, on the default model, whose prefill takes long enough."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pytest

from app.conversations import ConversationStore
from app.engine.host import EngineClient
from app.engine.protocol import (
    USER_CHUNK,
    FinishReason,
    LoadOptions,
    PrefillProgress,
    SamplingParams,
)
from app.models.default import default_model_path
from tests.e2e.conftest import both_engines, start_session
from tests.e2e.serving import ServerThread

PROSE = "The harbour town woke slowly in winter, and the ferry sounded its horn twice. "


@pytest.fixture
def model_path(tiny_model: str) -> str:
    return tiny_model


async def _long_prompt(client: EngineClient, n: int) -> list[int]:
    tokens = await client.tokenize(PROSE * 200)
    return tokens[:n]


def _steps(seen: list[PrefillProgress]) -> list[int]:
    done = [p.done for p in seen]
    return [b - a for a, b in zip([0, *done], done, strict=False)]


@both_engines
def test_the_window_reads_a_long_message_in_user_chunks(
    store: ConversationStore, model_path, run, engine
):
    """The window's turn (ChatSession.send, as the GUI and the terminal chat call it)."""

    async def scenario():
        session = await start_session(store, model_path, engine=engine)  # n_batch 512
        seen: list[PrefillProgress] = []
        session.on_progress = lambda _reply, progress: seen.append(progress)
        try:
            conversation = store.create_conversation(sampling={"temperature": 0, "max_tokens": 2})
            result = await session.send(conversation.id, PROSE * 36)
            first = list(seen)
            seen.clear()
            follow_up = await session.send(conversation.id, "And then?")
            return first, result.stats, seen, follow_up.stats
        finally:
            await session.engine.close()

    seen, stats, again, follow_up = run(scenario())
    # shown from Enter, before the engine's first chunk: what the conversation held (nothing)
    assert seen[0] == PrefillProgress(0, stats.prompt_tokens)
    seen = seen[1:]
    steps = _steps(seen)
    assert stats.prompt_tokens > 2 * USER_CHUNK and stats.prefilled_tokens == stats.prompt_tokens
    assert {p.total for p in seen} == {stats.prompt_tokens}
    assert seen[-1].done == stats.prompt_tokens
    assert all(0 < step <= USER_CHUNK for step in steps)  # strictly rising, small steps
    assert len(seen) == math.ceil(stats.prompt_tokens / USER_CHUNK)
    # a follow-up starts its count at what the conversation held through its last reply
    held = stats.prompt_tokens + stats.generated_tokens
    assert again[0] == PrefillProgress(held, follow_up.prompt_tokens)
    assert follow_up.reused_tokens >= held - 1 and again[-1].done == follow_up.prompt_tokens


def test_an_api_request_reads_its_prompt_in_whole_batches(model_path, monkeypatch):
    """A `stoke serve` request (no one to press Stop): n_batch steps, not USER_CHUNK ones,
    seen through the server's own generate call."""
    server = ServerThread()  # n_batch 512
    server.options = replace(server.options, model_path=model_path)
    with server:
        seen: list[PrefillProgress] = []
        generate = server.engine.generate

        async def listened(*args, **kwargs):
            return await generate(*args, **{**kwargs, "on_progress": seen.append})

        monkeypatch.setattr(server.engine, "generate", listened)
        reply = server.client().chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": PROSE * 40}],
            max_tokens=2,
            temperature=0,
        )
    prompt = reply.usage.prompt_tokens
    steps = _steps(seen)
    assert prompt > 512 and seen[-1].done == prompt
    assert steps[:-1] == [512] * (len(steps) - 1)  # whole batches, then the rest
    assert len(seen) == math.ceil(prompt / 512) < math.ceil(prompt / USER_CHUNK)


def test_stop_during_a_long_prefill_returns_before_it_completes(run):
    async def scenario():
        options = LoadOptions(str(default_model_path()), n_ctx=4096, n_batch=2048)
        client = EngineClient(options)
        await client.start()
        try:
            prompt = await _long_prompt(client, 3000)
            first = asyncio.Event()
            reply = await client.generate(
                prompt,
                SamplingParams.greedy(),
                8,
                slot="long",
                on_progress=lambda _p: first.set(),
                prefill_chunk=USER_CHUNK,  # as the window asks
            )
            await first.wait()
            reply.cancel()  # Esc, as the session does it
            tokens = [event async for event in reply]
            held = await client.resident_tokens("long")
            return prompt, reply.stats, tokens, held
        finally:
            await client.close()

    prompt, stats, tokens, held = run(scenario())
    assert stats.finish_reason == FinishReason.CANCELLED and tokens == []
    # Stopped between two chunks, before the prompt was read (n_batch alone would be 2048).
    assert 0 < stats.prefilled_tokens < len(prompt)
    assert stats.prefilled_tokens % USER_CHUNK == 0
    assert len(held) == stats.prefilled_tokens
