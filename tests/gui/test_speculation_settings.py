"""Speculative decoding in the window, on the real engine and the tests' tiny model (whose
greedy repeats lookup drafts from; tests/tiny_model.py) and its first block as the draft
model: the status line shows the last reply's decode speed and the share of its drafts the
model kept, both read from that reply's own stats (and nothing about drafts when it drafted
nothing); Settings > Speculative Decoding offers the library's compatible draft models and
"None", and saving reloads the engine with the chosen method and draft model at once."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from pytestqt.qtbot import QtBot

from app import paths
from app.models.default import default_model_path
from app.models.truncated_gguf import write_truncated
from app.settings import Settings
from app.ui.main_window import MainWindow, stats_line
from app.ui.message_widget import stats_summary
from app.ui.speculation_dialog import NONE_TEXT, SpeculationDialog
from tests.e2e.test_speculative import EDIT
from tests.gui.harness import Harness


def _send(harness: Harness, text: str, max_tokens: int) -> dict:
    """Paste `text` into the composer and press Enter; the stored reply's stats."""
    window = harness.window
    window.store.set_sampling(window.conversation_id, {"temperature": 0, "max_tokens": max_tokens})
    editor = window.composer.editor

    def paste_and_send() -> None:
        editor.setFocus()
        editor.setPlainText(text)
        QTest.keyClick(editor, Qt.Key.Key_Return)

    harness.act(paste_and_send)
    harness.turn()
    last = window.store.current_path(window.conversation_id)[-1]
    assert last.role == "assistant" and last.status == "complete"
    return last.stats


def _save(harness: Harness, dialog: SpeculationDialog, method: str, draft: str | None) -> None:
    """Choose and save; wait out the reload that saving starts."""
    dialog.method.setCurrentIndex(dialog.method.findData(method))
    dialog.draft.setCurrentIndex(dialog.draft.findData(draft))
    harness.act(dialog.buttons.button(dialog.buttons.StandardButton.Save).click)
    task = harness.window.model_switcher.reloading
    assert task is not None
    harness.run(asyncio.shield(task))


def _draft_rows(dialog: SpeculationDialog) -> list[tuple[str, str | None]]:
    return [
        (dialog.draft.itemText(i), dialog.draft.itemData(i)) for i in range(dialog.draft.count())
    ]


def _open(harness: Harness, window: MainWindow) -> SpeculationDialog:
    dialog = window.open_speculation_settings()
    harness.wait_until(lambda: dialog.scans > 0)
    return dialog


def test_status_line_shows_the_replys_decode_speed_and_drafts_kept(
    harness: Harness, tiny_model: str
) -> None:
    # The tests' tiny model (tests/tiny_model.py), as tests/e2e/test_speculation_stats.py:
    # lookup drafts from the repeats its greedy reply falls into; the line is what is proven.
    window = harness.start(tiny_model, n_ctx=2048, speculation="lookup")
    stats = _send(harness, EDIT, 120)
    assert stats["drafted_tokens"] > 0
    kept = stats["accepted_tokens"] / stats["drafted_tokens"]
    assert 0 <= kept <= 1
    line = window.status.text()
    assert f"decode {stats['decode_tok_s']:,.0f} tok/s" in line
    assert f"drafts {kept:.0%} accepted" in line
    harness.act(window.reload)  # reopened, the line comes from the stored stats alike
    assert f"drafts {kept:.0%} accepted" in window.status.text()

    # Speculation off, from Settings: the engine reloads without it, and says nothing of drafts
    dialog = _open(harness, window)
    _save(harness, dialog, "off", None)
    assert window.session.engine.options.speculation == "off"
    assert Settings.load().speculation == "off"
    plain = _send(harness, "Say hello.", 8)
    assert plain["drafted_tokens"] == 0
    line = window.status.text()
    assert f"decode {plain['decode_tok_s']:,.0f} tok/s" in line and "drafts" not in line


def test_settings_offer_the_librarys_drafts_and_apply_the_chosen_one(
    harness: Harness, tiny_model: str
) -> None:
    # The tests' tiny model and its first block as its draft (tests/e2e/test_speculative.py's
    # pair): what is proven is the offer, the reload and the saved choice, not the words.
    models = paths.models_dir()
    models.mkdir(parents=True, exist_ok=True)
    target = shutil.copyfile(tiny_model, models / "tiny-chat.gguf")  # drafts are the library's
    draft = write_truncated(target, models / "tiny-draft-1.gguf", 1)
    window = harness.start(str(target), n_ctx=2048, speculation="off")
    dialog = _open(harness, window)
    rows = _draft_rows(dialog)
    assert rows[0] == (NONE_TEXT, None)
    assert [data for _, data in rows[1:]] == [str(draft)]  # the loaded model is not its own
    assert rows[1][0].startswith("tiny-draft-1")
    assert "1 model of the library can draft" in dialog.status.text()
    _save(harness, dialog, "draft", str(draft))
    options = window.session.engine.options
    assert (options.speculation, options.draft_model) == ("draft", str(draft))
    assert window.session.engine.info is not None  # the model reloaded with them
    saved = Settings.load()
    assert (saved.speculation, saved.draft_model) == ("draft", str(draft))
    _send(harness, "Say hello.", 8)
    dialog = _open(harness, window)  # opened again, the saved choices are shown
    assert dialog.method.currentData() == "draft" and dialog.draft.currentData() == str(draft)


def test_the_draft_method_needs_a_draft_model(qtbot: QtBot, stoke_home: Path) -> None:
    dialog = SpeculationDialog(str(default_model_path()))
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.scans > 0, timeout=60_000)
    assert _draft_rows(dialog) == [(NONE_TEXT, None)]  # nothing smaller shares its tokenizer
    assert "No smaller model of the library" in dialog.status.text()
    dialog.method.setCurrentIndex(dialog.method.findData("draft"))
    dialog.save()
    assert "Choose a draft model" in dialog.status.text()
    assert not dialog.result() and Settings.load().speculation == "auto"  # nothing saved


def test_a_reply_that_kept_no_drafts_says_so_plainly() -> None:
    """Not "drafts 0% accepted", which read as a failure (issue 36 item 8)."""
    stats = {
        "ttft_s": 0.1,
        "prefill_tok_s": 100.0,
        "decode_tok_s": 20.0,
        "reused_tokens": 0,
        "prompt_tokens": 30,
        "drafted_tokens": 12,
        "accepted_tokens": 0,
    }
    for line in (stats_line(stats), stats_summary(stats)):
        assert "no drafts kept" in line and "0%" not in line
    kept_one = {**stats, "drafted_tokens": 400, "accepted_tokens": 1}
    assert "drafts <1% accepted" in stats_line(kept_one)
    assert "drafts 50% accepted" in stats_line({**stats, "accepted_tokens": 6})
