"""OpenAI's Responses API on `stoke serve` with the official openai client: four turns
continued by `previous_response_id` (streamed and not), each prefilling only its new input,
and a function call continued with its output. The server's mechanisms, proven on the tests'
tiny chat model (SmolLM2's tokenizer and template, random weights; the grammar makes its call
valid)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.e2e.serving import ServerThread

pytestmark = pytest.mark.e2e
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},  # a random model's ends
        "required": ["city"],
    },
}


SERVE_TINY = True  # conftest's `served` runs the tiny chat model


def _create(served: ServerThread, stream: bool, **kwargs):
    client = served.client()
    kwargs = {"model": served.model, "temperature": 0, "max_output_tokens": 24, **kwargs}
    if not stream:
        return client.responses.create(**kwargs)
    events = list(client.responses.create(**kwargs, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert deltas == done.output_text
    return done


@pytest.mark.parametrize("stream", [False, True])
def test_previous_response_id_prefills_only_the_new_input(
    served: ServerThread, stream: bool
) -> None:
    previous = None
    asks = ("Name a fruit.", "Its colour?", "One more fruit?", "Thanks!")
    for turn, ask in enumerate(asks):
        response = _create(
            served,
            stream,
            instructions="Answer in a few words.",
            input=f"{ask} ({stream})" if turn == 0 else ask,
            previous_response_id=previous.id if previous else None,
        )
        assert response.status in ("completed", "incomplete") and response.output_text
        usage = response.usage
        if previous is not None:  # everything the engine held after the last turn is reused
            held = previous.usage.input_tokens + previous.usage.output_tokens
            assert usage.input_tokens_details.cached_tokens >= held - 1, (turn, usage)
            new_input = served.server.engine.local_tokenizer().tokenize(ask)
            prefilled = usage.input_tokens - usage.input_tokens_details.cached_tokens
            assert prefilled <= len(new_input) + 12  # the new message and its turn markers
        previous = response


def test_function_call_then_its_output(served: ServerThread) -> None:
    first = _create(
        served,
        False,
        input="Weather in Oslo?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=64,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    second = _create(
        served,
        True,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}],
        tools=[WEATHER],
    )
    held = first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= held - 1


def test_unknown_previous_response_is_404_in_words(served: ServerThread) -> None:
    import openai

    with pytest.raises(openai.NotFoundError) as missing:
        served.client().responses.create(
            model=served.model, input="hi", previous_response_id="resp_nope"
        )
    assert "No stored response" in str(missing.value)
