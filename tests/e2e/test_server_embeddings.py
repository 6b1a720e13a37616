"""Embeddings from the served GGUF (the tiny model, mean-pooled: it names no pooling) through
the official openai client (float and its default base64) and Ollama's client: one unit vector
per input of the model's width, the same text the same vector, other text another."""

from __future__ import annotations

import math

import ollama
import openai
import pytest

from tests.e2e.serving import API_KEY, ServerThread

SERVE_TINY = True  # conftest's `served` runs the tiny chat model


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_openai_embeddings_float_base64_and_tokens(served: ServerThread) -> None:
    client = served.client()
    texts = ["The cat sat on the mat.", "The cat sat on the mat.", "Stock prices fell."]
    floats = client.embeddings.create(model=served.model, input=texts, encoding_format="float")
    vectors = [d.embedding for d in floats.data]
    assert [d.index for d in floats.data] == [0, 1, 2]
    assert all(math.isclose(math.sqrt(_cosine(v, v)), 1.0, rel_tol=1e-4) for v in vectors)
    assert _cosine(vectors[0], vectors[1]) > 0.9999 > _cosine(vectors[0], vectors[2])
    assert floats.usage.prompt_tokens > 0
    packed = client.embeddings.create(model=served.model, input=texts[0])  # base64 on the wire
    assert max(abs(x - y) for x, y in zip(packed.data[0].embedding, vectors[0], strict=True)) < 1e-6
    ids = served.server.engine.local_tokenizer().tokenize(texts[2])
    by_ids = client.embeddings.create(model=served.model, input=[ids], encoding_format="float")
    assert _cosine(by_ids.data[0].embedding, vectors[2]) > 0.9999
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=served.model, input=texts[0], dimensions=3)
    assert "cannot be shortened" in caught.value.body["message"]


def test_ollama_embed_gives_the_same_vectors(served: ServerThread) -> None:
    client = ollama.Client(
        host=served.url.removesuffix("/v1"), headers={"Authorization": f"Bearer {API_KEY}"}
    )
    text = "The cat sat on the mat."
    theirs = client.embed(model=served.model, input=[text]).embeddings[0]
    ours = served.client().embeddings.create(
        model=served.model, input=text, encoding_format="float"
    )
    assert _cosine(list(theirs), ours.data[0].embedding) > 0.9999
