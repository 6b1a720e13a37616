"""The context meter beside the composer, on the real engine: its numbers are the tokens the
engine holds for the history and the draft, it follows typing, and it warns before the
context overflows and says so when the message would not fit."""

from __future__ import annotations

from PySide6.QtTest import QTest

from tests.gui.harness import Harness


def test_the_meter_counts_what_the_engine_holds_as_the_user_types(harness: Harness) -> None:
    window = harness.start()
    cid = window.conversation_id
    window.store.set_sampling(cid, {"temperature": 0, "max_tokens": 12})
    meter = window.draft_files.bar.meter
    n_ctx = window.session.engine.info.n_ctx
    harness.type_and_send("Name three colours.")
    harness.turn()
    harness.run(window.prewarm.idle())
    stats = window.turn.result().stats
    history = stats.prompt_tokens + stats.generated_tokens  # the engine's counts of the turn
    assert meter.tokens == history > 0
    assert meter.text() == f"{history:,} / {n_ctx:,} tokens" and meter.level == "ok"

    def typed(text: str) -> None:
        harness.act(lambda: QTest.keyClicks(window.composer.editor, text))
        harness.run(window.prewarm.idle())

    typed("Now name three animals ")
    held = harness.run(window.session.engine.resident_tokens(cid))
    draft = window.session.engine.local_tokenizer().tokenize("Now name three animals")
    assert meter.tokens == len(held) > history + len(draft)  # the user turn's header too
    assert held[-len(draft) :] == draft  # the engine holds the draft's own tokens last
    typed("that live in the sea ")
    longer = meter.tokens
    assert longer == len(harness.run(window.session.engine.resident_tokens(cid))) > len(held)

    harness.act(lambda: QTest.keyClick(window.composer.editor, "\r"))  # Enter sends
    harness.turn()
    assert window.turn.result().stats.reused_tokens == longer  # the count the engine reused


def test_the_meter_warns_before_the_context_fills_and_says_when_it_would_not_fit(
    harness: Harness,
) -> None:
    window = harness.start(n_ctx=512)
    meter = window.draft_files.bar.meter
    tokenizer = window.session.engine.local_tokenizer()
    words = "lighthouse " * 440  # each word one token or so: past 85% of 512
    assert 0.85 * 512 < len(tokenizer.tokenize(words)) < 500
    harness.act(lambda: window.composer.editor.setPlainText(words))
    harness.wait_until(lambda: meter.level == "warn")
    assert "full" in meter.toolTip() and meter.tokens <= 512
    harness.act(lambda: window.composer.editor.setPlainText(words * 2))
    harness.wait_until(lambda: meter.level == "full")
    assert meter.text().endswith("· too long")
    assert "would not fit" in meter.toolTip() and f"{meter.tokens:,} tokens" in meter.toolTip()
