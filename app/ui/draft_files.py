"""The files of the draft being written: attach, drop, paste, prefill, count, send.

Owns the bar above the composer (app/ui/attachments.py) for the main window: a file dropped
on the window or chosen with the paperclip, or a picture pasted into the composer, is read
off the UI thread and prefilled at once (Prewarmer.attached), so its tokens are in the KV
before the question is typed (an image is read by the model's projector then, and its chip
shows what it costs), and each chip says how far it is read, from the prefill's chunks
(Prewarmer.on_files); each conversation keeps its own draft files; the context meter shows
the prewarm's count. An image attached for a model that reads text only is kept, and the
banner says where a projector comes from. A `.gguf` dropped on the window goes to the
library through the Models page's import. The window hands itself as a `DraftWindow`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QImage

from app.conversations.attachments import is_image
from app.engine.images import no_vision
from app.ui.attachments import AttachmentBar

if TYPE_CHECKING:
    from app.engine.prewarm import Prewarmer
    from app.engine.protocol import PrefillProgress
    from app.session import ChatSession
    from app.ui.banner import Banner
    from app.ui.composer import Composer
    from app.ui.models import ModelsDialog

MODEL_SUFFIX = ".gguf"
PASTED_NAME = "Pasted image.png"


def dropped_paths(event: QDropEvent | QDragEnterEvent) -> list[Path]:
    """The local files of a drag: all are taken, so a file Stoke cannot attach is refused in
    words rather than by a drop that silently does nothing."""
    mime = event.mimeData()
    if not mime.hasUrls():
        return []
    return [Path(url.toLocalFile()) for url in mime.urls() if url.isLocalFile()]


class DraftWindow(Protocol):
    """The main window as its draft files use it: the widget files are dropped on, with its
    composer and banner, the session and its prewarming, the open conversation and the
    Models page."""

    session: ChatSession
    prewarm: Prewarmer
    composer: Composer
    banner: Banner
    conversation_id: str | None

    def new_conversation(self) -> None: ...

    def open_models(self) -> ModelsDialog: ...

    def draft_warmed(self, task: asyncio.Task, draft: str) -> None: ...

    def setAcceptDrops(self, on: bool) -> None: ...

    def installEventFilter(self, watcher: QObject) -> None: ...


class DraftFiles(QObject):
    """The draft's attachments for `window`, and where files dropped on it go."""

    def __init__(self, window: DraftWindow) -> None:
        super().__init__(window)
        self.window = window
        self.bar = AttachmentBar(window)
        self.bar.tokenizer = self._tokenizer
        self._pending: dict[str, list[dict[str, Any]]] = {}  # conversation -> draft files
        self.bar.changed.connect(self._changed)
        self.bar.failed.connect(lambda words: window.banner.show_message(words))
        self.bar.reading.connect(window.composer.hold_send)  # sent now, it would go without
        window.prewarm.on_count = self._counted
        window.prewarm.on_files = self._files_read
        window.composer.editor.image_pasted.connect(self.paste)
        window.setAcceptDrops(True)
        for target in (window, window.composer.editor.viewport()):
            target.installEventFilter(self)

    def records(self) -> list[dict[str, Any]]:
        """The open conversation's draft files, as the message will store them."""
        return self.bar.records()

    def switch(self, conversation_id: str) -> None:
        """Show `conversation_id`'s draft files (the ones of the one left stay with it)."""
        self.bar.set_records(self._pending.get(conversation_id, []))

    def take(self) -> list[dict[str, Any]]:
        """The draft files for a send: they leave the bar and go with the message."""
        records = self.records()
        self._pending.pop(self.window.conversation_id or "", None)
        self.bar.set_records([])
        return records

    def refresh(self) -> None:
        """Count the open conversation again (after a turn changed its history)."""
        window = self.window
        if window.conversation_id is not None:
            window.prewarm.draft_changed(
                window.conversation_id, window.composer.text(), self.records()
            )

    def drop(self, paths: list[Path]) -> None:
        """Attach the files, import the models, of a drop."""
        for path in paths:
            if path.suffix.lower() == MODEL_SUFFIX:
                self.window.open_models().import_model(path)
            else:
                self.bar.attach(path)

    def paste(self, image: QImage) -> None:
        """Attach a picture from the clipboard (as a PNG, like an image file)."""
        self.bar.attach_image(PASTED_NAME, image)

    # -- internals --

    def _tokenizer(self) -> Any:
        engine = self.window.session.engine
        return engine.local_tokenizer() if engine.info is not None else None

    def _changed(self, records: list[dict[str, Any]]) -> None:
        window = self.window
        if window.conversation_id is None:
            window.new_conversation()  # which shows its (empty) draft files: show these again
            self.bar.set_records(records)
        conversation_id = window.conversation_id
        before = {r.get("digest") for r in self._pending.get(conversation_id, [])}
        self._pending[conversation_id] = records
        info = window.session.engine.info
        added = any(is_image(r) and r["digest"] not in before for r in records)
        if added and info is not None and info.projector is None:
            window.banner.show_message(no_vision(info))
        task = window.prewarm.attached(conversation_id, window.composer.text(), records)
        draft = window.composer.text()
        task.add_done_callback(lambda done: window.draft_warmed(done, draft))
        task.add_done_callback(lambda _done: self._count_images(conversation_id))

    def _count_images(self, conversation_id: str) -> None:
        """Put each image's token count on its record and chip once the projector read it."""
        session = self.window.session
        records = self._pending.get(conversation_id, [])
        counts = {
            r["digest"]: n
            for r in records
            if is_image(r) and (n := session.image_tokens(r["digest"])) is not None
        }
        for record in records:
            if is_image(record) and record["digest"] in counts:
                record["tokens"] = counts[record["digest"]]
        if conversation_id == self.window.conversation_id:
            self.bar.set_tokens(counts)

    def _counted(self, conversation_id: str, tokens: int) -> None:
        if conversation_id == self.window.conversation_id:
            info = self.window.session.engine.info
            self.bar.meter.set_counts(tokens, info.n_ctx if info is not None else 0)

    def _files_read(
        self, conversation_id: str, files: Sequence[Mapping[str, Any]], read: list[PrefillProgress]
    ) -> None:
        if conversation_id == self.window.conversation_id:
            self.bar.show_read(files, read)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove) and dropped_paths(event):
            event.acceptProposedAction()
            return True
        if kind == QEvent.Type.Drop and (paths := dropped_paths(event)):
            event.acceptProposedAction()
            self.drop(paths)
            return True
        return super().eventFilter(watched, event)
