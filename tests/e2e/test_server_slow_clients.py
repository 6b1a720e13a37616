"""Slow and idle clients cannot hold `stoke serve`'s connections forever: unfinished headers
and idle keep-alive connections are closed after the header timeout, a dripped body gets 408
after the body timeout, and open connections count against a limit (429 with Retry-After
beyond it). Raw sockets, since no real client misbehaves on purpose; the timeouts are small
here and 30 s by default. No reply is generated here, so the server runs the tests' tiny chat
model."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import select
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.e2e.serving import API_KEY, ServerThread

pytestmark = pytest.mark.e2e
TIMEOUT_S = 1.0  # the server's header and body timeouts in this file
PATIENCE_S = 120.0  # how long a test waits for the server to act (a busy machine is slow)
LIMIT = 4


@pytest.fixture(scope="module")
def served(shared_home: Callable[[str], Path], tiny_model: str) -> Iterator[ServerThread]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOKE_HOME", str(shared_home("slow-home")))
        with ServerThread(
            model=tiny_model,
            n_ctx=1024,
            header_timeout_s=TIMEOUT_S,
            body_timeout_s=TIMEOUT_S,
            max_connections=LIMIT,
        ) as server:
            yield server


def _connect(served: ServerThread) -> socket.socket:
    return socket.create_connection(("127.0.0.1", served.server.port), timeout=PATIENCE_S)


def _drip_until_closed(sock: socket.socket, drip: bytes, *, answer_ends_it: bool = False) -> bytes:
    """Send `drip` a byte at a time (one per 0.2 s) until the server closes or, with
    `answer_ends_it`, until a whole answer has come (after an answer that says
    `Connection: close`, aiohttp may go on reading the unread body for 10 s before it
    closes); returns what it sent (b"" when it only closed). Fails if it never does."""
    deadline = time.monotonic() + PATIENCE_S
    received, i = b"", 0
    while time.monotonic() < deadline:
        if i < len(drip):
            try:
                sock.sendall(drip[i : i + 1])
            except (BrokenPipeError, ConnectionResetError):
                return received
            i += 1
        readable, _, _ = select.select([sock], [], [], 0.2)
        if readable:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk
            if answer_ends_it and _whole(received):
                return received
    pytest.fail(f"the server kept the connection open for {PATIENCE_S:.0f} s")


def _whole(answer: bytes) -> bool:
    """Whether `answer` holds a response's head and all the body its Content-Length says."""
    head, blank, body = answer.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    return bool(blank) and length is not None and len(body) >= int(length[1])


def test_unfinished_headers_are_closed(served: ServerThread) -> None:
    with _connect(served) as sock:
        assert (
            _drip_until_closed(sock, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Drip: " * 50) == b""
        )
    with _connect(served) as sock:  # connected, and nothing sent at all
        assert _drip_until_closed(sock, b"") == b""


def test_idle_keep_alive_connections_are_closed(served: ServerThread) -> None:
    with _connect(served) as sock:
        key = f"Authorization: Bearer {API_KEY}\r\n"
        sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{key}\r\n".encode())
        answer = _drip_until_closed(sock, b"")
    assert answer.startswith(b"HTTP/1.1 200")  # answered, kept alive, then closed when idle


def test_a_dripped_body_gets_408(served: ServerThread) -> None:
    body = json.dumps(
        {"model": served.model, "messages": [{"role": "user", "content": "Hi"}]}
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) + 1000}\r\n\r\n"
    ).encode()
    with _connect(served) as sock:
        sock.sendall(head)
        answer = _drip_until_closed(sock, body, answer_ends_it=True)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 408"), answer
    assert re.search(rb"(?im)^connection: *close\b", rest.partition(b"\r\n\r\n")[0]), answer
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "request_timeout" and "body" in error["message"]


def test_connections_count_against_the_limit(served: ServerThread) -> None:
    config = served.server.config
    served.server.config = replace(config, header_timeout_s=PATIENCE_S)  # the slow ones stay
    try:
        slow = [_connect(served) for _ in range(LIMIT)]
        for sock in slow:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # and never finish
        served.call(_until(lambda: served.server.open_connections >= LIMIT))
        status, headers, error = _get_models(served)
        assert status == 429 and int(headers["retry-after"]) >= 1
        assert error["code"] == "too_many_connections" and str(LIMIT) in error["message"]
    finally:
        served.server.config = config
        for sock in slow:
            sock.close()
    served.call(_until(lambda: served.server.open_connections == 0))
    status, _, _ = _get_models(served)
    assert status == 200


def _get_models(served: ServerThread) -> tuple[int, dict[str, str], dict]:
    connection = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=PATIENCE_S)
    connection.request("GET", "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    response = connection.getresponse()
    payload = json.loads(response.read())
    connection.close()
    headers = {k.lower(): v for k, v in response.getheaders()}
    return response.status, headers, payload.get("error", payload)


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.02)


def test_a_burst_of_connections_is_held_to_the_limit(served: ServerThread) -> None:
    """40 connections opened at once, each then asking once: while all are open, no more than
    the limit are answered 200; the rest get 429 (counted as each is accepted, not a loop turn
    later, when a burst would all find the count short)."""
    config = served.server.config
    served.server.config = replace(config, header_timeout_s=PATIENCE_S)
    burst = [socket.socket() for _ in range(40)]
    try:
        for sock in burst:
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", served.server.port))
        served.call(_until(lambda: served.server.open_connections >= len(burst)))
        request = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n\r\n"
        statuses = []
        for sock in burst:
            sock.setblocking(True)
            sock.settimeout(PATIENCE_S)
            sock.sendall(request.encode())
            statuses.append(sock.recv(12)[9:12])
    finally:
        served.server.config = config
        for sock in burst:
            sock.close()
    assert statuses.count(b"200") == LIMIT and statuses.count(b"429") == len(burst) - LIMIT
