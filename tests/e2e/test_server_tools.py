"""Agents on `stoke serve` with the official openai client, on both engines: a tool loop
(tool_choice required, then auto; streamed and not) whose every turn reuses the whole KV of
the turn before, schema-valid structured output, and logprobs.

llama.cpp serves the real default model. MLX, whose CPU build decodes SmolLM2 at a few tokens
a second, serves the tests' tiny chat model (SmolLM2's tokenizer and template, random
weights): what it proves there is its own part, the grammar's mask and the KV a loop reuses,
and a random model's replies are valid only where the mask makes them so."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import jsonschema
import openai
import pytest

from tests.e2e.conftest import needs_mlx
from tests.e2e.serving import ServerThread

pytestmark = pytest.mark.e2e

# A city's name is bounded, so any model's call ends: a random model's strings run on.
CITY = {"type": "string", "maxLength": 20}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": CITY},
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": CITY, "hour24": {"type": "boolean"}},
            "required": ["city", "hour24"],
        },
    },
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 40},
        "likes": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "likes"],
    "additionalProperties": False,
}
TOPICS = ("a baker", "a pilot", "a farmer", "a poet", "a nurse")


@pytest.fixture(scope="module", params=["llama.cpp", pytest.param("mlx", marks=needs_mlx)])
def served(
    request: pytest.FixtureRequest, shared_home: Callable[[str], Path], tiny_model: str
) -> Iterator[ServerThread]:
    """llama.cpp on the default model; MLX on the tiny model (the module's docstring says why)."""
    model = tiny_model if request.param == "mlx" else None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOKE_HOME", str(shared_home("serve-home")))
        with ServerThread(backend=request.param, model=model) as server:
            yield server


def _call(
    client: openai.OpenAI, model: str, messages: list, choice, *, stream: bool, max_tokens: int = 48
):
    """One turn; returns (the assistant message as the client would send it back, usage,
    finish reason)."""
    kwargs = dict(
        model=model,
        messages=messages,
        tools=[WEATHER, CLOCK],
        tool_choice=choice,
        temperature=0,
        max_tokens=max_tokens,
    )
    if not stream:
        done = client.chat.completions.create(**kwargs)
        message = done.choices[0].message
        calls = [c.model_dump(exclude_none=True) for c in message.tool_calls or []]
        return (
            {"role": "assistant", "content": message.content, "tool_calls": calls},
            (done.usage),
            done.choices[0].finish_reason,
        )
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    content, calls = "", {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(
                call.index,
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            entry["id"] += call.id or ""
            entry["function"]["name"] += call.function.name or ""
            entry["function"]["arguments"] += call.function.arguments or ""
    finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    message = {"role": "assistant", "content": content or None, "tool_calls": list(calls.values())}
    return message, chunks[-1].usage, finish


def _resent(message: dict, turn: int) -> dict:
    """The message as an agent framework sends it back: ids rewritten, arguments
    re-serialized with other spacing and key order."""
    if not message["tool_calls"]:
        return {"role": "assistant", "content": message["content"]}
    calls = []
    for i, call in enumerate(message["tool_calls"]):
        args = json.loads(call["function"]["arguments"])
        text = json.dumps(dict(reversed(list(args.items()))), indent=2)
        calls.append(
            {
                "id": f"agent-{turn}-{i}",
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": text},
            }
        )
    return {"role": "assistant", "content": message["content"], "tool_calls": calls}


# What the server does with a call or a grammar whichever engine sampled it (naming, streaming
# pieces, json_object): on llama.cpp only; MLX proves its own part (the grammar's mask, the KV
# a loop reuses) in the tests that take both.
LLAMA_CPP_ONLY = pytest.mark.parametrize("served", ["llama.cpp"], indirect=True)


def test_tool_loop_reuses_the_kv_every_turn(served: ServerThread) -> None:
    _tool_loop(served, stream=False)


@LLAMA_CPP_ONLY
def test_streamed_tool_loop_reuses_the_kv_every_turn(served: ServerThread) -> None:
    _tool_loop(served, stream=True)


def _tool_loop(served: ServerThread, *, stream: bool) -> None:
    """Two required calls then an auto turn on llama.cpp; one of each on MLX, whose tiny
    model may spell a call in more tokens than SmolLM2 does."""
    client = served.client()
    messages: list = [
        {"role": "system", "content": "You help travellers. Use the tools."},
        {"role": "user", "content": f"Weather and time in Oslo, then Rome? ({stream})"},
    ]
    previous = None
    required, most = (2, 48) if served.backend == "llama.cpp" else (1, 96)
    for turn in range(required + 1):
        choice = "required" if turn < required else "auto"
        message, usage, finish = _call(
            client, served.model, messages, choice, stream=stream, max_tokens=most
        )
        if previous is not None:  # the engine held previous prompt + reply: all reused
            assert usage.prompt_tokens_details.cached_tokens >= previous - 1, (turn, usage)
        previous = usage.prompt_tokens + usage.completion_tokens
        if choice == "required":
            assert finish == "tool_calls", message
            assert len(message["tool_calls"]) >= 1
            for call in message["tool_calls"]:
                tool = {"get_weather": WEATHER, "get_time": CLOCK}[call["function"]["name"]]
                args = json.loads(call["function"]["arguments"])
                jsonschema.validate(args, tool["function"]["parameters"])
                assert call["id"]
        messages.append(_resent(message, turn))
        for i, call in enumerate(messages[-1].get("tool_calls", [])):
            result = f"Sunny, {18 + turn} C" if "weather" in call["function"]["name"] else "14:05"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            assert i < 8
        if messages[-1]["role"] != "tool":
            messages.append({"role": "user", "content": "And tomorrow?"})


@LLAMA_CPP_ONLY
@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
def test_streamed_call_arguments_come_as_sampled(served: ServerThread, choice) -> None:
    """Streamed, a call's first delta names it (index, id, type, function.name); its
    arguments follow in pieces as the model writes them, and put together they are the
    arguments the same request gets whole. A named choice calls that function, of the two
    offered, even for a request it does not fit."""
    named = isinstance(choice, dict)
    ask = "Tell me a joke." if named else "What time is it in Oslo, 24-hour clock?"
    kwargs = dict(
        model=served.model,
        messages=[
            {"role": "system", "content": "You help travellers. Use the tools."},
            {"role": "user", "content": ask},
        ],
        tools=[WEATHER, CLOCK] if named else [CLOCK],
        tool_choice=choice,
        temperature=0,
        max_tokens=48,
    )
    whole = served.client().chat.completions.create(**kwargs)
    (expected,) = whole.choices[0].message.tool_calls
    assert expected.function.name == "get_time"
    deltas = [
        call
        for chunk in served.client().chat.completions.create(**kwargs, stream=True)
        if chunk.choices
        for call in chunk.choices[0].delta.tool_calls or []
    ]
    first, rest = deltas[0], deltas[1:]
    assert (first.index, first.type, first.function.name) == (0, "function", "get_time")
    assert first.id and all(d.id is None and d.function.name is None for d in rest)
    pieces = [d.function.arguments for d in deltas if d.function.arguments]
    assert len(pieces) >= 3, pieces  # not one chunk at the end
    assembled = "".join(pieces)
    assert assembled == expected.function.arguments
    jsonschema.validate(json.loads(assembled), CLOCK["function"]["parameters"])


def test_json_schema_answers_validate(served: ServerThread) -> None:
    """Five prompts sampled at temperature 0.7 on llama.cpp; MLX applies the same mask
    (engine/constraint.py) to the tiny model's replies to the first 2."""
    client = served.client()
    for topic in TOPICS if served.backend == "llama.cpp" else TOPICS[:2]:
        done = client.chat.completions.create(
            model=served.model,
            messages=[{"role": "user", "content": f"Describe {topic} as a JSON person."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON, "strict": True},
            },
            temperature=0.7,
            seed=7,
            max_tokens=120,
        )
        assert done.choices[0].finish_reason == "stop", done.choices[0].message.content
        jsonschema.validate(json.loads(done.choices[0].message.content), PERSON)


@LLAMA_CPP_ONLY
def test_json_object(served: ServerThread) -> None:
    done = served.client().chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": "A city and its country."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=80,
    )
    assert isinstance(json.loads(done.choices[0].message.content), dict)


def test_logprobs(served: ServerThread) -> None:
    _logprobs(served, stream=False)


@LLAMA_CPP_ONLY
def test_streamed_logprobs(served: ServerThread) -> None:
    _logprobs(served, stream=True)


def _logprobs(served: ServerThread, *, stream: bool) -> None:
    kwargs = dict(
        model=served.model,
        messages=[{"role": "user", "content": "Say hello."}],
        logprobs=True,
        top_logprobs=3,
        temperature=0,
        max_tokens=6,
    )
    if stream:
        chunks = list(served.client().chat.completions.create(**kwargs, stream=True))
        content = [
            e
            for c in chunks
            if c.choices and c.choices[0].logprobs
            for e in c.choices[0].logprobs.content
        ]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        done = served.client().chat.completions.create(**kwargs)
        content, text = done.choices[0].logprobs.content, done.choices[0].message.content
    assert "".join(e.token for e in content) == text
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob <= 0
        assert entry.top_logprobs[0].token == entry.token  # greedy: the likeliest was drawn
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
