"""Anthropic's Messages API on `stoke serve` with the official anthropic client, on the real
default model: the tool loop streamed and not, with `cache_read_input_tokens` covering the
whole previous turn every time, x-api-key auth, count_tokens, and refusals in words."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

from tests.e2e.serving import API_KEY, ServerThread

pytestmark = pytest.mark.e2e

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def _client(served: ServerThread, key: str = API_KEY) -> anthropic.Anthropic:
    base = served.url.removesuffix("/v1")  # the SDK adds /v1/messages itself
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)  # sends x-api-key


def _turn(client: anthropic.Anthropic, model: str, messages: list, choice: dict, stream: bool):
    kwargs = dict(
        model=model,
        max_tokens=48,
        system="You help travellers. Use the tools.",
        messages=messages,
        tools=[WEATHER],
        tool_choice=choice,
        extra_body={"temperature": 0},
    )
    if not stream:
        return client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as events:
        kinds = [event.type for event in events]
        message = events.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") >= 1
    return message


@pytest.mark.parametrize("stream", [False, True])
def test_tool_loop_reuses_the_kv_every_turn(served: ServerThread, stream: bool) -> None:
    client = _client(served)
    messages: list = [{"role": "user", "content": f"Weather in Oslo, Rome, Lima? ({stream})"}]
    previous = None
    for turn in range(5):
        choice = {"type": "any"} if turn < 4 else {"type": "auto"}
        message = _turn(client, served.model, messages, choice, stream)
        usage = message.usage
        if previous is not None:  # the engine held previous prompt + reply: all reused
            assert usage.cache_read_input_tokens >= previous - 1, (turn, usage)
        previous = usage.input_tokens + usage.cache_read_input_tokens + usage.output_tokens
        blocks = [block.model_dump(exclude_none=True) for block in message.content]
        uses = [b for b in blocks if b["type"] == "tool_use"]
        if choice["type"] == "any":
            assert message.stop_reason == "tool_use" and uses, blocks
            for use in uses:
                jsonschema.validate(use["input"], WEATHER["input_schema"])
        for i, use in enumerate(uses):  # sent back as agents do: ids rewritten
            use["id"] = f"toolu_agent_{turn}_{i}"
        for block in blocks:
            block.pop("citations", None)
        messages.append({"role": "assistant", "content": blocks or "…"})
        if uses:
            results = [
                {"type": "tool_result", "tool_use_id": u["id"], "content": "Sunny, 20 C"}
                for u in uses
            ]
            messages.append({"role": "user", "content": results})
        else:
            messages.append({"role": "user", "content": "Thanks. And tomorrow?"})
        json.dumps(messages)  # what goes back is plain JSON


def test_count_tokens_matches_the_prompt(served: ServerThread) -> None:
    client = _client(served)
    messages = [{"role": "user", "content": "Hello there"}]
    counted = client.messages.count_tokens(model=served.model, messages=messages)
    done = client.messages.create(model=served.model, max_tokens=4, messages=messages)
    assert counted.input_tokens == done.usage.input_tokens + done.usage.cache_read_input_tokens
    assert done.content[0].type == "text"
    assert done.stop_reason in ("max_tokens", "end_turn")


def test_wrong_key_and_unknown_blocks_are_refused_in_words(served: ServerThread) -> None:
    with pytest.raises(anthropic.AuthenticationError) as denied:
        _client(served, "sk-wrong").messages.create(
            model=served.model, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert "x-api-key" in str(denied.value)
    with pytest.raises(anthropic.BadRequestError) as refused:
        _client(served).messages.create(
            model=served.model,
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}],
        )
    assert "'image' block" in str(refused.value)
