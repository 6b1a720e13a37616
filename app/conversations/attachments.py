"""Files sent with a message: what can be attached, and the text the model reads of it.

Reading a file checks it first (size, a known kind, text that decodes, a PDF that opens and
is not locked, an image Pillow reads) and says what is wrong in words. The record kept with
the message holds the extracted text itself, so the prompt of a stored message renders to
the same tokens every time, whatever happened to the file since (the KV prefix stays
reusable). An image's record holds its content hash instead, its bytes kept once by that
hash (images.py): the same picture is the same chunk of the prompt every turn.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.conversations.images import (
    IMAGE_SUFFIXES,
    ImageFileError,
    is_digest,
    keep_image,
    picture_size,
    thumbnail_of,
)
from app.units import decimal_bytes

log = logging.getLogger("stoke.attachments")

MAX_FILE_BYTES = 50_000_000  # a larger file is refused before it is read
MAX_TEXT_CHARS = 1_000_000  # extracted text beyond this is refused: no context holds it
PDF_SUFFIXES = frozenset({".pdf"})
TEXT_SUFFIXES = frozenset(
    {
        ".txt", ".text", ".md", ".markdown", ".rst", ".csv", ".tsv", ".json", ".jsonl",
        ".yaml", ".yml", ".toml", ".ini", ".cfg", ".xml", ".html", ".htm", ".css", ".log",
        ".py", ".pyi", ".js", ".jsx", ".ts", ".tsx", ".c", ".h", ".cc", ".cpp", ".hpp",
        ".rs", ".go", ".java", ".kt", ".swift", ".rb", ".php", ".sh", ".bash", ".zsh",
        ".sql", ".lua", ".r", ".m", ".cs", ".scala", ".hs", ".ex", ".exs", ".tex",
    }
)  # fmt: skip
SUFFIXES = TEXT_SUFFIXES | PDF_SUFFIXES | IMAGE_SUFFIXES
KINDS = ("text", "pdf", "image")
_IMAGE_FIELDS = ("digest", "width", "height")


class AttachmentError(Exception):
    """A file that cannot be attached; the message says why, in words."""


@dataclass(frozen=True)
class Attachment:
    """One attached file as the message keeps it. `tokens` is the count shown on its chip,
    measured under the model loaded when it was attached. An image has no text: its
    `digest` names its kept bytes (images.py), with its size in pixels."""

    name: str
    kind: str  # "text", "pdf" or "image"
    size: int  # bytes of the file
    text: str = ""
    tokens: int | None = None
    digest: str | None = None
    width: int | None = None
    height: int | None = None

    def record(self) -> dict[str, Any]:
        """The record kept with the message: a file's text, or an image's digest and size."""
        record = asdict(self)
        for key in ("text",) if self.kind == "image" else _IMAGE_FIELDS:
            del record[key]
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Attachment:
        """An attachment from a stored or imported record; AttachmentError when it is not
        one (an import checks every record before it writes anything)."""
        image = isinstance(record, Mapping) and record.get("kind") == "image"
        keys = ("name", "kind", "size", *(_IMAGE_FIELDS if image else ("text",)))
        try:
            values = [record[k] for k in keys]
        except (KeyError, TypeError) as exc:
            what = "digest or size in pixels" if image else "text"
            raise AttachmentError(f"An attachment lacks its name, kind, size or {what}.") from exc
        name, kind, size = values[:3]
        tokens = record.get("tokens")
        if image:
            digest, width, height = values[3:]
            valid = is_digest(digest) and _count(width) and _count(height)
        else:
            valid = isinstance(values[3], str)
        valid = (
            valid
            and isinstance(name, str)
            and kind in KINDS
            and _count(size)
            and (tokens is None or _count(tokens))
        )
        if not valid:
            raise AttachmentError(f"The attachment {name!r} is not a valid attachment record.")
        if image:
            return cls(name, kind, size, tokens=tokens, digest=digest, width=width, height=height)
        return cls(name, kind, size, values[3], tokens)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_attachment(path: Path) -> Attachment:
    """The file at `path` as an attachment (blocking: run it off the UI thread)."""
    name = path.name
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise AttachmentError(
            f"{name} is not a file Stoke can attach. Attach text, code, Markdown, CSV or PDF "
            "files, or PNG, JPEG, WebP or GIF images."
        )
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise AttachmentError(
                f"{name} is {decimal_bytes(size)}; attachments can be at most "
                f"{decimal_bytes(MAX_FILE_BYTES)}."
            )
        data = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or "unreadable"
        raise AttachmentError(f"Stoke could not read {name}: {reason}.") from exc
    if suffix in IMAGE_SUFFIXES:
        return image_attachment(name, data)
    if suffix in PDF_SUFFIXES:
        kind, text = "pdf", _pdf_text(name, data)
    else:
        kind, text = "text", _plain_text(name, data)
    if not text.strip():
        raise AttachmentError(f"{name} holds no text to attach.")
    if len(text) > MAX_TEXT_CHARS:
        raise AttachmentError(
            f"{name} holds {len(text):,} characters of text; attachments can hold at most "
            f"{MAX_TEXT_CHARS:,}."
        )
    return Attachment(name, kind, size, text)


def image_attachment(name: str, data: bytes) -> Attachment:
    """An image (a file's bytes, or a picture pasted) checked and kept by its content hash
    (blocking: run it off the UI thread)."""
    try:
        width, height = picture_size(name, data)
        digest = keep_image(data)
        thumbnail_of(digest)  # made here, off the UI thread, for its chips
    except ImageFileError as exc:
        raise AttachmentError(str(exc)) from exc
    except OSError as exc:
        raise AttachmentError(f"Stoke could not keep {name}: {exc.strerror or exc}.") from exc
    return Attachment(name, "image", len(data), digest=digest, width=width, height=height)


def is_image(record: Mapping[str, Any]) -> bool:
    return record.get("kind") == "image"


def _plain_text(name: str, data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise AttachmentError(f"{name} looks like a binary file, not text.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AttachmentError(
            f"{name} is not UTF-8 text. Save it as UTF-8 and attach it again."
        ) from exc
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _pdf_text(name: str, data: bytes) -> str:
    """Every page's text, pages separated by a blank line."""
    import io

    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise AttachmentError(
                f"{name} is a password-protected PDF. Save an unlocked copy and attach that."
            )
        pages = [page.extract_text() or "" for page in reader.pages]
    except AttachmentError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as exc:
        log.info("PDF %s unreadable: %s", name, exc)
        raise AttachmentError(f"{name} is not a PDF Stoke can read: the file is damaged.") from exc
    text = "\n\n".join(page.strip() for page in pages if page.strip())
    if not text:
        raise AttachmentError(
            f"{name} has no text layer (a scanned PDF?). Stoke cannot read images of text."
        )
    return text
