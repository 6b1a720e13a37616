"""DeepSeek V4's own MTP head as the drafter, on the real engines and a synthetic scaled
`deepseek4` GGUF that carries the MTP block: at temperature 0 the reply is token for token
plain decoding's, the head really drafted (its random weights rarely guess right, so the
equality is what is proved, with drafts verified on the way), the next turn prefills only
its new tokens, and on llama.cpp a refused draft is cut from deepseek4's hybrid memory
exactly (its compressor state rolled back through `n_rs_seq` snapshots).

The file's head is 128 wide, not the indexer's 64: llama.cpp 0.3.36 divides by zero making
an MTP context when they are equal (it creates the indexer's Hadamard rotation for the MTP
context's empty full-attention cache).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.engine.llamacpp.backend import LlamaCppEngine
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


def test_llamacpp_mtp_reply_is_plain_decoding(mtp_gguf: Path) -> None:
    _, plain, _ = _two_turns(LlamaCppEngine(), mtp_gguf, "off")
    names, drafted, stats = _two_turns(LlamaCppEngine(), mtp_gguf, "mtp")
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
