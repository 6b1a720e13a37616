"""A last assistant message is the start of the reply (Anthropic's prefill, llama-server's
continuation): the prompt is the conversation before it, the assistant's opening and those
words; the reply sent back is what follows them."""

from __future__ import annotations

import anthropic

from tests.e2e.serving import API_KEY, ServerThread

SERVE_TINY = True  # conftest's `served` runs the tiny chat model
USER = {"role": "user", "content": "Name three colours."}
START = "Red, green and"


def _prompt_ids(served: ServerThread, messages: list[dict]) -> list[int]:
    reply = served.client().chat.completions.create(
        model=served.model,
        messages=messages,
        max_tokens=1,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    return reply.model_extra["prompt_token_ids"]


def test_chat_completions_continue_a_last_assistant_message(served: ServerThread) -> None:
    plain = _prompt_ids(served, [USER])
    continued = _prompt_ids(served, [USER, {"role": "assistant", "content": START}])
    words = served.server.engine.local_tokenizer().tokenize(START)
    assert continued == plain + words


def test_anthropic_prefill_is_continued(served: ServerThread) -> None:
    client = anthropic.Anthropic(
        base_url=served.url.removesuffix("/v1"), api_key=API_KEY, max_retries=0
    )
    message = client.messages.create(
        model=served.model,
        max_tokens=8,
        messages=[USER, {"role": "assistant", "content": START}],
    )
    plain = _prompt_ids(served, [USER])
    words = served.server.engine.local_tokenizer().tokenize(START)
    used = message.usage
    assert used.input_tokens + used.cache_read_input_tokens == len(plain) + len(words)
    assert message.content[0].type == "text" and message.stop_reason in ("end_turn", "max_tokens")
