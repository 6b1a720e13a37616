"""Images in a token-exact prompt: each image is a run of stand-in token ids of its own.

A vision model reads an image as a chunk of embeddings, not tokens. So that a conversation's
prompt stays a plain list of ids (compared, trimmed, snapshotted and restored like any other),
an image's chunk is written there as `n` copies of one id derived from the image's content
hash, above every vocabulary (ids are stored as uint32; a vocabulary stays below 2**24). The
same image gives the same run every turn, so a follow-up matches the KV held through it; a
different image differs at its run's first position, so nothing of the old one is reused.
The engine that evaluates the prompt (engine/llamacpp/vision.py) decodes each run from the
image it registered under that id.

Image bytes are checked and opened here (PNG, JPEG, WebP, GIF's first frame), then scaled
down so the longer side is at most `MAX_SIDE`: a projector resizes every image to its own
input size anyway, and a 50-megapixel photo would otherwise cost its full size in memory.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app import paths
from app.engine.protocol import EngineError, ModelInfo

IMAGE_BASE = 1 << 31  # every stand-in id is at or above it
MAX_SIDE = 2048
MAX_BYTES = 40 << 20
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
)


class ImageError(EngineError):
    """An image that cannot be read: the message names what is wrong with it."""


class ImageGoneError(EngineError):
    """A prompt holds an image the engine let go of (it keeps the last `KEEP_IMAGES`, and a
    restarted engine none): registering it again with `image_run` brings it back."""

    def __init__(
        self, message: str = "The prompt holds an image this engine no longer has; send it again."
    ) -> None:
        super().__init__(message)  # the message too: it crosses from the engine's process


@dataclass(frozen=True)
class Picture:
    """An image ready for a projector: RGB bytes row by row, its size, and its hash."""

    digest: str  # sha256 of the file's bytes: the same file is the same image everywhere
    width: int
    height: int
    rgb: bytes


def is_projector(path: Path) -> bool:
    """Whether a GGUF is a vision projector (an `mmproj` file) rather than a model."""
    return "mmproj" in path.name.lower()


def find_projector(model_path: Path) -> Path | None:
    """A projector beside the model: the `*mmproj*.gguf` in its folder (the one that shares
    the longest start of its name with the model's when there are several)."""
    candidates = sorted(p for p in model_path.parent.glob("*.gguf") if is_projector(p))
    if not candidates:
        return None

    def shared(p: Path) -> int:
        n = 0
        for a, b in zip(p.name.lower(), model_path.name.lower(), strict=False):
            if a != b:
                break
            n += 1
        return n

    return max(candidates, key=shared)


def no_vision(info: ModelInfo | None) -> str:
    """Why a model takes no image, and where a projector comes from: the hub repository it
    was downloaded from, when it came through the model manager."""
    name = info.name if info is not None else "This model"
    repo = _downloaded_from(Path(info.path)) if info is not None else None
    where = (
        f"Its projector would be an mmproj GGUF in {repo} on the Hugging Face hub; if there is "
        "one, put it beside the model (File > Models downloads it with a vision model) and "
        "load it again."
        if repo is not None
        else "A vision model's GGUF comes with an mmproj file (the same hub repository); put "
        "it beside the model and load it again."
    )
    return f"{name} reads text only: it has no vision projector. {where}"


def _downloaded_from(model: Path) -> str | None:
    """`owner/name` of the hub repository a model in Stoke's own models folder came from."""
    try:
        parts = model.parent.relative_to(paths.models_dir(create=False)).parts
    except ValueError:
        return None
    return "/".join(parts[:2]) if len(parts) >= 2 else None


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def image_token(image_digest: str) -> int:
    """The stand-in id of an image's chunk: 31 bits of its hash above `IMAGE_BASE`."""
    return IMAGE_BASE | (int(image_digest[:8], 16) & (IMAGE_BASE - 1))


def is_image(token: int) -> bool:
    return token >= IMAGE_BASE


def has_images(tokens: Sequence[int]) -> bool:
    return any(t >= IMAGE_BASE for t in tokens)


def text_only(tokens: list[int]) -> list[int]:
    """`tokens` up to the first image id: a drafter copying a prompt may meet an image's
    run, which is never a token to sample."""
    for i, token in enumerate(tokens):
        if token >= IMAGE_BASE:
            return tokens[:i]
    return tokens


def run_start(tokens: Sequence[int], i: int) -> int:
    """`i`, or where the image run containing position `i` starts when `i` falls inside
    one: the KV can be cut before an image or after it, never through it."""
    if i <= 0 or i >= len(tokens) or not is_image(tokens[i]) or tokens[i - 1] != tokens[i]:
        return i
    while i > 0 and tokens[i - 1] == tokens[i]:
        i -= 1
    return i


def kind(data: bytes) -> str | None:
    """The file's format by its first bytes, or None for one that is not an image taken."""
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    return None


def open_picture(data: bytes) -> Picture:
    """Check and open an image file's bytes; ImageError in words when it cannot be used."""
    if not data:
        raise ImageError("The image is empty.")
    if len(data) > MAX_BYTES:
        raise ImageError(
            f"The image is {len(data) / 1e6:.0f} MB; images up to {MAX_BYTES / 1e6:.0f} MB "
            "are taken."
        )
    if kind(data) is None:
        raise ImageError("That file is not an image Stoke reads (PNG, JPEG, WebP or GIF).")
    from PIL import Image, UnidentifiedImageError  # only when an image comes

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.seek(0)  # a GIF's first frame
            image.thumbnail((MAX_SIDE, MAX_SIDE))
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        raise ImageError("The image is damaged or cut short and cannot be read.") from None
    return Picture(digest(data), rgb.width, rgb.height, rgb.tobytes())


def reads_images(info: ModelInfo | None, path: Path | None) -> bool:
    """Whether a model reads images: loaded, it has a projector; not loaded, a GGUF with one
    beside it (what its next load will find)."""
    if info is not None:
        return info.projector is not None
    return path is not None and path.suffix == ".gguf" and find_projector(path) is not None
