"""The edges of `stoke serve` a hostile or merely unusual client reaches: inputs that used to
get a 500 with Python's exception text (a lone surrogate, reserved template variables, deep
nesting, non-UTF-8 header bytes), fields that used to be dropped silently (penalties,
logit_bias, best_of, suffix), and the conventions clients expect (Retry-After, JSON errors for
unparseable HTTP, /v1/models/{id}, /health, routes without /v1, any model name)."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import openai
import pytest

from tests.e2e.serving import API_KEY, ServerThread

pytestmark = pytest.mark.e2e
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"  # greedy SmolLM2 keeps counting
REPEATING = "The cat sat on the mat. The cat sat on the mat. The cat"  # and repeats this
# What Python's exception text looks like; no client may ever read it.
LEAKS = ("Traceback", "Error:", "Exception", "codec", "surrogates not allowed", "recursion")


@pytest.fixture(scope="module")
def served(shared_home: Callable[[str], Path]) -> Iterator[ServerThread]:
    """The default model: it repeats itself (the penalties' test) and its few tokens a second
    keep a reply in flight (the 429's)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOKE_HOME", str(shared_home("edges-home")))
        with ServerThread(n_ctx=2048, max_in_flight=1) as server:
            yield server


def _request(
    served: ServerThread,
    method: str,
    path: str,
    body: bytes | None = None,
    *,
    key: str | None = API_KEY,
) -> tuple[int, dict, http.client.HTTPResponse]:
    connection = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    payload = json.loads(response.read())
    connection.close()
    return response.status, payload, response


def _raw(served: ServerThread, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are; returns the status, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", served.server.port), timeout=120) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def _assert_words(error: dict) -> None:
    """An OpenAI-shaped error whose message is a sentence, not Python's exception text."""
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["message"].endswith("."), error
    assert not any(leak in error["message"] for leak in LEAKS), error


def _chat(served: ServerThread, content: str = "Hi", **extra: object) -> dict:
    return {"model": served.model, "messages": [{"role": "user", "content": content}], **extra}


def _still_serves(served: ServerThread) -> None:
    reply = served.client().chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


# -- item 16: no 500s, no exception text ------------------------------------------------------


def test_a_lone_surrogate_in_any_text_field_is_400_naming_it(served: ServerThread) -> None:
    lone = "a\ud800b"  # json.dumps writes it as the escape \ud800, as a client would
    cases = [
        ("/v1/chat/completions", _chat(served, lone), "messages[0].content"),
        ("/v1/chat/completions", _chat(served, stop=[lone]), "stop[0]"),
        ("/v1/chat/completions", _chat(served, user=lone), "user"),
        ("/v1/chat/completions", {**_chat(served), "model": lone}, "model"),
        ("/v1/completions", {"model": served.model, "prompt": lone}, "prompt"),
        ("/v1/chat/completions", _chat(served, metadata={lone: "x"}), "metadata"),
    ]
    for path, body, param in cases:
        status, payload, _ = _request(served, "POST", path, json.dumps(body).encode())
        assert status == 400, (param, payload)
        _assert_words(payload["error"])
        assert payload["error"]["param"] == param
        assert "surrogate" in payload["error"]["message"]
    _still_serves(served)


@pytest.mark.parametrize("name", ["add_generation_prompt", "messages", "bos_token", "eos_token"])
def test_chat_template_kwargs_may_not_set_reserved_variables(
    served: ServerThread, name: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        served.client().chat.completions.create(
            model=served.model,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
            extra_body={"chat_template_kwargs": {name: "x"}},
        )
    _assert_words(caught.value.body)
    assert caught.value.body["param"] == "chat_template_kwargs"
    assert name in caught.value.body["message"]


def test_deeply_nested_json_is_400(served: ServerThread) -> None:
    depth = 100_000
    nested = b"[" * depth + b"]" * depth
    inside = json.dumps(_chat(served, extra="@")).encode().replace(b'"@"', nested)
    for body in (nested, inside):
        status, payload, _ = _request(served, "POST", "/v1/chat/completions", body)
        assert status == 400, payload
        _assert_words(payload["error"])
        assert "nested" in payload["error"]["message"]
    _still_serves(served)


def test_non_utf8_bytes_in_the_authorization_header_are_401(served: ServerThread) -> None:
    body = json.dumps(_chat(served)).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Authorization: Bearer \xff\xfe\xc3(" + API_KEY.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
        b"\r\n" + body
    )
    status, headers, answer = _raw(served, request)
    assert status == 401, answer
    assert headers["content-type"].startswith("application/json")
    _assert_words(json.loads(answer)["error"])
    _still_serves(served)


def test_an_internal_failure_is_500_in_words_only(
    served: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: object) -> list[int]:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(served.server.prompts, "build", broken)
    status, payload, _ = _request(
        served, "POST", "/v1/chat/completions", json.dumps(_chat(served)).encode()
    )
    assert status == 500
    _assert_words(payload["error"])
    assert "secret internal detail" not in payload["error"]["message"]
    assert "RuntimeError" not in payload["error"]["message"]


# -- item 17: penalties and logit_bias honoured, the rest refused -----------------------------


def _greedy_ids(
    served: ServerThread, max_tokens: int = 24, prompt: str = COUNTING, **extra: object
) -> list[int]:
    reply = served.client().completions.create(
        model=served.model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"return_token_ids": True, **extra},
    )
    return reply.choices[0].token_ids


def test_logit_bias_moves_the_greedy_token(served: ServerThread) -> None:
    first = _greedy_ids(served, 1)[0]
    banned = _greedy_ids(served, 1, logit_bias={str(first): -100})
    assert banned[0] != first
    forced = 1000 if first != 1000 else 1001
    assert _greedy_ids(served, 3, logit_bias={str(forced): 100}) == [forced] * 3
    # Through the chat endpoint too, with the openai client's own parameter.
    reply = served.client().chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=2,
        temperature=0,
        logit_bias={str(forced): 100},
        extra_body={"return_token_ids": True},
    )
    assert reply.choices[0].token_ids == [forced, forced]


def test_logit_bias_by_text_and_llama_servers_pairs(served: ServerThread) -> None:
    """llama-server's forms: [[id, bias]], [[text, bias]] (each of the text's tokens), a
    text key in the object, and `false` to ban."""
    first = _greedy_ids(served, 1)[0]
    assert _greedy_ids(served, 1, logit_bias=[[first, False]])[0] != first
    word = " banana"
    ids = served.server.engine.local_tokenizer().tokenize(word)
    assert _greedy_ids(served, 1, logit_bias=[[word, 100]])[0] in ids
    assert _greedy_ids(served, 1, logit_bias={word: 100})[0] in ids


def test_penalties_change_a_repetitive_reply(served: ServerThread) -> None:
    plain = _greedy_ids(served, prompt=REPEATING)
    for penalty in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"repeat_penalty": 1.8}):
        assert _greedy_ids(served, prompt=REPEATING, **penalty) != plain, penalty
        assert _greedy_ids(served, prompt=REPEATING) == plain, penalty  # none of it stays


def test_out_of_range_and_unsupported_sampling_fields_are_400(served: ServerThread) -> None:
    client = served.client()
    cases = [
        ({"presence_penalty": 5}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"logit_bias": {"1000": 150}}, "logit_bias"),
        ({"logit_bias": {"": 1}}, "logit_bias"),
        ({"logit_bias": {str(10**9): 1}}, "logit_bias"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"best_of": 2}, "best_of"),
        ({"suffix": " and the end."}, "suffix"),
    ]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(
                model=served.model, prompt="Hi", max_tokens=2, extra_body=fields
            )
        assert caught.value.body["param"] == param, fields
        _assert_words(caught.value.body)
    reply = client.completions.create(
        model=served.model, prompt="Hi", max_tokens=2, best_of=1, suffix=None
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


# -- item 18: what clients expect ---------------------------------------------------------------


def test_429_says_when_to_retry(served: ServerThread) -> None:
    client = served.client()
    stream = client.completions.create(
        model=served.model, prompt=COUNTING, max_tokens=1500, temperature=0, stream=True
    )
    try:
        next(iter(stream))  # the one in-flight request is running
        with pytest.raises(openai.RateLimitError) as caught:
            client.completions.create(model=served.model, prompt="Hi", max_tokens=2)
        assert int(caught.value.response.headers["Retry-After"]) >= 1
    finally:
        closer = threading.Thread(target=stream.close)
        closer.start()
        closer.join(30)
    served.call(_wait_idle(served))
    _still_serves(served)


async def _wait_idle(served: ServerThread) -> None:
    while served.server.stats.in_flight:
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    "garbage",
    [
        b"G\x00T /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad\x01Name: secret-bytes\r\n\r\n",
        b"GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: nope-secret\r\n\r\n",
    ],
)
def test_unparseable_http_gets_a_json_error_without_its_bytes(
    served: ServerThread, garbage: bytes
) -> None:
    status, headers, body = _raw(served, garbage)
    assert 400 <= status < 500
    assert headers["content-type"].startswith("application/json")
    assert b"secret" not in body and b"\\x" not in body
    _assert_words(json.loads(body)["error"])


def test_models_by_id_and_health_without_a_key(served: ServerThread) -> None:
    client = served.client()
    model = client.models.retrieve(served.model)
    assert model.id == served.model and model.object == "model"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no-such-model")
    assert caught.value.body["code"] == "model_not_found"
    for path in ("/health", "/v1/health"):
        status, payload, _ = _request(served, "GET", path, key=None)
        assert (status, payload) == (200, {"status": "ok"})


def test_routes_answer_without_the_v1_prefix(served: ServerThread) -> None:
    bare = openai.OpenAI(
        base_url=f"http://127.0.0.1:{served.server.port}", api_key=API_KEY, max_retries=0
    )
    assert [m.id for m in bare.models.list().data] == [served.model]
    chat = bare.chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert chat.choices[0].finish_reason in ("stop", "length")
    completion = bare.completions.create(model=served.model, prompt="Hi", max_tokens=2)
    assert completion.choices[0].finish_reason in ("stop", "length")
    status, _, _ = _request(served, "GET", "/models", key=None)
    assert status == 401  # the key is still required


def test_any_model_name_is_served_by_the_one_model_unless_strict(served: ServerThread) -> None:
    client = served.client()
    reply = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert reply.model == served.model
    config = served.server.config
    served.server.config = replace(config, strict_model=True)
    try:
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            )
        assert caught.value.body["code"] == "model_not_found"
        assert served.model in caught.value.body["message"]
    finally:
        served.server.config = config


def test_n_choices_each_from_the_same_prompt(served: ServerThread) -> None:
    """`n` > 1: that many choices, indexed, each drawn from the prompt alone (seeded one
    after another from the request's seed, so the same request gives the same choices)."""

    def ask() -> object:
        return served.client().chat.completions.create(
            model=served.model,
            messages=[{"role": "user", "content": "Say something."}],
            max_tokens=6,
            temperature=1.0,
            seed=7,
            n=3,
            extra_body={"return_token_ids": True},
        )

    first, again = ask(), ask()
    assert [c.index for c in first.choices] == [0, 1, 2]
    ids = [tuple(c.token_ids) for c in first.choices]
    assert ids == [tuple(c.token_ids) for c in again.choices]
    assert len(set(ids)) > 1  # three draws, not one reply thrice
    assert first.usage.completion_tokens == sum(len(i) for i in ids)
