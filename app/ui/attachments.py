"""Attachments in the window: the chips of a message's files and the bar above the composer.

The bar holds the paperclip button, the chips of the files attached to the draft (name,
token count, remove) and the context meter. Files are read and counted on a pool thread
(app/ui/background.py): a PDF of many pages never stalls typing. What cannot be attached is
said in words through `failed`. While a file is read, `reading` says which ("Reading
notes.md…"), so the composer holds Send: a message sent then would leave the file out.

An image's chip shows its thumbnail (a PNG Pillow made from the kept bytes when it was
attached, so WebP shows where Qt has no WebP plugin); clicking it opens the picture large
(image_view.py). Its token count comes from the model's projector once the draft is
prefilled (draft_files.py).

While the draft is prefilled, each chip of the bar says how far the model has read its file
("reading 1,024 / 2,815 tokens", then "ready"): a long file takes a while on a loaded
machine, and a question sent before is answered only once it is read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QBuffer, QIODevice, QSize, Qt, QThreadPool, Signal
from PySide6.QtGui import QIcon, QImage, QPixmap
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QToolButton,
    QWidget,
)

from app.conversations.attachments import (
    SUFFIXES,
    Attachment,
    AttachmentError,
    image_attachment,
    is_image,
    read_attachment,
)
from app.conversations.images import ImageFileError, image_bytes, thumbnail_of
from app.engine.protocol import PrefillProgress
from app.ui.background import Background
from app.ui.context_meter import ContextMeter
from app.ui.elided import ElidedLabel
from app.ui.image_view import ImageView

CHIP_NAME_PX = 180  # a long file name is elided to this width
FILTER = (
    "Text, code, Markdown, CSV, PDF or images (" + " ".join(f"*{s}" for s in sorted(SUFFIXES)) + ")"
)
_thumbnails: dict[str, QPixmap] = {}  # by digest: a conversation's bubbles decode each once


def thumbnail(record: Mapping[str, Any]) -> QPixmap | None:
    """An image record's thumbnail, or None when its file is gone or unreadable."""
    digest = record["digest"]
    if digest not in _thumbnails:
        pixmap = QPixmap()
        try:
            pixmap.loadFromData(thumbnail_of(digest), "PNG")
        except (ImageFileError, OSError, ValueError):
            return None
        _thumbnails[digest] = pixmap
    return _thumbnails[digest]


def describe_refusal(exc: Exception) -> str:
    """A refusal's words: an AttachmentError says why; anything else is said plainly."""
    if isinstance(exc, AttachmentError):
        return str(exc)
    return "Stoke could not read that file."


def chip_text(record: Mapping[str, Any], read: PrefillProgress | None = None) -> str:
    """The chip's words: the file's name and token count and, in a draft being prefilled,
    how far the model has read it: in the file's own count where known (its span in the
    prompt adds the few tokens of its tags)."""
    tokens = record.get("tokens")
    if read is not None and read.done < read.total:
        of = tokens if tokens is not None else read.total
        return f"{record['name']} · reading {read.done * of // read.total:,} / {of:,} tokens"
    counted = f"{record['name']} · {tokens:,} tokens" if tokens is not None else record["name"]
    return f"{counted} · ready" if read is not None else counted


def file_key(record: Mapping[str, Any]) -> tuple[str, str, int]:
    """A draft file as its prefill's progress names it: the same file after a rebuild."""
    return record["name"], record["kind"], record["size"]


class AttachmentChip(QFrame):
    """One file: its name and token count, and a remove button where it can be removed."""

    removed = Signal()

    def __init__(
        self, record: Mapping[str, Any], *, removable: bool, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setObjectName("attachment-chip")
        self.record = dict(record)
        self.setAccessibleName(f"Attached file {record['name']}")
        what = (
            f"a {record['width']}×{record['height']} image"
            if is_image(record)
            else f"{len(record['text']):,} characters of text"
        )
        self.setToolTip(
            f"{record['name']}: {what}"
            + (f", {record['tokens']:,} tokens" if record.get("tokens") is not None else "")
        )
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 2, 4 if removable else 8, 2)
        row.setSpacing(4)
        self.picture: QToolButton | None = None
        pixmap = thumbnail(record) if is_image(record) else None
        if pixmap is not None:
            self.picture = QToolButton(self)
            self.picture.setObjectName("attachment-thumbnail")
            self.picture.setIcon(QIcon(pixmap))
            self.picture.setIconSize(QSize(pixmap.width(), pixmap.height()))
            self.picture.setAutoRaise(True)
            self.picture.setAccessibleName(f"View {record['name']}")
            self.picture.setToolTip("View the picture large")
            self.picture.clicked.connect(self.view)
            row.addWidget(self.picture)
        self.label = ElidedLabel(parent=self)  # "reading …" is long: it never widens the window
        self.label.setObjectName("attachment-name")
        metrics = self.label.fontMetrics()
        self._name = metrics.elidedText(record["name"], Qt.TextElideMode.ElideMiddle, CHIP_NAME_PX)
        self.show_read(None)
        row.addWidget(self.label)
        self.remove_button: QToolButton | None = None
        if removable:
            self.remove_button = QToolButton(self)
            self.remove_button.setText("×")
            self.remove_button.setAccessibleName(f"Remove {record['name']}")
            self.remove_button.setToolTip("Remove this file from the message")
            self.remove_button.clicked.connect(self.removed)
            row.addWidget(self.remove_button)
        self.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)

    def show_read(self, read: PrefillProgress | None) -> None:
        """Say how far the model has read the file (None: nothing said, as on a bubble),
        with room kept for the count's widest while it is read, so the chip holds still."""
        shown = {**self.record, "name": self._name}
        reading = read is not None and read.done < read.total
        widest = PrefillProgress(read.total - 1, read.total) if reading else None
        self.label.keep_room_for(chip_text(shown, widest) if widest is not None else "")
        self.label.setText(chip_text(shown, read))

    def view(self) -> ImageView | None:
        """Open the picture large; None (and nothing opens) when its file is gone."""
        try:
            data = image_bytes(self.record["digest"], self.record["name"])
        except ImageFileError:
            return None
        viewer = ImageView(self.record["name"], data, self.window())
        viewer.show()
        return viewer


class AttachmentChips(QWidget):
    """The files of a sent message, on its bubble (read-only)."""

    def __init__(self, records: Sequence[Mapping[str, Any]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("message-attachments")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(6)
        self.chips = [AttachmentChip(r, removable=False, parent=self) for r in records]
        for chip in self.chips:
            row.addWidget(chip)
        row.addStretch(1)


class AttachmentBar(QWidget):
    """The draft's attachments and the context meter. `changed` is emitted with the draft's
    records whenever a file is added or removed; `failed` with the words of a refusal."""

    changed = Signal(list)
    failed = Signal(str)
    reading = Signal(str)  # "Reading notes.md…" while files are read, "" once all are

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("attachment-bar")
        self._records: list[dict[str, Any]] = []
        self._chips: list[AttachmentChip] = []
        self._background = Background(self, describe_refusal)
        self._reading: list[str] = []  # the names of the files being read now
        self._read_so_far: dict[tuple[str, str, int], PrefillProgress] = {}  # how far prefilled
        self.tokenizer: Callable[[], Any] | None = None  # the loaded model's tokenizer, if any
        self.attach_button = QToolButton(self)
        self.attach_button.setObjectName("attach-button")
        self.attach_button.setText("Attach…")
        self.attach_button.setAccessibleName("Attach a file")
        self.attach_button.setToolTip(
            "Attach text, code, Markdown, CSV or PDF files or images (or drop them on the "
            "window, or paste a picture); Stoke reads them into the model at once, before "
            "you ask your question"
        )
        self.attach_button.clicked.connect(self.choose_files)
        self.status = QLabel("", self)
        self.status.setObjectName("attachment-status")
        self.meter = ContextMeter(self)
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(16, 4, 16, 0)
        self._row.setSpacing(6)
        self._row.addWidget(self.attach_button)
        self._row.addWidget(self.status)
        self._row.addStretch(1)
        self._row.addWidget(self.meter)

    def records(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._records]

    def busy(self) -> bool:
        """Whether a file is still being read (sending now would leave it out)."""
        return bool(self._reading)

    def set_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Show another draft's files (a conversation switch, or none after a send), without
        signalling a change."""
        self._records = [dict(r) for r in records]
        self._read_so_far = {}
        self._rebuild()

    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach files", "", FILTER)
        for path in paths:
            self.attach(Path(path))

    def attach(self, path: Path) -> None:
        """Read `path` off the UI thread; its chip appears and `changed` fires once read."""
        tokenizer = self.tokenizer() if self.tokenizer is not None else None
        self._reading.append(path.name)
        self._show_reading()

        def work() -> Attachment:
            attachment = read_attachment(path)
            if tokenizer is None or attachment.kind == "image":  # counted by the projector
                return attachment
            count = len(tokenizer.tokenize(attachment.text))
            return dataclasses.replace(attachment, tokens=count)

        self._read_off_thread(path.name, work)

    def attach_image(self, name: str, image: QImage) -> None:
        """A picture from the clipboard: written as a PNG (off the UI thread: a screenshot
        takes a while to compress), then kept and shown like an image file."""
        self._reading.append(name)
        self._show_reading()
        picture = image.copy()  # the clipboard's may change while it is written

        def work() -> Attachment:
            buffer = QBuffer()
            buffer.open(QIODevice.OpenModeFlag.WriteOnly)
            picture.save(buffer, "PNG")
            return image_attachment(name, bytes(buffer.data()))

        self._read_off_thread(name, work)

    def set_tokens(self, counts: Mapping[str, int]) -> None:
        """Each image's token count (by digest) once the projector has read it: on its chip
        and in its record, which goes with the message."""
        changed = False
        for record in self._records:
            count = counts.get(record.get("digest") or "")
            if is_image(record) and count is not None and record.get("tokens") != count:
                record["tokens"] = count
                changed = True
        if changed:
            self._rebuild()

    def show_read(
        self, files: Sequence[Mapping[str, Any]], read: Sequence[PrefillProgress]
    ) -> None:
        """How far the draft's prefill has read each of `files` (the draft's files when it
        started; one removed since is passed over)."""
        self._read_so_far.update((file_key(f), r) for f, r in zip(files, read, strict=True))
        for chip in self._chips:
            chip.show_read(self._read_so_far.get(file_key(chip.record)))

    def _read_off_thread(self, name: str, work: Callable[[], Attachment]) -> None:
        self._background.run(
            QThreadPool.globalInstance(),
            work,
            lambda attachment: self._read(attachment, name),
            lambda words: self._refused(words, name),
        )

    def _read(self, attachment: Attachment, name: str) -> None:
        self._done_reading(name)
        self._records.append(attachment.record())
        self._rebuild()
        self.changed.emit(self.records())

    def _refused(self, words: str, name: str) -> None:
        self._done_reading(name)
        self.failed.emit(words)

    def _done_reading(self, name: str) -> None:
        self._reading.remove(name)
        self._show_reading()

    def remove(self, index: int) -> None:
        del self._records[index]
        self._rebuild()
        self.changed.emit(self.records())

    def _show_reading(self) -> None:
        words = f"Reading {', '.join(self._reading)}…" if self._reading else ""
        self.status.setText(words)
        self.reading.emit(words)

    def _rebuild(self) -> None:
        for chip in self._chips:
            self._row.removeWidget(chip)
            chip.deleteLater()
        self._chips = []
        for index, record in enumerate(self._records):
            chip = AttachmentChip(record, removable=True, parent=self)
            chip.show_read(self._read_so_far.get(file_key(record)))
            chip.removed.connect(lambda i=index: self.remove(i))
            self._row.insertWidget(1 + index, chip)
            self._chips.append(chip)
