"""The files of the draft being written: attach, drop, prefill, count, send.

Owns the bar above the composer (app/ui/attachments.py) for the main window: a file dropped
on the window or chosen with the paperclip is read off the UI thread and prefilled at once
(Prewarmer.attached), so its tokens are in the KV before the question is typed; each
conversation keeps its own draft files; the context meter shows the prewarm's count. A
`.gguf` dropped on the window goes to the library through the Models page's import. The
window hands itself as a `DraftWindow`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QDragEnterEvent, QDropEvent

from app.ui.attachments import AttachmentBar

if TYPE_CHECKING:
    from app.engine.prewarm import Prewarmer
    from app.session import ChatSession
    from app.ui.banner import Banner
    from app.ui.composer import Composer
    from app.ui.models import ModelsDialog

MODEL_SUFFIX = ".gguf"


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
        self._pending[conversation_id] = records
        task = window.prewarm.attached(conversation_id, window.composer.text(), records)
        draft = window.composer.text()
        task.add_done_callback(lambda done: window.draft_warmed(done, draft))

    def _counted(self, conversation_id: str, tokens: int) -> None:
        if conversation_id == self.window.conversation_id:
            info = self.window.session.engine.info
            self.bar.meter.set_counts(tokens, info.n_ctx if info is not None else 0)

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
