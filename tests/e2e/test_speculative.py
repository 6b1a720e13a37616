"""Speculative decoding on the real engines: the drafts are really verified, the next turn
prefills only its new tokens (so the KV held exactly what was handed out), and at temperature
0 each method's reply is token for token plain decoding's in the same context (on llama.cpp a
speculative context gets flash attention over a q8_0 K, whose verify batches equal one-token
decodes bit for bit: `exact_context` is its plain twin).

These are the engines' mechanisms, not the model's skill, so they run on the tests' tiny chat
model (tests/tiny_model.py: SmolLM2's tokenizer, random Q8_0 weights, so its verify rows are
a quantized model's, as the default model's are). Its greedy replies fall into repeats of
their own tokens, which prompt lookup drafts from; the draft model is the tiny model cut to
its first block (`write_truncated`), which shares its tokenizer: poor guesses, but real ones
from a second model.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.conversations import ConversationStore
from app.engine.host import EngineClient
from app.engine.llamacpp import cpu_buffers
from app.engine.llamacpp.backend import KV_TYPES, LlamaCppEngine, exact_context
from app.engine.llamacpp.quantize import requantize
from app.engine.protocol import (
    FinishReason,
    GenerationStats,
    LoadOptions,
    SamplingParams,
    TokenEvent,
)
from app.models.truncated_gguf import write_truncated
from app.session import ChatSession
from tests.e2e.conftest import both_engines

pytestmark = pytest.mark.e2e

CODE = "\n".join(
    f"def scale_{i}(values, factor):\n    total = [v * factor + {i} for v in values]\n"
    f"    return total\n"
    for i in range(6)
)
EDIT = f"Repeat this code exactly, but rename `total` to `result`:\n```python\n{CODE}```"
FOLLOW_UP = "Now say in one sentence what the functions do."
COPYING = (
    f"<|im_start|>user\n{EDIT}<|im_end|>\n<|im_start|>assistant\n"
    f"```python\n{CODE.splitlines()[0]}\n"
)
SAMPLING = {"temperature": 0.0, "max_tokens": 120}


@pytest.fixture
def model_path(tiny_model: str) -> str:
    """The tiny model on both engines (the module docstring says why)."""
    return tiny_model


@pytest.fixture(scope="session")
def draft_model(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("draft") / "draft-1-layer.gguf"
    return str(write_truncated(Path(tiny_model), out, 1))


async def _conversation(store: ConversationStore, options: LoadOptions, engine: str):
    """Two turns (the code edit, then a follow-up) on an engine with `options`."""
    client = EngineClient(options, backend=engine)
    await client.start()
    try:
        session = ChatSession(store, client)
        conversation = store.create_conversation(sampling=SAMPLING)
        first = await session.send(conversation.id, EDIT)
        second = await session.send(conversation.id, FOLLOW_UP)
        return first, second
    finally:
        await client.close()


@both_engines
@pytest.mark.parametrize("method", ["lookup", "draft"])
def test_speculation_is_exact_and_the_next_turn_prefills_new_tokens_only(
    store: ConversationStore, model_path, draft_model, run, engine, method
):
    spec = LoadOptions(model_path, n_ctx=2048, speculation=method, draft_model=draft_model)
    base = exact_context(spec) if engine == "llama.cpp" else replace(spec, speculation="off")
    plain_first, plain_second = run(_conversation(store, base, engine))
    first, second = run(_conversation(store, spec, engine))

    assert plain_first.stats.drafted_tokens == 0
    if method == "lookup":  # the reply repeats its own tokens: guesses are verified, kept
        assert first.stats.drafted_tokens > 0
        # How many are kept follows the adaptive control, which reads this machine's measured
        # forward times: a count would be a timing assertion. That some were is the bench's.
        assert 0 <= first.stats.accepted_tokens <= first.stats.drafted_tokens
    # (The 1-block draft model is often judged not worth a verify and kept off: no count.)
    # Turn 2 reuses the prompt and reply of turn 1 as the KV holds them: exactly the tokens
    # handed out (the last one too, unless max_tokens cut the reply before it was evaluated).
    held = first.stats.prompt_tokens + len(first.token_ids)
    if first.stats.finish_reason == FinishReason.LENGTH:
        held -= 1
    assert second.stats.reused_tokens == held
    assert second.stats.prefilled_tokens == second.stats.prompt_tokens - held
    assert first.token_ids == plain_first.token_ids
    assert second.token_ids == plain_second.token_ids


def _verify_equals_decodes(engine: LlamaCppEngine, n_prompt: int, n: int) -> bool:
    """Whether the last `n` of `n_prompt` code tokens give, in one verify batch, the logits
    bit for bit that `n` one-token decodes give."""
    prompt = engine.tokenize(CODE * 8, special=False)[:n_prompt]
    assert len(prompt) == n_prompt
    engine.prefill(prompt, slot="a")
    slot = engine._slot("a")
    engine._clear(slot, n_prompt - n)
    rows = engine._verify(slot, prompt[-n:])
    engine._clear(slot, n_prompt - n)
    singles = []
    for token in prompt[-n:]:
        engine._forward(slot, [token], want_logits=True)
        singles.append(engine._logits(slot))
    return bool((rows == np.stack(singles)).all())


@pytest.fixture(params=cpu_buffers.V_TYPES)
def exact_v(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each V type the exact attention may keep, whichever this CPU's verdict chose."""
    verdict = replace(cpu_buffers.machine_verdict(), exact_v=request.param)
    monkeypatch.setattr(cpu_buffers, "machine_verdict", lambda **_: verdict)
    return request.param


def test_verify_rows_equal_one_token_decodes_past_512_cells(model_path: str, exact_v: str) -> None:
    """The speculative context's promise itself, where a one-token decode over an f16 K
    would split the cells across threads (512 or more): eight positions evaluated in one
    verify batch give the logits, bit for bit, that eight one-token decodes give, with the
    V type either CPU's verdict keeps."""
    engine = LlamaCppEngine()
    engine.load(LoadOptions(model_path, n_ctx=2048, snapshots=False))
    try:
        assert engine._cparams.type_v == KV_TYPES[exact_v]
        assert engine._cparams.type_k == KV_TYPES["q8_0"]
        assert _verify_equals_decodes(engine, 900, 8)
    finally:
        engine.unload()


def _greedy(options: LoadOptions, prompt: str) -> tuple[list[int], int]:
    engine = LlamaCppEngine()
    engine.load(options)
    try:
        tokens, drafted = [], 0
        ids = engine.tokenize(prompt, special=True)
        for event in engine.generate(ids, SamplingParams.greedy(), 120, slot="a"):
            if isinstance(event, TokenEvent):
                tokens.append(event.token_id)
            elif isinstance(event, GenerationStats):
                drafted = event.drafted_tokens
        return tokens, drafted
    finally:
        engine.unload()


def test_lookup_equals_plain_decoding_with_either_v_type(
    model_path: str, exact_v: str, unbudgeted: None
) -> None:
    """A CPU whose verdict keeps the other V type gets the same promise: the code edit decoded
    speculatively is the exact context's plain reply token for token. The reply is begun as
    a copy of the code's first line, so prompt lookup guesses from its second token on
    whatever the model writes (a token the copy lacks reads as a renamed one)."""
    spec = LoadOptions(model_path, n_ctx=2048, speculation="lookup")
    plain, _ = _greedy(exact_context(spec), COPYING)
    reply, drafted = _greedy(spec, COPYING)
    assert drafted > 0 and reply == plain


def test_a_plain_context_keeps_the_v_type_asked_for(model_path: str, exact_v: str) -> None:
    engine = LlamaCppEngine()
    engine.load(LoadOptions(model_path, n_ctx=512, speculation="off"))
    try:
        assert (engine._cparams.type_k, engine._cparams.type_v) == (KV_TYPES["f16"],) * 2
    finally:
        engine.unload()


def test_verify_rows_of_16_bit_weights_are_not_trusted_whole(
    model_path: str, tmp_path: Path
) -> None:
    """A BF16 copy of the tiny model: its verify rows are not a decode's (llamafile's sgemm
    takes the batch), so the engine does not trust them whole and decides near ties by
    one-token decodes; the tiny model's own Q8_0 ones it trusts."""
    copy = requantize(Path(model_path), tmp_path / "bf16.gguf", "bf16")
    trusted = {}
    for name, path in (("bf16", copy), ("q8_0", model_path)):
        engine = LlamaCppEngine()
        engine.load(LoadOptions(str(path), n_ctx=2048, snapshots=False))
        try:
            trusted[name] = engine._verify_exact
            assert _verify_equals_decodes(engine, 300, 4) == (name == "q8_0")
        finally:
            engine.unload()
    assert trusted == {"bf16": False, "q8_0": True}
