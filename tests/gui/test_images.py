"""Images in the window, on the real engine with the tests' tiny vision model: a picture
pasted and a WebP dropped become chips with thumbnails and their token counts, read before
the question is typed (after Enter only the question is); the bubble shows them, a click
opens one large, and an exported and imported conversation shows them again."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QApplication, QToolButton, QWidget

from app.models.default import default_model_path
from app.ui.image_view import ImageView
from app.ui.main_window import MainWindow
from tests.gui.harness import Harness
from tests.gui.test_attachments import TAIL_TOKENS, attached, bubble_chips, chip_texts, drop
from tests.tiny_model import write_tiny_chat_model
from tests.tiny_vision import IMAGE_TOKENS, write_tiny_vision_model


@pytest.fixture
def vision_model(tmp_path: Path) -> str:
    chat = write_tiny_chat_model(default_model_path(), tmp_path / "tiny-chat.gguf")
    return str(write_tiny_vision_model(chat, tmp_path / "vision"))


def bubble(window: MainWindow, message_id: str) -> QWidget:
    for widget in window.chat.findChildren(QWidget, "message"):
        if widget.property("messageId") == message_id:
            return widget
    raise LookupError(message_id)


def thumbnails(widget: QWidget) -> list[QToolButton]:
    return widget.findChildren(QToolButton, "attachment-thumbnail")


def test_pasted_and_dropped_pictures_are_chips_read_before_enter_and_shown_in_the_bubble(
    harness: Harness, vision_model: str, tmp_path: Path
) -> None:
    window = harness.start(vision_model, n_ctx=2048)
    cid = window.conversation_id
    window.store.set_sampling(cid, {"temperature": 0, "max_tokens": 6})
    pasted = QImage(64, 48, QImage.Format.Format_RGB32)
    pasted.fill(QColor(200, 30, 30))
    QApplication.clipboard().setImage(pasted)
    harness.act(window.composer.editor.paste)
    attached(harness, window, 1)
    webp = tmp_path / "pond.webp"
    Image.new("RGB", (120, 80), (30, 30, 200)).save(webp, "WEBP")
    assert drop(window, [webp])
    attached(harness, window, 2)
    harness.wait_until(lambda: all(r["tokens"] for r in window.draft_files.records()))
    records = window.draft_files.records()
    assert [r["name"] for r in records] == ["Pasted image.png", "pond.webp"]
    assert [r["kind"] for r in records] == ["image", "image"]
    chips = [f"Pasted image.png · {IMAGE_TOKENS} tokens", f"pond.webp · {IMAGE_TOKENS} tokens"]
    assert chip_texts(window.draft_files.bar) == [f"{chip} · ready" for chip in chips]
    assert len(thumbnails(window.draft_files.bar)) == 2
    expected = window.session.draft_tokens(cid, "", records)
    assert harness.run(window.session.engine.resident_tokens(cid)) == expected

    question = "Which picture is blue?"
    result = harness.run(window.send_message(question))
    words = len(window.session.engine.local_tokenizer().tokenize(question))
    assert result.stats.reused_tokens == len(expected)
    assert result.stats.prefilled_tokens <= words + TAIL_TOKENS
    user = window.store.current_path(cid)[0]
    assert user.attachments == records
    shown = bubble(window, user.id)
    assert chip_texts(shown) == chips and len(thumbnails(shown)) == 2

    viewer = thumbnails(shown)[1].parent().view()
    assert isinstance(viewer, ImageView) and viewer.isVisible()
    picture = viewer.picture.pixmap()
    assert (picture.width(), picture.height()) == (120, 80)  # never scaled up
    harness.act(viewer.close)

    export = tmp_path / "export.json"
    harness.act(lambda: window.export_to(export, "json"))
    harness.act(lambda: window.import_from(export))
    imported = window.store.current_path(window.conversation_id)[0]
    assert window.conversation_id != cid and imported.attachments == records
    assert bubble_chips(window, imported.id) == chips
    assert len(thumbnails(bubble(window, imported.id))) == 2
