"""Tools through a remote engine in `chat` mode, on loopback with real HTTP.

The `served` Stoke is the remote server: it applies tools, tool choice and response_format
itself (its template, its tool parser, its grammar), on the tests' tiny chat model (SmolLM2's
tokenizer and template, random weights, whose calls and JSON the grammar makes valid): what is
proven is the passing through, whatever the model says. A second Stoke
server runs on it as a remote engine in chat mode and passes them through. The official
openai client against that front server does a tool round trip (tool_choice required, a
tool result, again, then auto) and structured output, streamed and not; each of the front's
answers is the one the remote gives the same messages directly, and a request the remote
refuses reaches the client as the remote's words.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest

from app.engine.protocol import LoadOptions, RemoteOptions
from tests.e2e.serving import API_KEY, ServerThread
from tests.e2e.test_server_tools import CLOCK, PERSON, TOPICS, WEATHER, _call, _resent

pytestmark = pytest.mark.e2e


SERVE_TINY = True  # conftest's `served` runs the tiny chat model


@pytest.fixture(scope="module")
def front(served: ServerThread) -> Iterator[ServerThread]:
    """A Stoke server whose engine is `served`, reached in chat mode."""
    server = ServerThread()
    server.options = LoadOptions(
        "", n_ctx=4096, remote=RemoteOptions(served.url, mode="chat", api_key=API_KEY)
    )
    with server:
        yield server


def _meaning(message: dict) -> tuple:
    """What a reply says, ids left out (each server gives its own)."""
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message["tool_calls"]
    ]
    return message["content"] or None, calls


@pytest.mark.parametrize("stream", [False, True])
def test_tool_round_trip_passes_through(
    front: ServerThread, served: ServerThread, stream: bool
) -> None:
    assert front.engine.info.backend == "remote" and front.model == served.model
    messages: list = [
        {"role": "system", "content": "You help travellers. Use the tools."},
        {"role": "user", "content": f"Weather and time in Oslo, then Rome? ({stream})"},
    ]
    for turn, choice in enumerate(("required", "required", "auto")):
        message, usage, finish = _call(
            front.client(), front.model, messages, choice, stream=stream, max_tokens=96
        )
        direct, _, direct_finish = _call(
            served.client(), served.model, messages, choice, stream=stream, max_tokens=96
        )
        assert (_meaning(message), finish) == (_meaning(direct), direct_finish), turn
        assert usage.prompt_tokens > 0  # the remote's own count, passed on
        if choice == "required":
            assert finish == "tool_calls" and message["tool_calls"], message
            for call in message["tool_calls"]:
                tool = {"get_weather": WEATHER, "get_time": CLOCK}[call["function"]["name"]]
                args = json.loads(call["function"]["arguments"])
                jsonschema.validate(args, tool["function"]["parameters"])
                assert call["id"]
        else:
            assert finish in ("stop", "length", "tool_calls")
            assert message["content"] or message["tool_calls"]
        messages.append(_resent(message, turn))
        for call in messages[-1].get("tool_calls", []):
            result = f"Sunny, {18 + turn} C" if "weather" in call["function"]["name"] else "14:05"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_passes_through(front: ServerThread, stream: bool) -> None:
    client = front.client()
    for topic in TOPICS[:3]:
        kwargs = dict(
            model=front.model,
            messages=[{"role": "user", "content": f"Describe {topic} as a JSON person."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON, "strict": True},
            },
            temperature=0.7,
            seed=7,
            max_tokens=120,
        )
        if stream:
            chunks = list(client.chat.completions.create(**kwargs, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            done = client.chat.completions.create(**kwargs)
            text, finish = done.choices[0].message.content, done.choices[0].finish_reason
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), PERSON)


UNENFORCEABLE = {"type": "object", "properties": {"code": {"type": "string", "pattern": "(?=a)b"}}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("field", ["response_format", "tools"])
def test_what_the_remote_refuses_reaches_the_client_in_words(
    front: ServerThread, served: ServerThread, field: str, stream: bool
) -> None:
    kwargs: dict = dict(
        model=front.model, messages=[{"role": "user", "content": "A code?"}], max_tokens=16
    )
    if field == "tools":
        tool = {"type": "function", "function": {"name": "f", "parameters": UNENFORCEABLE}}
        kwargs.update(tools=[tool], tool_choice="required")
    else:
        spec = {"name": "code", "schema": UNENFORCEABLE}
        kwargs["response_format"] = {"type": "json_schema", "json_schema": spec}
    client = front.client()
    with pytest.raises(openai.APIError) as caught:
        if stream:
            list(client.chat.completions.create(**kwargs, stream=True))
        else:
            client.chat.completions.create(**kwargs)
    words = caught.value.message
    # the front checks nothing itself in chat mode: these are the remote's words, relayed
    assert f"The server at {served.url.removesuffix('/v1')} refused" in words, words
    assert f"The JSON schema in `{field}` cannot be enforced" in words, words
    assert "Traceback" not in words and "Error(" not in words
    if not stream:  # a refusal is the request's fault: 400, which the SDK does not retry
        assert isinstance(caught.value, openai.BadRequestError), caught.value
