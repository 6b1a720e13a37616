"""The engine host process: priorities, preemption, cancel, prefill-only, load failures."""

from __future__ import annotations

import asyncio

import pytest

from app.engine.host import EngineClient, EngineState, Priority
from app.engine.protocol import FinishReason, LoadOptions, ModelLoadError, SamplingParams
from tests.e2e.conftest import both_engines


async def _client(model_path: str, engine: str = "llama.cpp", **options) -> EngineClient:
    client = EngineClient(LoadOptions(model_path, n_ctx=4096, **options), backend=engine)
    await client.start()
    return client


async def _prompt(client: EngineClient, text: str) -> list[int]:
    return await client.tokenize(
        f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", special=True
    )


@both_engines
def test_users_send_preempts_background_prefill(model_path, run, engine):
    async def scenario():
        # batches of 128, not 512: the send waits for the batch under way, and a SmolLM2
        # batch of 512 took 10 s on the loaded 2-core box (3,000 tokens are still 24 batches)
        client = await _client(model_path, engine, n_batch=128)
        try:
            long = await client.tokenize("The quick brown fox jumps over the lazy dog. " * 300)
            prefill = asyncio.create_task(client.prefill(long, slot="draft"))
            while client.state != EngineState.PREFILLING:
                await asyncio.sleep(0.01)
            reply = await client.generate(
                await _prompt(client, "Hi"), SamplingParams.greedy(), 8, slot="chat"
            )
            text = "".join([event.text async for event in reply])
            return long, await prefill, reply.stats, text
        finally:
            await client.close()

    long, prefill, stats, text = run(scenario())
    assert prefill.finish_reason == FinishReason.CANCELLED
    assert 0 < prefill.prefilled_tokens < len(long)  # stopped between batches, not finished
    assert stats.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and text


def test_queued_work_runs_by_priority(model_path, run):
    async def scenario():
        client = await _client(model_path)
        finished: list[str] = []
        try:
            prompt = await _prompt(client, "Count from 1 to 50.")
            first = await client.generate(prompt, SamplingParams.greedy(), 48, slot="a")

            async def drain(name: str, generation) -> None:
                async for _ in generation:
                    pass
                finished.append(name)

            async def background() -> None:
                await client.prefill(prompt[:-3], slot="b", priority=Priority.BACKGROUND)
                finished.append("background")

            running = asyncio.create_task(drain("first", first))
            queued_background = asyncio.create_task(background())
            await asyncio.sleep(0.05)
            second = await client.generate(prompt, SamplingParams.greedy(), 4, slot="c")
            await asyncio.gather(running, queued_background, drain("user", second))
            return finished
        finally:
            await client.close()

    assert run(scenario()) == ["first", "user", "background"]


@both_engines
def test_cancel_between_tokens_and_prefill_only(model_path, run, engine):
    async def scenario():
        client = await _client(model_path, engine)
        try:
            prompt = await _prompt(client, "Count from 1 to 100.")
            warm = await client.prefill(prompt, slot="s")
            generation = await client.generate(prompt, SamplingParams.greedy(), 200, slot="s")
            count = 0
            async for _ in generation:
                count += 1
                if count == 5:
                    generation.cancel()
            return prompt, warm, generation, count
        finally:
            await client.close()

    prompt, warm, generation, count = run(scenario())
    assert warm.finish_reason == FinishReason.PREFILLED
    assert warm.prefilled_tokens == len(prompt) and warm.generated_tokens == 0
    # the generation found the prompt already warm: nothing to prefill
    assert generation.stats.reused_tokens == len(prompt)
    assert generation.stats.prefilled_tokens == 0
    assert generation.stats.finish_reason == FinishReason.CANCELLED
    assert 5 <= count <= 7 and generation.stats.generated_tokens == count


@both_engines
def test_load_failure_is_reported_not_restarted(tmp_path, run, engine):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)

    async def scenario():
        states: list[EngineState] = []
        client = EngineClient(
            LoadOptions(str(bad)), backend=engine, on_state=lambda s, _: states.append(s)
        )
        with pytest.raises(ModelLoadError) as error:
            await client.start()
        alive = client.pid is not None
        await client.close()
        return error.value, states, alive

    error, states, alive = run(scenario())
    assert "Could not load the model bad.gguf" in str(error)
    assert states == [EngineState.LOADING, EngineState.FAILED, EngineState.STOPPED]
    assert not alive  # a model that cannot load is not retried in a crash loop
