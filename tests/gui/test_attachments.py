"""Attachments in the window, on the real engine: a dropped file is prefilled before the
question is typed (the engine's counters say so), shown as chips, stored with the message,
exported and imported; a PDF's text is read; a dropped .gguf goes to the library. The
engine runs the tests' tiny model (tests/tiny_model.py: SmolLM2's tokenizer and template,
random weights): what is proven is the tokens the engine holds and reads, the chips and the
records, never the reply's words; SmolLM2's prefills of the file took most of a minute."""

from __future__ import annotations

import json
import re
from pathlib import Path

from PIL import Image
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog, QLabel, QWidget

from app.engine.protocol import USER_CHUNK, FinishReason
from app.models.library import Library
from app.ui.main_window import MainWindow
from tests.gui.harness import Harness
from tests.pdfs import write_pdf
from tests.unit.test_library import write_gguf

TAIL_TOKENS = 8  # the turn's closing template tokens (end of turn, the reply's header)


def drop(target: QWidget, paths: list[Path]) -> bool:
    """Drag `paths` onto `target` and drop them, as a file manager does; whether accepted."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    centre = target.rect().center()
    buttons, keys = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    enter = QDragEnterEvent(QPoint(centre), Qt.DropAction.CopyAction, mime, buttons, keys)
    QApplication.sendEvent(target, enter)
    event = QDropEvent(QPointF(centre), Qt.DropAction.CopyAction, mime, buttons, keys)
    QApplication.sendEvent(target, event)
    return enter.isAccepted() and event.isAccepted()


def chip_texts(widget: QWidget) -> list[str]:
    return [
        label.text()
        for label in widget.findChildren(QLabel, "attachment-name")
        if label.isVisibleTo(widget)
    ]


def bubble_chips(window: MainWindow, message_id: str) -> list[str]:
    for widget in window.chat.findChildren(QWidget, "message"):
        if widget.property("messageId") == message_id:
            return chip_texts(widget)
    raise LookupError(message_id)


def document(folder: Path, lines: int = 60) -> Path:
    path = folder / "keeper-notes.md"
    body = "\n".join(
        f"- Night {i}: the keeper trimmed the wick, wound the clock and logged a {w} wind."
        for i, w in zip(range(lines), ["north", "west", "salt", "calm"] * lines, strict=False)
    )
    path.write_text(f"# Lighthouse log\n\n{body}\n", "utf-8")
    return path


def attached(harness: Harness, window: MainWindow, count: int) -> list[dict]:
    harness.wait_until(lambda: len(window.draft_files.records()) == count)
    harness.run(window.prewarm.idle())
    return window.draft_files.records()


def test_a_dropped_file_is_prefilled_before_the_question_and_only_the_question_after_enter(
    harness: Harness, tmp_path: Path, tiny_model: str
) -> None:
    window = harness.start(tiny_model)
    cid = window.conversation_id
    window.store.set_sampling(cid, {"temperature": 0, "max_tokens": 8})
    assert drop(window, [document(tmp_path)])
    records = attached(harness, window, 1)
    assert records[0]["name"] == "keeper-notes.md" and records[0]["tokens"] > 500
    assert chip_texts(window.draft_files.bar) == [
        f"keeper-notes.md · {records[0]['tokens']:,} tokens · ready"
    ]

    # Before any question is typed, the engine holds the file's tokens in the conversation.
    expected = window.session.draft_tokens(cid, "", records)
    prefill = window.prewarm.last[cid]
    assert prefill.finish_reason == FinishReason.PREFILLED
    assert prefill.prompt_tokens == len(expected) > records[0]["tokens"]
    assert harness.run(window.session.engine.resident_tokens(cid)) == expected
    assert window.draft_files.bar.meter.tokens == len(expected)

    question = "On which nights was the wind calm?"
    result = harness.run(window.send_message(question))
    stats = result.stats
    question_tokens = len(window.session.engine.local_tokenizer().tokenize(question))
    assert stats.reused_tokens == len(expected)  # the file was not read again
    assert stats.prefilled_tokens == stats.prompt_tokens - len(expected)
    assert stats.prefilled_tokens <= question_tokens + TAIL_TOKENS

    user = window.store.current_path(cid)[0]
    assert user.content == question and user.attachments == records
    assert window.draft_files.records() == [] and chip_texts(window.draft_files.bar) == []
    chip = f"keeper-notes.md · {records[0]['tokens']:,} tokens"
    assert bubble_chips(window, user.id) == [chip]

    # Exported and imported, the message keeps its file and shows its chip.
    export = tmp_path / "export.json"
    harness.act(lambda: window.export_to(export, "json"))
    assert json.loads(export.read_text())["messages"][0]["attachments"] == records
    harness.act(lambda: window.import_from(export))
    imported = window.store.current_path(window.conversation_id)[0]
    assert window.conversation_id != cid and imported.attachments == records
    assert bubble_chips(window, imported.id) == [chip]


def test_a_files_chip_says_how_far_it_is_read_then_ready(
    harness: Harness, tmp_path: Path, tiny_model: str
) -> None:
    """Issue 36 item 5: the draft's prefill reports its chunks through the engine host, and
    the chip shows them as its file's own progress, then "ready" (it showed nothing)."""
    window = harness.start(tiny_model)
    bar = window.draft_files.bar
    seen: list[list[str]] = []
    told = window.prewarm.on_files
    narrowest = window.minimumSizeHint().width()
    widths: list[int] = []
    chip_widths: list[int] = []  # what each reading chip asks for

    def watch(conversation_id: str, files: list[dict], read: list) -> None:
        told(conversation_id, files, read)
        seen.append(chip_texts(bar))
        widths.append(window.minimumSizeHint().width())
        if "reading" in seen[-1][0]:
            chip_widths.append(bar._chips[0].sizeHint().width())

    window.prewarm.on_files = watch
    assert drop(window, [document(tmp_path, lines=80)])
    [record] = attached(harness, window, 1)
    tokens = record["tokens"]
    assert tokens > 5 * USER_CHUNK  # read in several chunks
    reading = [
        re.fullmatch(r"keeper-notes\.md · reading ([\d,]+) / ([\d,]+) tokens", t) for [t] in seen
    ]
    done = [int(m[1].replace(",", "")) for m in reading if m]
    assert len(done) >= 3 and done == sorted(set(done)) and done[-1] < tokens
    assert {m[2] for m in reading if m} == {f"{tokens:,}"}
    ready = f"keeper-notes.md · {tokens:,} tokens · ready"
    assert seen[-1] == [ready] and chip_texts(bar) == [ready]
    assert max(widths) <= narrowest  # the longer words never widen the window
    assert len(set(chip_widths)) == 1  # room kept for the widest count: the chip holds still


def test_the_paperclip_reads_a_pdf_removes_files_and_refuses_in_words(
    harness: Harness, tmp_path: Path, monkeypatch, tiny_model: str
) -> None:
    window = harness.start(tiny_model)
    pdf = write_pdf(tmp_path / "manual.pdf", [["Press the red button twice."], ["Then wait."]])
    locked = write_pdf(tmp_path / "locked.pdf", [["secret"]], password="pw")
    chosen = [str(pdf)]
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: (chosen, ""))
    harness.act(window.draft_files.bar.attach_button.click)
    records = attached(harness, window, 1)
    assert records[0]["kind"] == "pdf"
    assert records[0]["text"] == "Press the red button twice.\n\nThen wait."
    with_file = window.draft_files.bar.meter.tokens

    chosen[:] = [str(locked)]
    harness.act(window.draft_files.bar.attach_button.click)
    harness.wait_until(lambda: window.banner.isVisible())
    assert "locked.pdf is a password-protected PDF" in window.banner.text.text()
    assert len(window.draft_files.records()) == 1

    remove = window.draft_files.bar.findChildren(QWidget, "attachment-chip")[0].remove_button
    harness.act(remove.click)
    harness.run(window.prewarm.idle())
    assert window.draft_files.records() == []
    assert window.draft_files.bar.meter.tokens < with_file


def test_files_dropped_on_the_composer_attach_and_a_gguf_goes_to_the_library(
    harness: Harness, tmp_path: Path, tiny_model: str
) -> None:
    window = harness.start(tiny_model)
    notes = tmp_path / "todo.txt"
    notes.write_text("buy rope\nfix the lamp\n", "utf-8")
    assert drop(window.composer.editor.viewport(), [notes])
    assert attached(harness, window, 1)[0]["text"] == "buy rope\nfix the lamp\n"
    assert window.composer.text() == ""  # the path was not pasted as text
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(b"\xff\xd8\xff")
    assert drop(window, [photo])
    harness.wait_until(lambda: window.banner.isVisible())
    assert "photo.jpg is damaged or not an image" in window.banner.text.text()
    # a real picture for a model that reads text only: kept, and the banner says why and
    # where a projector comes from
    harness.act(window.banner.hide)
    Image.new("RGB", (40, 30), (200, 200, 0)).save(tmp_path / "lamp.png")
    assert drop(window, [tmp_path / "lamp.png"])
    harness.wait_until(lambda: window.banner.isVisible())
    assert "reads text only" in window.banner.text.text()
    assert "mmproj" in window.banner.text.text()
    assert [r["kind"] for r in window.draft_files.records()] == ["text", "image"]

    model = write_gguf(tmp_path / "tiny-model.gguf")[0]
    assert drop(window, [model])
    harness.wait_until(lambda: any(m.path.name == model.name for m in Library().models()))
    assert len(window.draft_files.records()) == 2  # a model is no attachment
