"""Ollama's API on Stoke's server, through the official `ollama` Python client, on the tiny
model: a chat streamed and whole, a follow-up that reuses the first turn's KV, `format`
enforced, generate, and the model listed."""

from __future__ import annotations

import json

import ollama
import pytest

from tests.e2e.serving import API_KEY, ServerThread

SERVE_TINY = True  # conftest's `served` runs the tiny chat model


@pytest.fixture
def client(served: ServerThread) -> ollama.Client:
    return ollama.Client(
        host=served.url.removesuffix("/v1"), headers={"Authorization": f"Bearer {API_KEY}"}
    )


def test_chat_streamed_and_whole_and_the_follow_up_reuses_the_kv(
    client: ollama.Client, served: ServerThread
) -> None:
    options = {"temperature": 0, "num_predict": 8}
    history = [{"role": "user", "content": "Count: one, two"}]
    parts = list(client.chat(model=served.model, messages=history, stream=True, options=options))
    assert parts[-1].done and all(not p.done for p in parts[:-1])
    streamed = "".join(p.message.content for p in parts)
    assert parts[-1].eval_count == 8 and parts[-1].prompt_eval_count > 0
    whole = client.chat(model=served.model, messages=history, options=options)
    assert whole.message.content == streamed  # temperature 0, same prompt
    history += [whole.message.model_dump(exclude_none=True), {"role": "user", "content": "More"}]
    follow_up = client.chat(model=served.model, messages=history, options=options)
    first_prompt = parts[-1].prompt_eval_count
    assert follow_up.prompt_eval_count < first_prompt  # only the new turn was prefilled


def test_format_json_schema_is_enforced(client: ollama.Client, served: ServerThread) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    reply = client.chat(
        model=served.model,
        messages=[{"role": "user", "content": "A number"}],
        format=schema,
        options={"temperature": 0, "num_predict": 30},
    )
    assert isinstance(json.loads(reply.message.content)["ok"], bool)


def test_generate_tags_show_and_ps(client: ollama.Client, served: ServerThread) -> None:
    reply = client.generate(model=served.model, prompt="Hi", options={"num_predict": 4})
    assert reply.done and reply.eval_count == 4
    assert [m.model for m in client.list().models] == [served.model]
    assert client.show(served.model).template
    assert [m.model for m in client.ps().models] == [served.model]
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(
            model=served.model, messages=[{"role": "user", "content": "x", "images": ["aGk="]}]
        )
    assert "reads text only" in str(caught.value)  # a text model, in words
