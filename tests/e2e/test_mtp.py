"""DeepSeek V4's own MTP head as the drafter, on the real engines and a synthetic scaled
`deepseek4` GGUF that carries the MTP block: at temperature 0 the reply is token for token
plain decoding's, the head really drafted (its random weights rarely guess right, so the
equality is what is proved, with drafts verified on the way; the loss budget, which would
rightly stop a head that never pays, is lifted for it), the next turn prefills only
its new tokens, and on llama.cpp a refused draft is cut from deepseek4's hybrid memory
exactly (its compressor state rolled back through `n_rs_seq` snapshots).

The file's head is 128 wide, not the indexer's 64: llama.cpp 0.3.36 divides by zero making
an MTP context when they are equal (it creates the indexer's Hadamard rotation for the MTP
context's empty full-attention cache).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from app.engine.llamacpp.backend import LlamaCppEngine
from app.engine.mlx.backend import MlxEngine
from app.engine.protocol import GenerationStats, LoadOptions, SamplingParams, TokenEvent
from app.hardware.synthetic_gguf import write_deepseek4

pytestmark = pytest.mark.e2e

PROMPT = np.random.default_rng(7).integers(2, 512, 100).tolist()


@pytest.fixture(scope="module")
def mtp_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mtp") / "dsv4-mtp.gguf"
    return write_deepseek4(path, mode="scaled", seed=4, weights="f32", mtp=True, head_dim=128)


def _options(path: Path, speculation: str) -> LoadOptions:
    return LoadOptions(
        str(path), n_ctx=512, n_batch=64, n_seq_max=2, snapshots=False, speculation=speculation
    )


def _reply(engine, tokens: list[int], n: int) -> tuple[list[int], GenerationStats]:
    out, stats = [], None
    for event in engine.generate(tokens, SamplingParams.greedy(), n):
        if isinstance(event, TokenEvent):
            out.append(event.token_id)
        else:
            stats = event
    return out, stats


def _two_turns(engine, path: Path, speculation: str):
    engine.load(_options(path, speculation))
    try:
        names = [d.name for d in engine._drafters]
        first, one = _reply(engine, PROMPT, 40)
        follow_up = [*PROMPT, *first, 5, 6, 7]
        second, two = _reply(engine, follow_up, 20)
    finally:
        engine.unload()
    return names, (first, second), (one, two)


@pytest.mark.parametrize("runtime", [LlamaCppEngine, MlxEngine])
@pytest.mark.usefixtures("unbudgeted")
def test_mtp_reply_is_plain_decoding(mtp_gguf: Path, runtime) -> None:
    _, plain, _ = _two_turns(runtime(), mtp_gguf, "off")
    names, drafted, stats = _two_turns(runtime(), mtp_gguf, "mtp")
    assert names == ["mtp"]
    assert drafted == plain
    assert sum(s.drafted_tokens for s in stats) > 0
    # the second turn evaluates the 3 new tokens and the reply's last (handed out, not kept)
    assert stats[1].prefilled_tokens == 4
    assert stats[1].reused_tokens == len(PROMPT) + len(plain[0]) - 1


def test_llamacpp_deepseek4_cuts_a_refused_draft_exactly(mtp_gguf: Path) -> None:
    """A verify of four tokens cut back by three, then the next token: the logits are those
    of an engine that only ever saw the kept one."""
    engine = LlamaCppEngine()
    engine.load(_options(mtp_gguf, "mtp"))
    try:
        assert engine._speculates  # deepseek4's hybrid memory, through its rollback
        slot = engine._slot("a")
        engine._sync(slot, PROMPT, None)
        engine._verify(slot, [11, 12, 13, 14])
        assert engine._clear(slot, len(PROMPT) + 1) == len(PROMPT) + 1
        cut = engine._verify(slot, [21, 22])
        fresh = engine._slot("b")
        engine._sync(fresh, [*PROMPT, 11], None)
        straight = engine._verify(fresh, [21, 22])
    finally:
        engine.unload()
    np.testing.assert_allclose(cut, straight, rtol=1e-5, atol=1e-5)


def test_llamacpp_deepseek4_starts_over_past_its_last_forward(mtp_gguf: Path) -> None:
    """Three tokens decoded one by one, then cut back by two: the snapshots only cover the
    last forward, so the engine starts the sequence over (and the next prefill is right)."""
    engine = LlamaCppEngine()
    engine.load(_options(mtp_gguf, "mtp"))
    try:
        slot = engine._slot("a")
        engine._sync(slot, PROMPT, None)
        for token in (11, 12, 13):
            engine._forward(slot, [token], want_logits=True)
        assert engine._clear(slot, len(PROMPT) + 1) == 0
        engine._sync(slot, [*PROMPT, 11], None)
        again = engine._verify(slot, [21, 22])
        fresh = engine._slot("b")
        engine._sync(fresh, [*PROMPT, 11], None)
        straight = engine._verify(fresh, [21, 22])
    finally:
        engine.unload()
    np.testing.assert_allclose(again, straight, rtol=1e-5, atol=1e-5)


@pytest.mark.xfail(
    reason="4 of 41,984 target hidden values (one row, 4 adjacent columns) differ by up to 2.0 "
    "between MLX and llama.cpp before the MTP forward is reached: not yet explained",
    strict=False,
)
def test_mtp_head_agrees_between_engines(tmp_path: Path) -> None:
    """Both engines' target hidden states over a prompt, and both MTP blocks' logits and
    output states for the same entries (llama.cpp's states fed to both), agree. As in
    test_deepseek_v4_logits.py: F32 caches, and an indexer that attends every row (with 16
    heads), so the two differ only by summation order."""
    path = write_deepseek4(
        tmp_path / "dsv4-exact.gguf",
        mode="scaled",
        seed=4,
        weights="f32",
        mtp=True,
        head_dim=128,
        indexer_heads=16,
        indexer_top_k=512,
    )
    n, start = len(PROMPT), len(PROMPT) - 40
    seen = {}
    for runtime in (LlamaCppEngine, MlxEngine):
        engine = runtime()
        engine.load(replace(_options(path, "mtp"), kv_type="f32"))
        try:
            slot = engine._slot("a")
            engine._sync(slot, PROMPT, None)
            rows = slot.hidden.get(start - 1, n)
            states = seen.get("states", rows)
            if runtime is MlxEngine:
                states = [mx.array(row) for row in states]
            (head,) = [d._head for d in engine._drafters]
            logits, out = head.step("a", start, [*PROMPT[start:], 9], states)
            seen.setdefault("states", [np.array(row) for row in rows])
            seen[runtime] = ([np.array(row) for row in rows], logits, np.array(out))
        finally:
            engine.unload()
    (h_cpp, logits_cpp, out_cpp), (h_mlx, logits_mlx, out_mlx) = (
        seen[LlamaCppEngine],
        seen[MlxEngine],
    )
    np.testing.assert_allclose(np.stack(h_mlx), np.stack(h_cpp), atol=1e-3, rtol=1e-3)
    np.testing.assert_allclose(logits_mlx, logits_cpp, atol=1e-3, rtol=1e-3)
    np.testing.assert_allclose(out_mlx, out_cpp, atol=1e-3, rtol=1e-3)
    assert int(np.argmax(logits_mlx)) == int(np.argmax(logits_cpp))


def test_llamacpp_skips_the_head_it_would_crash_on(tmp_path: Path) -> None:
    """A head as wide as the indexer's: llama.cpp would die of SIGFPE making the MTP context,
    so the engine decodes without the head instead."""
    path = write_deepseek4(tmp_path / "narrow.gguf", mode="scaled", seed=4, mtp=True)
    engine = LlamaCppEngine()
    engine.load(_options(path, "mtp"))
    try:
        assert engine._drafters == []
        assert len(_reply(engine, PROMPT, 4)[0]) == 4
    finally:
        engine.unload()
