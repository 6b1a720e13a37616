"""Image files as a vision model's prompt takes them (app/engine/images.py): the formats
read (GIF's first frame), large images scaled down with their shape kept, bad files refused
in words, and an image's run in a prompt never cut through."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from app.engine.images import (
    MAX_SIDE,
    ImageError,
    image_token,
    open_picture,
    run_start,
    text_only,
)


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
