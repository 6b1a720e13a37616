"""A long prompt's prefill on the real engine: progress chunk by chunk, and a Stop that lands
within one chunk (asserted on the engine's own counters, never on time)."""

from __future__ import annotations

import asyncio

from app.engine.host import EngineClient
from app.engine.protocol import FinishReason, LoadOptions, PrefillProgress, SamplingParams
from app.engine.slots import USER_CHUNK
from tests.e2e.conftest import both_engines

# Three chunks: MLX on a CPU reads about 13 tokens/s, so a longer prompt costs minutes and
# proves no more.
PROGRESS_TOKENS = 2 * USER_CHUNK + 88
PROSE = "The harbour town woke slowly in winter, and the ferry sounded its horn twice. "


async def _long_prompt(client: EngineClient, n: int) -> list[int]:
    tokens = await client.tokenize(PROSE * 200)
    return tokens[:n]


@both_engines
def test_progress_is_monotonic_and_ends_at_the_prompt_length(model_path, run, engine):
    async def scenario():
        options = LoadOptions(model_path, n_ctx=4096, n_batch=2048)  # chunks smaller still
        client = EngineClient(options, backend=engine)
        await client.start()
        seen: list[PrefillProgress] = []
        try:
            prompt = await _long_prompt(client, PROGRESS_TOKENS)
            reply = await client.generate(
                prompt, SamplingParams.greedy(), 2, slot="long", on_progress=seen.append
            )
            async for _ in reply:
                pass
            return prompt, seen, reply.stats
        finally:
            await client.close()

    prompt, seen, stats = run(scenario())
    done = [p.done for p in seen]
    assert {p.total for p in seen} == {len(prompt)}
    assert done == sorted(done) and len(set(done)) == len(done)  # strictly rising
    assert done[-1] == len(prompt) == stats.prompt_tokens
    assert all(b - a <= USER_CHUNK for a, b in zip([0, *done], done, strict=False))
    assert len(seen) >= len(prompt) // USER_CHUNK
    assert stats.prefilled_tokens == len(prompt)


def test_stop_during_a_long_prefill_returns_before_it_completes(model_path, run):
    async def scenario():
        client = EngineClient(LoadOptions(model_path, n_ctx=4096, n_batch=2048))
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
