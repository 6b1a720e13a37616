"""Images on the real llama.cpp engine (libmtmd) with the tests' tiny vision model
(tests/tiny_vision.py): an image is a run of its own ids in the prompt, so a follow-up
reuses the KV held through it, another image is read afresh, a restore brings it back from
disk, and the KV is cut before an image, never through it. Then the three API shapes
(OpenAI image_url, Anthropic image, Responses input_image) through the official SDKs, and a
text model refusing an image in words."""

from __future__ import annotations

import base64
import io
from dataclasses import replace
from pathlib import Path

import anthropic
import pytest
from PIL import Image

from app.engine.images import image_token, is_image
from app.engine.llamacpp.backend import LlamaCppEngine
from app.engine.protocol import (
    GenerationStats,
    LoadOptions,
    ModelLoadError,
    SamplingParams,
)
from tests.e2e.serving import API_KEY, ServerThread
from tests.tiny_vision import IMAGE_TOKENS, write_projector, write_tiny_vision_model

pytestmark = pytest.mark.e2e


def png(colour: tuple[int, int, int], size: tuple[int, int] = (90, 60)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


RED, GREEN = png((200, 20, 20)), png((20, 200, 20))
LOOK = (
    "I took this picture of the garden this morning, after a night of rain, from the kitchen "
    "window on the first floor. Look at it closely: "
)


@pytest.fixture
def vision_model(tiny_model: str, tmp_path: Path) -> str:
    return str(write_tiny_vision_model(Path(tiny_model), tmp_path / "vision"))


def _reply(engine: LlamaCppEngine, prompt: list[int], slot: str = "a"):
    events = list(engine.generate(prompt, SamplingParams.greedy(), 6, slot=slot))
    stats = events[-1]
    assert isinstance(stats, GenerationStats)
    return [e.token_id for e in events[:-1]], stats


def test_an_image_is_read_once_and_its_kv_reused_restored_and_cut_around(
    vision_model: str, stoke_home: Path
) -> None:
    engine = LlamaCppEngine()
    info = engine.load(LoadOptions(vision_model, n_ctx=1024, n_seq_max=2))
    try:
        assert info.projector is not None and info.projector.endswith("mmproj-tiny-vision.gguf")
        red = engine.image_run(RED)
        assert red == [image_token(red_digest := _digest(RED))] * IMAGE_TOKENS, red_digest
        # longer than RESTORE_MIN_GAIN, so copying or restoring what precedes the image pays
        before = engine.tokenize(f"<|im_start|>user\n{LOOK}", special=True)
        after = engine.tokenize(" What is it?<|im_end|>\n<|im_start|>assistant\n", special=True)
        prompt = before + red + after

        first, stats = _reply(engine, prompt)
        assert stats.prefilled_tokens == len(prompt)

        # a follow-up reuses everything held, the image's chunk included
        follow = prompt + first + engine.tokenize("<|im_end|>\n", special=True)
        _, stats = _reply(engine, follow)
        assert stats.reused_tokens >= len(prompt) and stats.prefilled_tokens < 10

        # an edit after the image keeps it: nothing of the image is read again
        edited = before + red + engine.tokenize(" And now?<|im_end|>\n", special=True)
        _, stats = _reply(engine, edited)
        assert stats.reused_tokens >= len(before) + IMAGE_TOKENS
        saved = engine.snapshot("a", wait=True)

        # another image at the same place: the KV is cut before it, never through it
        _reply(engine, prompt, slot="b")
        green = engine.image_run(GREEN)
        _, stats = _reply(engine, before + green + after, slot="b")
        assert stats.reused_tokens == len(before)
    finally:
        engine.unload()

    # a fresh engine restores the conversation, image and all, from disk
    engine = LlamaCppEngine()
    engine.load(LoadOptions(vision_model, n_ctx=1024, n_seq_max=2))
    try:
        engine.image_run(RED)  # the prompt's builder registers its images again
        again, stats = _reply(engine, edited, slot="c")
        assert saved > 0 and stats.restored_tokens >= len(before) + IMAGE_TOKENS
        assert not any(is_image(t) for t in again)
    finally:
        engine.unload()


def _digest(data: bytes) -> str:
    from app.engine.images import digest

    return digest(data)


def test_a_projector_that_does_not_match_its_model_is_refused(
    tiny_model: str, tmp_path: Path, stoke_home: Path
) -> None:
    folder = tmp_path / "mismatch"
    model = write_tiny_vision_model(Path(tiny_model), folder)
    write_projector(folder / "mmproj-tiny-vision.gguf", projection=32)  # model is 64 wide
    with pytest.raises(ModelLoadError, match="does not match this model"):
        LlamaCppEngine().load(LoadOptions(str(model), n_ctx=512))


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_the_three_api_shapes_see_the_image_and_follow_ups_reuse_it(
    vision_model: str, stoke_home: Path
) -> None:
    server = ServerThread()
    server.options = replace(server.options, model_path=vision_model, n_ctx=2048)
    with server:
        client = server.client()
        listed = {m.id: m.model_extra for m in client.models.list().data}
        assert listed[server.model]["capabilities"]["vision"] is True
        ask = [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": _data_url(RED)}},
        ]
        first = client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": ask}],
            max_tokens=4,
            temperature=0,
        )
        assert first.usage.prompt_tokens > IMAGE_TOKENS
        history = [
            {"role": "user", "content": ask},
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And its colour?"},
        ]
        second = client.chat.completions.create(
            model=server.model, messages=history, max_tokens=4, temperature=0
        )
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached >= first.usage.prompt_tokens  # the image was not read again

        other = client.chat.completions.create(
            model=server.model,
            messages=[
                {
                    "role": "user",
                    "content": [
                        ask[0],
                        {"type": "image_url", "image_url": {"url": _data_url(GREEN)}},
                    ],
                }
            ],
            max_tokens=4,
            temperature=0,
        )
        assert other.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens - 4

        base = server.url.removesuffix("/v1")  # the SDK adds /v1/messages itself
        messages = anthropic.Anthropic(base_url=base, api_key=API_KEY, max_retries=0).messages
        picture = {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": "image/png",
                "data": base64.b64encode(RED).decode(),
            },
        }
        said = messages.create(
            model=server.model,
            max_tokens=4,
            messages=[{"role": "user", "content": [picture, {"type": "text", "text": "Hi"}]}],
        )
        assert said.usage.input_tokens > IMAGE_TOKENS

        response = client.responses.create(
            model=server.model,
            max_output_tokens=4,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is in this picture?"},
                        {"type": "input_image", "image_url": _data_url(RED)},
                    ],
                }
            ],
        )
        assert response.usage.input_tokens > IMAGE_TOKENS


def test_a_text_model_refuses_an_image_in_words(tiny_model: str, stoke_home: Path) -> None:
    import openai

    server = ServerThread()
    server.options = replace(server.options, model_path=tiny_model)
    with server:
        with pytest.raises(openai.BadRequestError) as refused:
            server.client().chat.completions.create(
                model=server.model,
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": _data_url(RED)}}],
                    }
                ],
                max_tokens=4,
            )
        message = refused.value.body["message"]
        assert "reads text only" in message and "mmproj" in message
        assert "Traceback" not in message
