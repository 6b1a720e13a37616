"""Image files as a vision model's prompt takes them (app/engine/images.py): the formats
read (GIF's first frame), large images scaled down with their shape kept, bad files refused
in words, and an image's run in a prompt never cut through."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from app import paths
from app.engine.images import (
    MAX_SIDE,
    ImageError,
    image_token,
    no_vision,
    open_picture,
    run_start,
    text_only,
)
from app.engine.protocol import ModelInfo


def _file(image: Image.Image, fmt: str, **kwargs: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_each_format_opens_as_rgb(fmt: str) -> None:
    picture = open_picture(_file(Image.new("RGB", (30, 20), (250, 0, 0)), fmt))
    assert (picture.width, picture.height) == (30, 20)
    assert len(picture.rgb) == 30 * 20 * 3 and picture.rgb[0] > 200


def test_a_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (8, 8), colour) for colour in ((0, 0, 255), (255, 0, 0))]
    data = _file(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert open_picture(data).rgb[2] > 200  # blue, not the red second frame


def test_a_large_image_is_scaled_down_with_its_shape_kept() -> None:
    picture = open_picture(_file(Image.new("RGB", (MAX_SIDE * 2, MAX_SIDE)), "PNG"))
    assert (picture.width, picture.height) == (MAX_SIDE, MAX_SIDE // 2)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "empty"),
        (b"%PDF-1.7 not a picture", "not an image"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "damaged"),
    ],
)
def test_bad_files_are_refused_in_words(data: bytes, words: str) -> None:
    with pytest.raises(ImageError, match=words):
        open_picture(data)


def test_a_run_is_never_cut_through_and_drafts_stop_before_it() -> None:
    image = image_token("ab" * 32)
    tokens = [5, 6, image, image, image, 7]
    assert [run_start(tokens, i) for i in range(6)] == [0, 1, 2, 2, 2, 5]
    assert text_only([8, 9, image, 10]) == [8, 9]


def test_a_text_model_says_where_its_projector_would_come_from(stoke_home: Path) -> None:
    def info(path: Path) -> ModelInfo:
        fields = dict.fromkeys(("fingerprint", "architecture", "bos_token", "eos_token"), "")
        return ModelInfo(
            **fields, path=str(path), name="Tiny", n_ctx=1, n_ctx_train=1, n_vocab=1,
            chat_template=None, add_bos=False, bos_id=None, eog_ids=(), backend="llama.cpp",
            size_bytes=0,
        )  # fmt: skip

    downloaded = paths.models_dir() / "acme" / "Tiny-GGUF" / "Tiny.Q4_1.gguf"
    words = no_vision(info(downloaded))
    assert words.startswith("Tiny reads text only") and "mmproj GGUF in acme/Tiny-GGUF" in words
    elsewhere = no_vision(info(stoke_home / "mine" / "Tiny.gguf"))
    assert "comes with an mmproj file (the same hub repository)" in elsewhere
