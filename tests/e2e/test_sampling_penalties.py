"""Repetition penalties and logit_bias on each engine: a bias of -100 on the greedy token makes
the engine pick another, +100 forces a token, and each penalty changes a repetitive greedy
reply, on llama.cpp and MLX alike (the server passes them through SamplingParams)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.engine.host import EngineClient
from app.engine.protocol import LoadOptions, SamplingParams
from app.models.default import default_model_path
from tests.e2e.conftest import both_engines

pytestmark = pytest.mark.e2e
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"  # greedy SmolLM2 keeps counting
# and repeats this; each penalty changes the reply from its first token, on both engines, so
# four tokens show it (MLX's CPU build runs SmolLM2 at a few tokens a second)
REPEATING = "The cat sat on the mat. The cat sat on the mat. The cat"
GREEDY = SamplingParams.greedy()


@pytest.fixture
def model_path() -> str:
    """SmolLM2 on both engines: the penalties' effect is on a model that repeats itself,
    which the tiny random model does not."""
    return str(default_model_path())


@both_engines
def test_penalties_and_logit_bias_change_the_sampled_tokens(model_path, run, engine):
    async def scenario() -> dict[str, list[int]]:
        client = EngineClient(LoadOptions(model_path, n_ctx=1024), backend=engine)
        await client.start()
        try:
            counting, repeating = await client.tokenize(COUNTING), await client.tokenize(REPEATING)

            async def ids(sampling: SamplingParams, n: int, prompt: list[int]) -> list[int]:
                generation = await client.generate(prompt, sampling, n, slot="s")
                return [event.token_id async for event in generation]

            first = (await ids(GREEDY, 1, counting))[0]
            forced = 1000 if first != 1000 else 1001
            bias = ((forced, 100.0),)
            return {
                "first": [first],
                "banned": await ids(replace(GREEDY, logit_bias=((first, -100.0),)), 1, counting),
                "forced": await ids(replace(GREEDY, logit_bias=bias), 3, counting),
                "sampled": await ids(SamplingParams(seed=7, logit_bias=bias), 3, counting),
                "forced_id": [forced],
                "plain": await ids(GREEDY, 4, repeating),
                "frequency": await ids(replace(GREEDY, frequency_penalty=2.0), 4, repeating),
                "presence": await ids(replace(GREEDY, presence_penalty=2.0), 4, repeating),
                "repeat": await ids(replace(GREEDY, repeat_penalty=1.8), 4, repeating),
                "again": await ids(GREEDY, 4, repeating),
            }
        finally:
            await client.close()

    got = run(scenario())
    plain, forced = got["plain"], got["forced_id"][0]
    assert got["banned"] != got["first"]
    assert got["forced"] == [forced] * 3 and got["sampled"] == [forced] * 3
    for name in ("frequency", "presence", "repeat"):
        assert got[name] != plain, name
    assert got["again"] == plain  # a penalty leaves nothing behind for the next request
