"""The server's pure parts: the reply store's matching rules, the reasoning split, the slot
choice, stop sequences, request checks, the key, and chat prompts built incrementally."""

from __future__ import annotations

import base64

import keyring
import pytest
from keyring.backends import fail

from app.engine.chat_template import ChatTemplate
from app.engine.llamacpp.backend import load_vocab
from app.engine.protocol import ModelInfo
from app.engine.transcript import IMAGE_MARK
from app.models.default import default_model_path
from app.server import auth
from app.server.prompts import ChatPrompts
from app.server.replay import ReplyStore
from app.server.replies import Reply
from app.server.schema import ApiError, Message, parse_chat, parse_completion
from app.server.slots import SlotMap
from app.toolcalls.reasoning import ReasoningSplitter, split_reasoning

FP = "model-a"


def test_reply_store_rules() -> None:
    store = ReplyStore()
    full = "<think>\nWhich town?\n</think>\n\nTown 3 has the most."
    reasoning, content = split_reasoning(full)
    assert (reasoning.strip(), content) == ("Which town?", "Town 3 has the most.")
    store.put(full, [1, 2, 3, 4], FP, reasoning=reasoning, content=content)

    assert store.find(full).tokens == (1, 2, 3, 4)  # 1. exact, reasoning inline
    assert store.find(content).tokens == (1, 2, 3, 4)  # 2. reasoning dropped by the client
    assert store.find(content, "Which town?").tokens == (1, 2, 3, 4)  # ... or sent back
    assert store.find(content, "Another thought") is None  # ... but not another reasoning
    assert store.find(f"  {content}\n").tokens == (1, 2, 3, 4)  # 3. trimmed or padded
    assert store.find("Town 3 has the most!") is None  # 4. edited: no match
    assert store.find(full).fingerprint == FP


def test_reply_store_keeps_the_newest_and_forgets_the_oldest() -> None:
    store = ReplyStore(max_replies=2)
    store.put("Hi", [1], FP)
    store.put("Hi", [2], FP)
    assert store.find("Hi").tokens == (2,)
    for i, text in enumerate("abcd"):  # each reply is kept under up to four keys
        store.put(text, [3 + i], FP)
    assert store.find("d") is not None and store.find("Hi") is None


def test_a_reasoning_only_reply_does_not_claim_empty_content() -> None:
    store = ReplyStore()
    store.put("<think>still going", [7, 8], FP, reasoning="still going", content="")
    assert store.find("") is None


@pytest.mark.parametrize(
    ("text", "opened", "expected"),
    [
        ("Hello <think>", False, ("", "Hello <think>")),
        ("  plain", False, ("", "  plain")),
        ("<thi", False, ("", "<thi")),
        ("<think>unfinished", False, ("unfinished", "")),
        ("thought</think>\nanswer", True, ("thought", "answer")),
    ],
)
def test_reasoning_split(text: str, opened: bool, expected: tuple[str, str]) -> None:
    assert split_reasoning(text, opened=opened) == expected


def test_reasoning_split_streamed_one_character_at_a_time_is_the_same() -> None:
    text = "<think>\nplan: be brief\n</think>\n\nDone <think> here."
    splitter = ReasoningSplitter()
    pieces = [splitter.feed(c) for c in text] + [splitter.finish()]
    assert "".join(r for r, _ in pieces) == split_reasoning(text)[0]
    assert "".join(c for _, c in pieces) == split_reasoning(text)[1] == "Done <think> here."


def test_slots_follow_conversations_not_shared_beginnings() -> None:
    slots = SlotMap()
    a = slots.acquire([1, 2, 3])
    slots.release(a, [1, 2, 3, 10, 11])
    b = slots.acquire([1, 2, 4])  # shares [1, 2] with a: another conversation
    assert b != a
    slots.release(b, [1, 2, 4, 20])
    assert slots.acquire([1, 2, 3, 10, 11, 12]) == a  # a's next turn
    assert slots.acquire([1, 2, 4, 20, 21]) == b
    slots.release(a, [1, 2, 3, 10, 11, 12, 13])
    slots.release(b, [1, 2, 4, 20, 21])
    assert slots.acquire([1, 2, 3]) == a  # a retry of a's first turn: a prefix of a
    c = slots.acquire([1, 2, 3, 10, 11, 12, 13, 14])  # a is busy: a new slot
    assert c not in (a, b)


def test_stop_sequences_cut_the_text_and_keep_exact_ids() -> None:
    reply = Reply(("END",))
    sent = [reply.add(i, piece) for i, piece in enumerate(["Hel", "lo ", "EN", "D!"])]
    assert "".join(sent) + reply.finish() == "Hello "
    assert reply.stopped and reply.exact_tokens() == [0, 1]
    inside = Reply(("ll",))
    for i, piece in enumerate(["Hel", "lo"]):
        inside.add(i, piece)
    assert inside.text == "He" and inside.exact_tokens() is None
    assert inside.kept_tokens() == []


def test_request_checks() -> None:
    chat = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": None, "reasoning_content": "hm"},
                {"role": "user", "content": "Again"},
            ],
            "max_completion_tokens": 5,
            "stop": "x",
        }
    )
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "user"]
    assert chat.messages[2].reasoning == "hm" and chat.params.max_tokens == 5
    assert chat.params.stop == ("x",)
    assert parse_completion({"model": "m", "prompt": [[5, 6]]}).prompt == (5, 6)
    unnamed = parse_chat({"messages": [{"role": "user", "content": "x"}]})
    assert unnamed.params.model == ""  # no `model`: the server's default model
    bad = [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, 400),
        ({"model": 3, "messages": [{"role": "user", "content": "x"}]}, 400),
        ({"model": "m", "messages": [{"role": "assistant", "content": "x"}]}, 400),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{}]}, 400),
    ]
    for body, status in bad:
        with pytest.raises(ApiError) as caught:
            parse_chat(body)
        assert caught.value.status == status and caught.value.message
    with pytest.raises(ApiError, match="one prompt"):
        parse_completion({"model": "m", "prompt": ["a", "b"]})


def test_api_key_without_a_keychain_is_made_once_and_kept_in_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(auth.ENV_VAR, raising=False)
    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        first = auth.resolve()
        assert first.source == "memory" and first.value.startswith("sk-stoke-")
        assert auth.resolve().value == first.value
        monkeypatch.setenv(auth.ENV_VAR, "from-env")
        assert auth.resolve() == auth.ApiKey("from-env", auth.resolve().where, "given")
        assert auth.resolve("from-flag").value == "from-flag"
        assert auth.authorized("Bearer from-flag", "from-flag")
        assert not auth.authorized("Bearer other", "from-flag")
        assert not auth.authorized(None, "from-flag")
    finally:
        auth.secrets.delete_token(auth.KEY_NAME)
        keyring.set_keyring(previous)


def test_chat_prompts_extend_the_last_transcript_and_use_exact_reply_ids() -> None:
    vocab = load_vocab(str(default_model_path()))
    info = ModelInfo(
        path="m.gguf",
        name="m",
        fingerprint=FP,
        architecture="llama",
        n_ctx=4096,
        n_ctx_train=4096,
        n_vocab=49152,
        chat_template=None,
        bos_token="",
        eos_token="",
        add_bos=False,
        bos_id=None,
        eog_ids=(),
        backend="llama.cpp",
        size_bytes=0,
    )
    renders = []

    class Counting(ChatTemplate):
        def render(self, messages, *, add_generation_prompt):
            renders.append(len(messages))
            return super().render(messages, add_generation_prompt=add_generation_prompt)

    template = Counting(None)
    replies = ReplyStore()
    prompts = ChatPrompts(replies)
    history = [Message("system", "Be brief."), Message("user", "Hi")]
    for turn in range(5):
        renders.clear()
        prompt = prompts.build(history, template, info, vocab)
        if turn >= 2:  # only the new reply and the new message are rendered
            assert len(renders) <= 2, renders
        assert prompt == ChatPrompts(replies).build(history, template, info, vocab)
        text = f"Reply number {turn}."
        sampled = [t for c in text for t in vocab.tokenize(c)]  # not how the text tokenizes
        replies.put(text, sampled, FP)
        history += [Message("assistant", text), Message("user", f"Next {turn}?")]
        following = prompts.build(history, template, info, vocab)
        assert following[: len(prompt) + len(sampled)] == prompt + sampled


def test_an_assistant_message_with_nothing_to_answer_is_refused_in_words() -> None:
    """The chat template can only write a reply after a message it answers: an assistant
    message first, or after another reply, is a 400 naming it (it was a 500)."""
    for history, where in (
        ([{"role": "assistant", "content": ""}, {"role": "user", "content": "Hi"}], 0),
        (
            [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Yes."},
                {"role": "assistant", "content": ""},
                {"role": "user", "content": "Go on."},
            ],
            2,
        ),
    ):
        with pytest.raises(ApiError) as caught:
            parse_chat({"model": "m", "messages": history})
        assert caught.value.param == f"messages[{where}].role"
        assert "nothing" not in caught.value.message and "assistant's" in caught.value.message


def test_a_mark_in_a_text_part_beside_an_image_is_left_out() -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 8).decode()
    part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    words = {"type": "text", "text": f"What{IMAGE_MARK} is this?"}
    body = {"model": "m", "messages": [{"role": "user", "content": [words, part]}]}
    chat = parse_chat(body)
    [message] = chat.messages
    assert message.text == f"What is this?\n{IMAGE_MARK}" and len(message.images) == 1
