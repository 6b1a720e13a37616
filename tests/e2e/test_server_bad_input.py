"""Every bad request to `stoke serve` gets the right status and an error in words, and the
server keeps serving: malformed JSON, a wrong or missing key, an unknown model, an oversize
body, a prompt over the context, too many requests, a client that leaves mid-reply."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import openai
import pytest

from app.engine.worker import EngineState
from tests.e2e.serving import API_KEY, ServerThread, document

pytestmark = pytest.mark.e2e
MAX_BODY = 64 * 1024
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"  # greedy SmolLM2 keeps counting


@pytest.fixture(scope="module")
def served(shared_home: Callable[[str], Path]) -> Iterator[ServerThread]:
    """The default model, whose few tokens a second keep a long reply in flight while a
    client leaves or more requests come (the tiny model could finish it first)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOKE_HOME", str(shared_home("serve-home")))
        with ServerThread(n_ctx=2048, max_body_bytes=MAX_BODY, max_in_flight=3) as server:
            yield server


def _post(
    served: ServerThread,
    path: str,
    body: bytes,
    *,
    key: str | None = API_KEY,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=60)
    sent = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    connection.request("POST", path, body=body, headers=sent)
    response = connection.getresponse()
    payload = json.loads(response.read())
    connection.close()
    return response.status, payload


def _chat(served: ServerThread, **extra: object) -> bytes:
    body = {"model": served.model, "messages": [{"role": "user", "content": "Hi"}], **extra}
    return json.dumps(body).encode()


def _still_serves(served: ServerThread) -> None:
    reply = served.client().chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_missing_or_wrong_key_is_401(served: ServerThread) -> None:
    status, body = _post(served, "/v1/chat/completions", _chat(served), key=None)
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key"
    assert "Authorization: Bearer" in body["error"]["message"]
    wrong = openai.OpenAI(base_url=served.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="API key"):
        wrong.models.list()
    assert [m.id for m in served.client().models.list().data] == [served.model]
    _still_serves(served)


def test_malformed_json_and_wrong_shapes_are_400(served: ServerThread) -> None:
    status, body = _post(served, "/v1/chat/completions", b'{"model": "x", "messages": [')
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = _post(served, "/v1/chat/completions", b"[1, 2]")
    assert status == 400 and "JSON object" in body["error"]["message"]
    client = served.client()
    cases = [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 7}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 9}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2, "stream": True}, "n"),
    ]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=served.model, **fields)
        assert caught.value.body["param"] == param
        assert caught.value.body["message"].endswith(".")
    with pytest.raises(openai.BadRequestError, match="token ids outside the vocabulary"):
        client.completions.create(model=served.model, prompt=[1, 2, 10**9])
    _still_serves(served)


def test_unknown_model_and_route_are_404(served: ServerThread) -> None:
    config = served.server.config
    served.server.config = replace(config, strict_model=True)  # else any name is served
    try:
        with pytest.raises(openai.NotFoundError) as caught:
            served.client().chat.completions.create(
                model="gpt-5", messages=[{"role": "user", "content": "Hi"}]
            )
    finally:
        served.server.config = config
    assert caught.value.body["code"] == "model_not_found"
    assert served.model in caught.value.body["message"]
    status, body = _post(served, "/v1/audio/speech", b"{}")
    assert status == 404 and "/v1/chat/completions" in body["error"]["message"]
    _still_serves(served)


def test_oversize_body_is_413(served: ServerThread) -> None:
    big = _chat(served, user="x" * MAX_BODY)
    status, body = _post(served, "/v1/chat/completions", big)
    assert status == 413 and f"{MAX_BODY:,} bytes" in body["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: caught while reading
        yield big[: len(big) // 2]
        yield big[len(big) // 2 :]

    connection = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=60)
    connection.request(
        "POST",
        "/v1/chat/completions",
        body=chunks(),
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        encode_chunked=True,
    )
    response = connection.getresponse()
    assert response.status == 413
    assert "too large" in json.loads(response.read())["error"]["message"]
    connection.close()
    _still_serves(served)


def test_prompt_over_the_context_is_400_with_the_numbers(served: ServerThread) -> None:
    huge = document("comet", 300)  # about 6,000 tokens; the context holds 2,048
    with pytest.raises(openai.BadRequestError) as caught:
        served.client().chat.completions.create(
            model=served.model, messages=[{"role": "user", "content": huge}], stream=True
        )
    error = caught.value.body
    assert error["code"] == "context_length_exceeded"
    assert "2,048" in error["message"] and "tokens" in error["message"]
    _still_serves(served)


def test_a_client_that_leaves_mid_reply_frees_the_engine(served: ServerThread) -> None:
    client = served.client()
    before = served.server.stats.disconnected
    stream = client.completions.create(
        model=served.model, prompt=COUNTING, max_tokens=1500, temperature=0, stream=True
    )
    for received, _ in enumerate(stream):
        if received == 3:
            break
    stream.close()  # the connection closes mid-reply

    # A non-streamed reply whose client gives up waiting: also cancelled.
    impatient = served.client(timeout=1.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(
            model=served.model, prompt=COUNTING, max_tokens=1500, temperature=0
        )
    deadline = time.monotonic() + 30
    while served.server.stats.disconnected < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.server.stats.disconnected == before + 2
    # Both generations stopped early: no sequence holds anywhere near 1,500 tokens.
    _still_serves(served)
    held = [len(served.call(served.engine.resident_tokens(s))) for s in served.server.slots.names()]
    assert max(held) < 300, held
    assert served.engine.state == EngineState.READY
    assert served.server.stats.in_flight == 0


def test_more_requests_than_the_limit_get_429(served: ServerThread) -> None:
    client = served.client()
    streams = [
        client.completions.create(
            model=served.model, prompt=COUNTING, max_tokens=1500, temperature=0, stream=True
        )
        for _ in range(3)
    ]
    try:
        with pytest.raises(openai.RateLimitError, match="busy"):
            client.completions.create(model=served.model, prompt="Hi", max_tokens=2)
    finally:
        closers = [threading.Thread(target=s.close) for s in streams]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(30)
    deadline = time.monotonic() + 30
    while served.server.stats.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    _still_serves(served)


def test_cors_is_off_unless_an_origin_is_allowed(served: ServerThread) -> None:
    origin = {"Origin": "http://app.example"}

    def ask(method: str) -> http.client.HTTPResponse:
        connection = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=60)
        headers = {**origin, "Authorization": f"Bearer {API_KEY}"} if method == "GET" else origin
        connection.request(method, "/v1/models", headers=headers)
        response = connection.getresponse()
        response.read()
        connection.close()
        return response

    assert ask("GET").getheader("Access-Control-Allow-Origin") is None
    config = served.server.config
    served.server.config = replace(config, cors_origins=("http://app.example",))
    try:
        preflight = ask("OPTIONS")
        assert preflight.status == 204
        assert preflight.getheader("Access-Control-Allow-Origin") == "http://app.example"
        assert "Authorization" in preflight.getheader("Access-Control-Allow-Headers")
        assert ask("GET").getheader("Access-Control-Allow-Origin") == "http://app.example"
    finally:
        served.server.config = config
