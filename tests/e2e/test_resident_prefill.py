"""Resident conversations on the real engine host: a new conversation beside others prefills
only its own tokens (and, each in a KV stream of its own, replies as if it were alone), the
residents keep working, and a conversation that needs the room evicts others to RAM, from
where they come back exactly. The streams and the eviction are the engine's, whatever the
weights, so the tests run on the tests' tiny model (tests/tiny_model.py)."""

from __future__ import annotations

import pytest

from app.engine.host import EngineClient
from app.engine.protocol import FinishReason, LoadOptions, SamplingParams, TokenEvent
from tests.e2e.conftest import both_engines

TOPICS = ("harbour", "glacier", "orchard", "lighthouse")


@pytest.fixture
def model_path(tiny_model: str) -> str:
    return tiny_model


def _text(topic: str, sentences: int) -> str:
    body = " ".join(
        f"The {topic} of town {i} changed with the seasons and the weather."
        for i in range(sentences)
    )
    return f"<|im_start|>user\n[{topic}] {body}\nWhat is it?<|im_end|>\n<|im_start|>assistant\n"


async def _client(model_path: str, engine: str, **options) -> EngineClient:
    client = EngineClient(LoadOptions(model_path, **options), backend=engine)
    await client.start()
    return client


async def _prompt(client: EngineClient, topic: str, sentences: int = 8) -> list[int]:
    return await client.tokenize(_text(topic, sentences), special=True)


def _kv_after(prompt: list[int], reply: list[int], stats) -> list[int]:
    """What the KV holds after a reply: its last token is evaluated only when the model went
    on to sample another (so not when max_tokens cut it)."""
    held = prompt + reply
    return held[:-1] if stats.finish_reason == FinishReason.LENGTH and reply else held


async def _reply(client: EngineClient, prompt: list[int], slot: str, n: int = 12):
    generation = await client.generate(prompt, SamplingParams.greedy(), n, slot=slot)
    tokens = [event.token_id async for event in generation if isinstance(event, TokenEvent)]
    return tokens, generation.stats


@both_engines
def test_a_new_conversation_beside_residents_prefills_only_itself(model_path, run, engine):
    async def alone():  # no snapshot left behind for the run beside others to restore
        client = await _client(model_path, engine, n_ctx=2048, n_seq_max=4, snapshots=False)
        try:
            return await _reply(client, await _prompt(client, "orchard"), "new")
        finally:
            await client.close()

    async def beside_others():
        client = await _client(model_path, engine, n_ctx=2048, n_seq_max=4)
        try:
            residents = {t: await _prompt(client, t) for t in TOPICS[:2]}
            replies = {t: await _reply(client, p, t) for t, p in residents.items()}
            new = await _reply(client, await _prompt(client, "orchard"), "new")
            follow_ups = {}
            for topic, prompt in residents.items():
                turn = prompt + replies[topic][0] + await client.tokenize(" Go on.")
                follow_ups[topic] = (turn, *await _reply(client, turn, topic))
                follow_ups[topic] += (await client.resident_tokens(topic),)
            return residents, replies, new, follow_ups
        finally:
            await client.close()

    reference, (residents, replies, new, follow_ups) = run(alone()), run(beside_others())
    tokens, stats = new
    assert stats.reused_tokens == 0 and stats.prefilled_tokens == stats.prompt_tokens
    assert tokens == reference[0]  # its own cells only: the same reply as with none resident
    for topic, (turn, reply, turn_stats, held) in follow_ups.items():
        before = _kv_after(residents[topic], *replies[topic])
        assert turn_stats.reused_tokens == len(before)
        assert turn_stats.prefilled_tokens == len(turn) - len(before)
        assert turn_stats.restored_tokens == 0
        assert held == _kv_after(turn, reply, turn_stats)


def test_each_resident_keeps_its_stream_and_the_oldest_goes_to_ram(model_path, run):
    """n_seq_max streams on llama.cpp: a third conversation evicts the least recent one to
    RAM, and it comes back from there holding exactly what it held, replying as it would."""

    async def scenario():
        client = await _client(model_path, "llama.cpp", n_ctx=2048, n_seq_max=2)
        try:
            a, b, c = [await _prompt(client, t) for t in TOPICS[:3]]
            live = await _reply(client, a, "A")
            await client.prefill(b, slot="B")
            held_a = await client.resident_tokens("A")
            await client.prefill(c, slot="C")  # evicts A, the least recently used
            evicted = await client.resident_tokens("A")
            again = await _reply(client, a, "A")  # from RAM; evicts B
            return a, live, held_a, evicted, again, await client.resident_tokens("B")
        finally:
            await client.close()

    a_prompt, live, held_a, evicted, again, b_after = run(scenario())
    assert evicted == [] and b_after == []
    tokens, stats = again
    assert held_a == _kv_after(a_prompt, *live)
    assert stats.restored_tokens == len(a_prompt) - 1  # its last token is evaluated for logits
    assert stats.prefilled_tokens == 1
    assert tokens == live[0]


@both_engines
def test_a_long_prefill_that_needs_the_shared_room_evicts_others_to_ram(model_path, run, engine):
    """Slots sharing one pool of cells (llama.cpp's unified KV, MLX's RAM budget of one
    window): a conversation longer than the room left evicts the others, oldest first, and
    each comes back from RAM exactly."""

    async def scenario():
        options = {"n_ctx": 512, "n_seq_max": 4, "kv_unified": True}
        client = await _client(model_path, engine, **options)
        try:
            a, b = [await _prompt(client, t, 6) for t in TOPICS[:2]]
            long = await _prompt(client, TOPICS[2], 24)
            for slot, prompt in (("A", a), ("B", b)):
                await client.prefill(prompt, slot=slot)
            held = {s: await client.resident_tokens(s) for s in "AB"}
            filled = await client.prefill(long, slot="L")
            after = {s: await client.resident_tokens(s) for s in "ABL"}
            back = await client.prefill([*a, 198], slot="A")
            return a, b, long, held, filled, after, back, await client.resident_tokens("A")
        finally:
            await client.close()

    a, b, long, held, filled, after, back, a_again = run(scenario())
    assert len(a) + len(b) + len(long) > 512 >= len(b) + len(long)
    assert held == {"A": a, "B": b}
    assert filled.finish_reason == FinishReason.PREFILLED
    assert filled.prefilled_tokens == len(long)
    assert after == {"A": [], "B": b, "L": long}  # only the oldest had to go
    assert back.restored_tokens == len(a) and back.prefilled_tokens == 1
    assert a_again == [*a, 198]
