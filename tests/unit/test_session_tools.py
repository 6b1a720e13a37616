"""How the session puts tool calls and tool results into the prompt: a real store, the real
ChatML template and the tool-call syntax the server uses too, with a tokenizer that keeps each
piece of text whole so the prompt reads back as text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.conversations import ConversationStore, ToolCall
from app.engine.chat_template import CHATML
from app.engine.protocol import ModelInfo
from app.session import ChatSession

FP = "model-fingerprint"


class PieceTokenizer:
    """One id per piece of text tokenized, remembering whether control tokens were parsed."""

    def __init__(self) -> None:
        self.pieces: list[tuple[str, bool]] = []

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        self.pieces.append((text, special))
        return [len(self.pieces) - 1]

    def text(self, ids: list[int]) -> str:
        return "".join(self.pieces[i][0] if i < len(self.pieces) else f"<#{i}>" for i in ids)


class Engine:
    """What the session reads of an engine to build prompts, and nothing else."""

    def __init__(self) -> None:
        self.tokenizer = PieceTokenizer()
        self.info = ModelInfo(
            path="model.gguf",
            name="model",
            fingerprint=FP,
            architecture="llama",
            n_ctx=4096,
            n_ctx_train=4096,
            n_vocab=1000,
            chat_template=CHATML,
            bos_token="",
            eos_token="<|im_end|>",
            add_bos=False,
            bos_id=None,
            eog_ids=(),
            backend="fake",
            size_bytes=0,
        )

    def local_tokenizer(self) -> PieceTokenizer:
        return self.tokenizer


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ConversationStore]:
    with ConversationStore.open(tmp_path / "c.db") as opened:
        yield opened


def _imported(store: ConversationStore, *, exact: bool = False) -> str:
    """A question, two calls (made elsewhere, or by this model with its exact tokens), their
    results, the answer and a new question."""
    cid = store.create_conversation(system_prompt="Use tools.").id
    user = store.add_message(cid, None, "user", "Weather in Paris and Oslo?")
    calls = (
        ToolCall("call_1", "get_weather", '{"city":  "Paris"}'),
        ToolCall("call_2", "get_weather", '{"city": "Oslo"}'),
    )
    own = {"token_ids": [990, 991], "tokens_fingerprint": FP} if exact else {}
    asked = store.add_message(cid, user.id, "assistant", "Looking.", tool_calls=calls, **own)
    paris = store.add_message(
        cid, asked.id, "tool", "18 C", tool_call_id="call_1", tool_name="get_weather"
    )
    oslo = store.add_message(cid, paris.id, "tool", "3 C", tool_call_id="call_2")
    answer = store.add_message(cid, oslo.id, "assistant", "Paris is warmer.")
    store.add_message(cid, answer.id, "user", "Thanks!")
    return cid


def _prompt(session: ChatSession, cid: str) -> list[int]:
    conversation = session.store.get_conversation(cid)
    return session.transcript(conversation, session.store.current_path(cid)).prompt()


def test_calls_made_elsewhere_are_written_as_the_model_writes_them(
    store: ConversationStore,
) -> None:
    engine = Engine()
    session = ChatSession(store, engine)

    text = engine.tokenizer.text(_prompt(session, _imported(store)))

    assert text == (
        "<|im_start|>system\nUse tools.<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris and Oslo?<|im_end|>\n"
        "<|im_start|>assistant\nLooking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>tool\n18 C<|im_end|>\n"
        "<|im_start|>tool\n3 C<|im_end|>\n"
        "<|im_start|>assistant\nParis is warmer.<|im_end|>\n"
        "<|im_start|>user\nThanks!<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    written = [piece for piece in engine.tokenizer.pieces if "<tool_call>" in piece[0]]
    assert written and all(special for _, special in written)  # the syntax's own tokens


def test_calls_this_model_made_keep_their_exact_tokens(store: ConversationStore) -> None:
    engine = Engine()
    session = ChatSession(store, engine)

    prompt = _prompt(session, _imported(store, exact=True))

    assert prompt[prompt.index(990) : prompt.index(990) + 2] == [990, 991]
    assert not any("<tool_call>" in text for text, _ in engine.tokenizer.pieces)


def test_turn_by_turn_gives_the_same_prompt_as_from_scratch(store: ConversationStore) -> None:
    """The cached transcript extended message by message (the window's path) and one built
    from the whole history agree, tool messages included."""
    cid = _imported(store)
    path = store.current_path(cid)
    engine = Engine()
    session = ChatSession(store, engine)
    conversation = store.get_conversation(cid)
    session.transcript(conversation, path[:1]).prompt()
    stepped = session.transcript(conversation, path).prompt()

    fresh = ChatSession(store, engine)
    assert engine.tokenizer.text(stepped) == engine.tokenizer.text(_prompt(fresh, cid))
