"""Anthropic's Messages API on `stoke serve` with the official anthropic client: the tool loop
streamed and not, with `cache_read_input_tokens` covering the whole previous turn every time,
x-api-key auth, count_tokens, refusals in words and in Anthropic's error shape (before and
after a stream began), and a thinking block round trip on a reasoning template.

The tool loop, the counts and the refusals are the server's mechanisms, proven on the tests'
tiny chat model (SmolLM2's tokenizer and template, random weights; the grammar makes its
calls valid). The real default model keeps what needs it: a reply long enough for its engine
to be killed mid-stream, and thoughts written in the form it is shown."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest

from tests.e2e.serving import API_KEY, ServerThread

# Qwen3.5's ChatML template: with thinking on, its generation prompt opens `<think>`
REASONING_TEMPLATE = (
    Path(__file__).parents[1] / "fixtures" / "chat_templates" / "Qwen-Qwen3.5-4B.jinja"
)

pytestmark = pytest.mark.e2e

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},  # a random model's ends
        "required": ["city"],
    },
}


SERVE_TINY = True  # conftest's `served` runs the tiny chat model


def _client(served: ServerThread, key: str = API_KEY) -> anthropic.Anthropic:
    base = served.url.removesuffix("/v1")  # the SDK adds /v1/messages itself
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)  # sends x-api-key


def _turn(client: anthropic.Anthropic, model: str, messages: list, choice: dict, stream: bool):
    kwargs = dict(
        model=model,
        max_tokens=96,  # a call, in however many tokens the random model spells it
        system="You help travellers. Use the tools.",
        messages=messages,
        tools=[WEATHER],
        tool_choice=choice,
        extra_body={"temperature": 0},
    )
    if not stream:
        return client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as events:
        seen = list(events)
        message = events.get_final_message()
    kinds = [event.type for event in seen]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") >= 1
    uses = sum(block.type == "tool_use" for block in message.content)
    pieces = [
        e for e in seen if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    if uses:  # each call's input streamed as it was written (an auto turn may have none)
        assert len(pieces) > 2 * uses
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
    assert _error(denied.value)["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError) as refused:
        _client(served).messages.create(
            model=served.model,
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}],
        )
    assert "'document' block" in str(refused.value)
    with pytest.raises(anthropic.BadRequestError) as refused:
        _client(served).messages.create(
            model=served.model,
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}],
        )
    assert "base64 source" in str(refused.value)
    assert _error(refused.value)["type"] == "invalid_request_error"


def _error(exc: anthropic.APIStatusError) -> dict:
    """The error object of an Anthropic-shaped body; its message is words, not Python's."""
    body = exc.body
    assert isinstance(body, dict) and body["type"] == "error", body
    error = body["error"]
    assert set(error) == {"type", "message"}
    assert "Traceback" not in error["message"] and "Error(" not in error["message"]
    return error


def test_errors_in_anthropics_shape(served: ServerThread) -> None:
    """Every refusal on /v1/messages and count_tokens, as the SDK's own error classes."""
    client = _client(served)
    user = [{"role": "user", "content": "hi"}]
    cases = [
        (anthropic.BadRequestError, "invalid_request_error", dict(max_tokens=4, messages=[])),
        (anthropic.BadRequestError, "invalid_request_error", dict(max_tokens=-1, messages=user)),
        (
            anthropic.BadRequestError,
            "invalid_request_error",
            dict(max_tokens=4, messages=user, thinking={"type": "sometimes"}),
        ),
    ]
    for kind, type_, kwargs in cases:
        with pytest.raises(kind) as caught:
            client.messages.create(model=served.model, **kwargs)
        assert _error(caught.value)["type"] == type_
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.count_tokens(model=served.model, messages=[])
    assert "`messages`" in _error(caught.value)["message"]
    with pytest.raises(anthropic.AuthenticationError) as caught:
        _client(served, "sk-wrong").messages.count_tokens(model=served.model, messages=user)
    assert _error(caught.value)["type"] == "authentication_error"
    with pytest.raises(openai.BadRequestError) as refused:  # the OpenAI routes keep theirs
        served.client().chat.completions.create(model=served.model, messages=[])
    assert refused.value.body["type"] == "invalid_request_error" and "param" in refused.value.body


@pytest.fixture
def own_server(stoke_home: Path) -> Iterator[ServerThread]:
    """A server of its own, in the test's home, for a test that kills its engine: the default
    model, whose few tokens a second leave the kill time to land mid-reply."""
    with ServerThread() as server:
        yield server


def test_engine_lost_mid_stream_is_an_error_event(own_server: ServerThread) -> None:
    """Once the stream has begun, the failure comes as Anthropic's `error` event, which the
    SDK raises as its own error with the body it carried."""
    client = _client(own_server)
    kinds = []
    with (
        pytest.raises(anthropic.APIStatusError) as caught,
        client.messages.stream(
            model=own_server.model,
            max_tokens=400,
            messages=[{"role": "user", "content": "Tell me a long story about the sea."}],
            extra_body={"temperature": 0},
        ) as events,
    ):
        for event in events:
            kinds.append(event.type)
            if event.type == "content_block_delta" and kinds.count(event.type) == 3:
                os.kill(own_server.engine.pid, signal.SIGKILL)
    assert kinds[0] == "message_start" and "content_block_delta" in kinds
    error = _error(caught.value)
    assert error["type"] == "overloaded_error" and "Restarting" in error["message"]


@pytest.fixture(scope="module")
def reasoning(shared_home: Callable[[str], Path]) -> Iterator[ServerThread]:
    """The default model under a reasoning template (LoadOptions.chat_template, as
    `stoke serve --chat-template FILE` sets it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOKE_HOME", str(shared_home("reasoning-home")))
        server = ServerThread()
        server.options = dataclasses.replace(
            server.options, chat_template=REASONING_TEMPLATE.read_text()
        )
        with server:
            yield server


# The 135M model copies the form it is shown: thoughts, `</think>`, then an answer.
SHOWN = (
    "Reply in this form, first your thoughts, then the answer:\n<think>\nThe user asks for "
    "a colour. Blue is a colour.\n</think>\n\nBlue.\n\nWhat is 2+2?"
)


@pytest.mark.parametrize(("stream", "send_back"), [(False, True), (True, True), (True, False)])
def test_thinking_round_trip(reasoning: ServerThread, stream: bool, send_back: bool) -> None:
    """Thinking on: the reply's reasoning comes as a thinking block; sent back with it (as
    either reply gave it) or with it dropped (the text block alone, as both give it), the
    next turn reuses the whole previous prompt and reply."""
    client = _client(reasoning)
    messages: list = [{"role": "user", "content": SHOWN}]
    kwargs = dict(
        model=reasoning.model,
        max_tokens=60,
        system="After your thoughts, always write </think> and then the answer.",
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body={"temperature": 0, "seed": 7},
    )
    first = _turn_plain(client, messages, kwargs, stream)
    kinds = [block.type for block in first.content]
    assert kinds == ["thinking", "text"], first.content
    assert first.content[0].thinking.strip() and first.content[1].text.strip()
    previous = (
        first.usage.input_tokens + first.usage.cache_read_input_tokens + first.usage.output_tokens
    )
    blocks = [b.model_dump(exclude_none=True) for b in first.content]
    for block in blocks:
        block.pop("citations", None)
    messages.append({"role": "assistant", "content": blocks if send_back else blocks[1:]})
    messages.append({"role": "user", "content": "And 3+3?"})
    second = _turn_plain(client, messages, kwargs, stream)
    assert second.usage.cache_read_input_tokens >= previous - 1, (previous, second.usage)


def _turn_plain(client: anthropic.Anthropic, messages: list, kwargs: dict, stream: bool):
    if not stream:
        return client.messages.create(messages=messages, **kwargs)
    with client.messages.stream(messages=messages, **kwargs) as events:
        deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
        message = events.get_final_message()
    assert "thinking_delta" in deltas and "text_delta" in deltas
    return message


def test_a_reply_all_thinking_is_replayed(reasoning: ServerThread) -> None:
    """A reply cut inside its thinking (a thinking block alone), sent back as it came: the
    next turn reuses the whole previous prompt and reply."""
    client = _client(reasoning)
    messages: list = [{"role": "user", "content": "Think about the number 7."}]
    kwargs = dict(
        model=reasoning.model,
        max_tokens=12,
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body={"temperature": 0},
    )
    first = client.messages.create(messages=messages, **kwargs)
    assert first.content[0].type == "thinking" and first.stop_reason == "max_tokens"
    held = (
        first.usage.input_tokens + first.usage.cache_read_input_tokens + first.usage.output_tokens
    )
    blocks = [b.model_dump(exclude_none=True) for b in first.content if b.type == "thinking"]
    messages += [{"role": "assistant", "content": blocks}, {"role": "user", "content": "Go on."}]
    second = client.messages.create(messages=messages, **kwargs)
    assert second.usage.cache_read_input_tokens >= held - 1, (held, second.usage)
