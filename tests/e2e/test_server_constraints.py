"""The reply's shape under every field name clients send it (llama-server's `grammar` and
`json_schema`, vLLM's `guided_*`, OpenAI's `response_format`, the Responses API's
`text.format`), enforced on the tiny model, whose free text would match none of them; two
at once, or one the grammar library cannot use, refused in words naming the field."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
import requests

from tests.e2e.serving import API_KEY, ServerThread

SERVE_TINY = True  # conftest's `served` runs the tiny chat model
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "word": {"type": "string", "maxLength": 8}},
    "required": ["n", "word"],
}
ASK = [{"role": "user", "content": "Answer."}]


def _chat(served: ServerThread, **fields: object) -> str:
    reply = served.client().chat.completions.create(
        model=served.model, messages=ASK, max_tokens=40, temperature=0, extra_body=fields
    )
    return reply.choices[0].message.content or ""


@pytest.mark.parametrize(
    ("fields", "check"),
    [
        ({"guided_choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
        ({"guided_regex": "[a-c]{3}/[0-9]"}, lambda t: re.fullmatch(r"[a-c]{3}/[0-9]", t)),
        ({"grammar": 'root ::= "x" [0-9] [0-9]'}, lambda t: re.fullmatch(r"x[0-9]{2}", t)),
        ({"json_schema": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
        (
            {"guided_json": json.dumps(SCHEMA)},
            lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None,
        ),
    ],
    ids=["guided_choice", "guided_regex", "grammar-gbnf", "json_schema", "guided_json"],
)
def test_every_field_name_shapes_the_chat_reply(served: ServerThread, fields, check) -> None:
    text = _chat(served, **fields)
    assert check(text), f"{fields} gave {text!r}"


def test_a_completion_is_shaped_too(served: ServerThread) -> None:
    reply = served.client().completions.create(
        model=served.model,
        prompt="Say:",
        max_tokens=20,
        temperature=0,
        extra_body={"guided_choice": ["left", "right"]},
    )
    assert reply.choices[0].text in ("left", "right")


def test_two_shapes_or_an_unusable_one_are_refused_in_words(served: ServerThread) -> None:
    cases = [
        ({"json_schema": SCHEMA, "grammar": 'root ::= "a"'}, "grammar", "send one of them"),
        ({"grammar": "root ::= ("}, "grammar", "not a grammar Stoke can read"),
        ({"guided_choice": []}, "guided_choice", "list of non-empty strings"),
        (
            {"json_schema": {"type": "string", "format": "weird"}},
            "json_schema",
            "cannot be enforced: Unknown format: weird.",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"if": {}}}}},
            "response_format",
            'Unimplemented keys: ["if"]',
        ),
    ]
    for fields, param, words in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            _chat(served, **fields)
        error = caught.value.body
        assert error["param"] == param and words in error["message"], error
        assert "x-guidance" not in error["message"] and "%json" not in error["message"]


def test_responses_text_format_is_enforced_and_the_envelope_echoes_the_request(
    served: ServerThread,
) -> None:
    tools = [{"type": "function", "name": "noop", "parameters": {"type": "object"}}]
    text = {"format": {"type": "json_schema", "name": "pair", "schema": SCHEMA, "strict": True}}
    response = served.client().responses.create(
        model=served.model,
        input="Answer.",
        max_output_tokens=40,
        temperature=0,
        text=text,
        tools=tools,
        tool_choice="none",
    )
    jsonschema.validate(json.loads(response.output_text), SCHEMA)
    echoed = response.model_dump()
    assert echoed["tool_choice"] == "none"
    assert [t["name"] for t in echoed["tools"]] == ["noop"]
    assert echoed["text"]["format"]["name"] == "pair"


def test_the_404_names_every_endpoint(served: ServerThread) -> None:
    answer = requests.get(
        served.url + "/nowhere", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30
    )
    message = answer.json()["error"]["message"]
    assert answer.status_code == 404
    assert "/v1/messages" in message and "/v1/responses" in message
