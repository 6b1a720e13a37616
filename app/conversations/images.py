"""Images sent with messages: each file's bytes kept once, under its content hash.

A message's image record (attachments.py) names the file by its sha256; the bytes live in
`images/` in the private data folder (0700 folder, 0600 files, written atomically), one file
per digest, so the same picture sent twice, or kept by two conversations, is stored once and
an edit or an import of the message points at the same bytes. The digest is also the image's
identity in the prompt (the engine's stand-in ids come from it), so the bytes read back must
hash to it: a file changed on disk is refused in words rather than shown to the model as
something else.

Pillow only checks a picture and makes thumbnails (PNG, which Qt always decodes: not every
Qt build reads WebP; a chip's is made when the picture is attached, off the UI thread, and
kept in `images/thumbs/`); the engine opens the bytes itself for the model.
"""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path

from app import paths

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".gif"})
MAX_IMAGE_BYTES = 40_000_000  # the engine's limit too (engine/images.py MAX_BYTES)
THUMBNAIL_PX = 96  # a chip's picture, longer side
_DIGEST = re.compile(r"\A[0-9a-f]{64}\Z")


class ImageFileError(Exception):
    """An image that cannot be kept or read back; the message says why, in words."""


def is_digest(value: object) -> bool:
    return isinstance(value, str) and bool(_DIGEST.match(value))


def images_dir() -> Path:
    return paths.ensure_dir(paths.data_dir() / "images", "data")


def keep_image(data: bytes) -> str:
    """Store `data` under its digest (once: a second copy writes nothing) and return it."""
    digest = hashlib.sha256(data).hexdigest()
    path = images_dir() / digest
    if not path.is_file() or path.stat().st_size != len(data):
        paths.write_private(path, data)
    return digest


def has_image(digest: str) -> bool:
    return is_digest(digest) and (images_dir() / digest).is_file()


def image_bytes(digest: str, name: str = "The image") -> bytes:
    """The kept bytes of `digest`; ImageFileError in words when they are gone or changed."""
    if not is_digest(digest):
        raise ImageFileError(f"{name} is not a kept image.")
    try:
        data = (images_dir() / digest).read_bytes()
    except OSError as exc:
        raise ImageFileError(
            f"{name} is no longer in Stoke's data folder, so the model cannot see it. "
            "Attach it again."
        ) from exc
    if hashlib.sha256(data).hexdigest() != digest:
        raise ImageFileError(f"{name} was changed on disk since it was sent. Attach it again.")
    return data


def picture_size(name: str, data: bytes) -> tuple[int, int]:
    """The width and height of an image file, checked; ImageFileError in words when it is
    not a PNG, JPEG, WebP or GIF Stoke reads (a GIF counts by its first frame)."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > MAX_IMAGE_BYTES:
        raise ImageFileError(
            f"{name} is {len(data) / 1e6:.0f} MB; images can be at most "
            f"{MAX_IMAGE_BYTES / 1e6:.0f} MB."
        )
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format not in ("PNG", "JPEG", "WEBP", "GIF"):
                raise ImageFileError(f"{name} is not a PNG, JPEG, WebP or GIF image.")
            image.verify()
            return image.size
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        raise ImageFileError(f"{name} is damaged or not an image Stoke reads.") from None


def thumbnail_png(data: bytes, side: int = THUMBNAIL_PX) -> bytes:
    """A PNG of an image (its first frame) at most `side` pixels a side, aspect kept."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.seek(0)
        image.draft("RGB", (side, side))  # a JPEG decodes at a fraction of its size
        image.thumbnail((side, side))
        out = io.BytesIO()
        image.convert("RGBA").save(out, "PNG")
    return out.getvalue()


def thumbnail_of(digest: str) -> bytes:
    """A kept picture's chip thumbnail, made once and kept beside it (`thumbs/`): a bubble
    shows it without decoding a large photo on the UI thread. ImageFileError in words when
    the picture is gone or changed."""
    path = paths.ensure_dir(images_dir() / "thumbs", "data") / f"{digest}.png"
    try:
        return path.read_bytes()
    except OSError:
        thumbnail = thumbnail_png(image_bytes(digest))
    paths.write_private(path, thumbnail)
    return thumbnail
