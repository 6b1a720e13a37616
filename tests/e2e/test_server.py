"""`stoke serve`'s API with the official openai client against a real server on loopback:
stateless clients keep their KV, the token-id contract, prewarming. These are the server's
mechanisms, proven on the tests' tiny chat model (SmolLM2's tokenizer and template, random
weights): its replies are random tokens, which the server must find again all the same."""

from __future__ import annotations

import openai
import pytest

from app.engine.llamacpp.backend import load_vocab
from tests.e2e.serving import ServerThread, document

pytestmark = pytest.mark.e2e
FOLLOW_UPS = (
    "Which town has the most?",
    "Say that again in five words.",
    "Name one more town.",
    "Is that a lot?",
    "Thanks. One last word?",
)


SERVE_TINY = True  # conftest's `served` runs the tiny chat model


def _turn(client: openai.OpenAI, model: str, messages: list[dict], *, stream: bool):
    """One turn; returns (reply text, usage) either way the client asked."""
    if not stream:
        done = client.chat.completions.create(
            model=model, messages=messages, max_tokens=24, temperature=0
        )
        return done.choices[0].message.content, done.usage
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert [c.choices[0].finish_reason for c in chunks[:-1]].count(None) == len(chunks) - 2
    return text, chunks[-1].usage


def _ratio(usage) -> float:
    return usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens


def test_six_stateless_turns_reuse_the_kv(served: ServerThread) -> None:
    client = served.client()
    messages = [{"role": "user", "content": document("harbour") + "\nWhich town is first?"}]
    ratios = []
    for turn in range(6):
        text, usage = _turn(client, served.model, messages, stream=turn % 2 == 1)
        assert text.strip(), f"turn {turn + 1} replied nothing"
        ratios.append(_ratio(usage))
        if turn == 1:
            assert usage.prompt_tokens > 500  # long enough for the ratio to mean something
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]},
        ]
    assert all(r >= 0.95 for r in ratios[1:]), ratios


def test_interleaved_conversations_keep_their_own_kv(served: ServerThread) -> None:
    client = served.client()
    chats = {
        topic: [{"role": "user", "content": document(topic, 10) + "\nWhich town is first?"}]
        for topic in ("glacier", "orchard")
    }
    last: dict[str, object] = {}
    for turn in range(3):
        for topic, messages in chats.items():  # A1 B1 A2 B2 A3 B3
            text, usage = _turn(client, served.model, messages, stream=False)
            if topic in last:  # all the previous turn left in the KV is reused
                before = last[topic]
                held = before.prompt_tokens + before.completion_tokens - 1
                assert usage.prompt_tokens_details.cached_tokens >= held, (topic, turn, usage)
            last[topic] = usage
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": FOLLOW_UPS[turn]},
            ]


def test_replies_sent_back_trimmed_or_padded_still_match(served: ServerThread) -> None:
    client = served.client()
    messages = [{"role": "user", "content": document("lighthouse", 10) + "\nWhich is first?"}]
    text, first = _turn(client, served.model, messages, stream=False)
    held = first.prompt_tokens + first.completion_tokens - 1
    padded = [*messages, {"role": "assistant", "content": f"  {text.strip()}\n\n"}]
    _, usage = _turn(
        client, served.model, [*padded, {"role": "user", "content": "Why?"}], stream=False
    )
    assert usage.prompt_tokens_details.cached_tokens >= held, usage

    # A reply the client changed is not the model's: its tokens are new from there on.
    edited = [*messages, {"role": "assistant", "content": "Town 0, I believe."}]
    _, usage = _turn(
        client, served.model, [*edited, {"role": "user", "content": "Why?"}], stream=False
    )
    # At most the first prompt plus the few leading tokens the edit shares with the reply.
    assert usage.prompt_tokens_details.cached_tokens <= first.prompt_tokens + 3, usage


def test_max_tokens_zero_prefills_and_the_real_request_finds_it_cached(
    served: ServerThread,
) -> None:
    client = served.client()
    messages = [{"role": "user", "content": document("violin", 10) + "\nWhich is first?"}]
    warm = client.chat.completions.create(model=served.model, messages=messages, max_tokens=0)
    assert warm.choices[0].message.content == ""
    assert warm.usage.completion_tokens == 0
    assert warm.usage.prompt_tokens > 150
    real = client.chat.completions.create(
        model=served.model, messages=messages, max_tokens=8, temperature=0
    )
    assert real.usage.prompt_tokens == warm.usage.prompt_tokens
    assert real.usage.prompt_tokens_details.cached_tokens == warm.usage.prompt_tokens


def test_completions_take_token_ids_and_return_them(served: ServerThread) -> None:
    client = served.client()
    vocab = load_vocab(served.options.model_path)
    prompt = vocab.tokenize("<|im_start|>user\nCount from one to ten.<|im_end|>\n", special=True)
    prompt += vocab.tokenize("<|im_start|>assistant\n", special=True)
    ids_on = {"return_token_ids": True}
    whole = client.completions.create(
        model=served.model, prompt=prompt, max_tokens=12, temperature=0, extra_body=ids_on
    )
    assert whole.prompt_token_ids == prompt
    ids = whole.choices[0].token_ids
    assert len(ids) == whole.usage.completion_tokens > 0
    assert vocab.detokenize(ids).startswith(whole.choices[0].text)

    chunks = list(
        client.completions.create(
            model=served.model,
            prompt=prompt,
            max_tokens=12,
            temperature=0,
            stream=True,
            extra_body=ids_on,
        )
    )
    assert chunks[0].prompt_token_ids == prompt
    assert [t for c in chunks for t in c.choices[0].token_ids] == ids  # greedy: the same ids
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text

    # The next turn, as a remote engine sends it: prompt + sampled ids + new tokens.
    follow = prompt + ids + vocab.tokenize("<|im_end|>\n<|im_start|>user\nMore?", special=True)
    more = client.completions.create(
        model=served.model, prompt=follow, max_tokens=4, temperature=0, extra_body=ids_on
    )
    assert more.usage.prompt_tokens_details.cached_tokens >= len(prompt) + len(ids) - 1
