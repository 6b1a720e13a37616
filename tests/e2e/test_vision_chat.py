"""Images in conversations through the session, on the real engine host with the tests' tiny
vision model (tests/tiny_vision.py) and a real SQLite file: an image attached is read while
the question is typed, so after Enter only the question is; follow-ups reuse every held
token, the image's run included; a snapshot on disk brings a conversation with an image back
in a new engine; an edit after the image keeps it, one before it reads it again; a text
model says in words why it cannot see the picture, and the message stays; a picture the
engine let go of (others took its place) is registered again."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from app.conversations import ConversationStore
from app.conversations.attachments import image_attachment
from app.engine.images import image_token
from app.engine.llamacpp.vision import KEEP_IMAGES
from app.engine.prewarm import Prewarmer
from app.engine.protocol import EngineError
from app.session import ChatSession
from tests.e2e.conftest import GREEDY, start_session
from tests.tiny_vision import IMAGE_TOKENS, write_tiny_vision_model

pytestmark = pytest.mark.e2e

TAIL_TOKENS = 8  # the turn's closing template tokens (end of turn, the reply's header)
SAMPLING = {**GREEDY, "max_tokens": 6}


def picture(colour: tuple[int, int, int]) -> dict:
    out = io.BytesIO()
    Image.new("RGB", (90, 60), colour).save(out, "PNG")
    return image_attachment("garden.png", out.getvalue()).record()


@pytest.fixture
def vision_model(tiny_model: str, tmp_path: Path) -> str:
    return str(write_tiny_vision_model(Path(tiny_model), tmp_path / "vision"))


def run_of(record: dict) -> list[int]:
    return [image_token(record["digest"])] * IMAGE_TOKENS


def holds(prompt: list[int], run: list[int]) -> bool:
    return any(prompt[i : i + len(run)] == run for i in range(len(prompt)))


def test_an_image_is_read_on_attach_and_every_follow_up_reuses_it(
    store: ConversationStore, vision_model: str, run
) -> None:
    image = picture((200, 20, 20))

    async def scenario():
        session = await start_session(store, vision_model, n_ctx=2048)
        prewarm = Prewarmer(session)
        try:
            cid = store.create_conversation(sampling=SAMPLING).id
            await prewarm.attached(cid, "", [image])
            expected = session.draft_tokens(cid, "", [image])
            warmed = prewarm.last[cid]
            resident = await session.engine.resident_tokens(cid)
            question = "What grows in it?"
            first = await session.send(cid, question, attachments=[image])
            held = await session.engine.resident_tokens(cid)
            second = await session.send(cid, "And what colour is the sky?")
            return session, expected, warmed, resident, question, first, held, second
        finally:
            await session.engine.close()

    session, expected, warmed, resident, question, first, held, second = run(scenario())
    assert holds(expected, run_of(image)) and warmed.prompt_tokens == len(expected)
    assert resident == expected  # the picture is in the KV before the question is typed
    # after Enter only the question (and the template's tail) is read
    assert first.stats.reused_tokens == len(expected)
    words = len(session.engine.local_tokenizer().tokenize(question))
    assert first.stats.prefilled_tokens <= words + TAIL_TOKENS
    assert store.get_message(first.user_message_id).attachments == [image]
    # the follow-up reuses every token held, the image's run among them
    assert holds(held, run_of(image))
    assert second.stats.reused_tokens == len(held)
    assert second.stats.prefilled_tokens <= 12 + TAIL_TOKENS


def test_a_conversation_with_an_image_comes_back_from_disk_and_edits_cut_around_it(
    store: ConversationStore, vision_model: str, run
) -> None:
    image = picture((20, 200, 20))

    async def first_engine() -> tuple[str, str, str]:
        session = await start_session(store, vision_model, n_ctx=2048)
        try:
            cid = store.create_conversation(sampling=SAMPLING).id
            hello = await session.send(cid, "Hello there, I have a photo for you today.")
            shown = await session.send(cid, "What is in this photo?", attachments=[image])
            await session.engine.snapshot(cid, wait=True)
            return cid, hello.user_message_id, shown.user_message_id
        finally:
            await session.engine.close()

    cid, hello_id, shown_id = run(first_engine())

    async def second_engine():
        session = await start_session(store, vision_model, n_ctx=2048)
        try:
            follow = await session.send(cid, "Is it sunny?")
            after = await session.edit(shown_id, "Which season is it?")
            before = await session.edit(hello_id, "Good morning.")
            again = await session.regenerate(after.reply_message_id)
            prompt = ChatSession(store, session.engine)
            await prompt.read_images([image])
            conversation = store.get_conversation(cid)
            history = store.path_to(after.user_message_id)
            again_prompt = prompt.transcript(conversation, history).prompt()
            return follow, after, before, again, again_prompt
        finally:
            await session.engine.close()

    follow, after, before, again, again_prompt = run(second_engine())
    # restored from the snapshot: the image's run is not read again
    assert follow.stats.restored_tokens > IMAGE_TOKENS
    assert follow.stats.prefilled_tokens <= 12 + TAIL_TOKENS
    # an edit after the image cuts the KV after its run: only the new words are read
    image_end = again_prompt.index(run_of(image)[0]) + IMAGE_TOKENS
    assert after.stats.reused_tokens >= image_end
    assert after.stats.prefilled_tokens <= 12 + TAIL_TOKENS
    # an edit before it leaves the image out; going back brings it whole, from the snapshot
    # taken when the branch was left, never the live KV cut through it
    assert before.stats.prefilled_tokens < IMAGE_TOKENS
    live = again.stats.reused_tokens - again.stats.restored_tokens
    assert live < image_end - IMAGE_TOKENS and again.stats.reused_tokens >= image_end
    assert again.stats.prompt_tokens == len(again_prompt) and again.status == "complete"


def test_a_text_model_says_it_cannot_see_the_image_and_keeps_the_message(
    store: ConversationStore, tiny_model: str, run
) -> None:
    image = picture((20, 20, 200))

    async def scenario() -> str:
        session = await start_session(store, tiny_model, n_ctx=2048)
        try:
            cid = store.create_conversation(sampling=SAMPLING).id
            with pytest.raises(EngineError) as refused:
                await session.send(cid, "What is this?", attachments=[image])
            assert [m.role for m in store.current_path(cid)] == ["user"]
            return str(refused.value)
        finally:
            await session.engine.close()

    words = run(scenario())
    assert "reads text only" in words and "mmproj" in words


def test_a_picture_the_engine_let_go_of_is_registered_again(
    store: ConversationStore, vision_model: str, run
) -> None:
    image = picture((120, 60, 30))

    async def scenario():
        session = await start_session(store, vision_model, n_ctx=2048)
        try:
            first = store.create_conversation(sampling=SAMPLING).id
            await session.send(first, "What is this?", attachments=[image])
            for shade in range(KEEP_IMAGES):  # the API's pictures push it out of the engine
                out = io.BytesIO()
                Image.new("RGB", (8, 8), (shade, 0, 0)).save(out, "PNG")
                await session.engine.image_run(out.getvalue())
            # another start, so no KV of the first conversation can be shared: read afresh
            other = store.create_conversation(system_prompt="Be brief.", sampling=SAMPLING).id
            return await session.send(other, "And this?", attachments=[image])
        finally:
            await session.engine.close()

    result = run(scenario())
    assert result.status == "complete" and result.stats.prefilled_tokens > IMAGE_TOKENS
