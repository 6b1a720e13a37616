"""HTTP for remote engines: JSON requests, server-sent event streams, errors in words.

The standard library's http.client is enough: one connection per request (servers on a LAN or
loopback), JSON bodies, and SSE read line by line. A reply being streamed is cancelled by
shutting its socket down from a watcher thread, so a cancel lands even while the server is
still prefilling and has sent nothing yet; a well-behaved server then stops generating.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.engine.protocol import CancelToken, ContextOverflowError, EngineError

CONNECT_TIMEOUT_S = 10.0
_CANCEL_POLL_S = 0.05


class RemoteError(EngineError):
    """The remote server could not be reached or refused the request; the message says why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)

    def __reduce__(self):  # keep the status when the error crosses the process boundary
        return (type(self), (str(self), self.status))


class RemoteCancelled(Exception):
    """The caller cancelled while the request was in flight."""


@dataclass(frozen=True)
class Endpoint:
    """Where a remote server lives and how to authenticate with it."""

    url: str  # scheme://host[:port][/prefix], no trailing slash
    api_key: str | None = None
    timeout_s: float = 300.0  # longest silence while waiting for a reply (a long prefill)

    @classmethod
    def parse(cls, url: str, api_key: str | None = None, timeout_s: float = 300.0) -> Endpoint:
        """A checked endpoint; `/v1` at the end of a pasted URL is dropped (paths add it)."""
        url = url.strip().rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteError(
                f"{url!r} is not a server address. Use a URL like http://127.0.0.1:8080."
            )
        url = url.removesuffix("/v1")
        return cls(url, api_key or None, timeout_s)


class RemoteHTTP:
    """JSON over HTTP to one endpoint; every failure becomes a RemoteError in words."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        parts = urlsplit(endpoint.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")

    @property
    def url(self) -> str:
        return self.endpoint.url

    def get(self, path: str, *, timeout_s: float | None = None) -> object:
        with self._open("GET", path, None, timeout_s) as (response, _):
            return self._json(response, path)

    def post(self, path: str, body: dict, *, timeout_s: float | None = None) -> object:
        with self._open("POST", path, body, timeout_s) as (response, _):
            return self._json(response, path)

    def stream(self, path: str, body: dict, *, cancel: CancelToken | None = None) -> Iterator[dict]:
        """POST and yield each server-sent event's JSON data until `[DONE]` or the end.
        Raises RemoteCancelled when `cancel` is set mid-stream."""
        done = threading.Event()
        with self._open("POST", path, body, None) as (response, sock):
            if cancel is not None and sock is not None:
                threading.Thread(
                    target=_watch_cancel, args=(cancel, done, sock), daemon=True
                ).start()
            try:
                yield from self._events(response, path, cancel)
            except (OSError, http.client.HTTPException) as exc:
                if cancel is not None and cancel.cancelled:
                    raise RemoteCancelled() from exc
                raise self._lost(exc) from exc
            finally:
                done.set()

    # -- internals --

    @contextlib.contextmanager
    def _open(
        self, method: str, path: str, body: dict | None, timeout_s: float | None
    ) -> Iterator[tuple[http.client.HTTPResponse, socket.socket | None]]:
        conn = self._connection(timeout_s)
        headers = {"Accept": "application/json, text/event-stream"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.endpoint.api_key:
            headers["Authorization"] = f"Bearer {self.endpoint.api_key}"
        try:
            try:
                conn.request(method, self._prefix + path, body=data, headers=headers)
                sock = conn.sock  # kept: a closing response drops the connection's reference
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise self._lost(exc) from exc
            if response.status >= 400:
                raise self._refused(response, path)
            yield response, sock
        finally:
            conn.close()

    def _connection(self, timeout_s: float | None) -> http.client.HTTPConnection:
        timeout = timeout_s or self.endpoint.timeout_s
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _json(self, response: http.client.HTTPResponse, path: str) -> object:
        try:
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise self._lost(exc) from exc
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise RemoteError(
                f"The server at {self.url} answered {path} with something that is not JSON: "
                f"{raw[:80]!r}. Is the URL an OpenAI-compatible server?"
            ) from exc

    def _events(
        self, response: http.client.HTTPResponse, path: str, cancel: CancelToken | None
    ) -> Iterator[dict]:
        data: list[str] = []
        while True:
            line = response.readline()
            if cancel is not None and cancel.cancelled:
                raise RemoteCancelled()
            if not line:
                return  # the server closed the stream
            text = line.decode("utf-8", "replace").rstrip("\r\n")
            if text.startswith("data:"):
                data.append(text[5:].removeprefix(" "))
                continue
            if text or not data:
                continue  # comments (": ping"), event names, or blank keep-alives
            payload, data = "\n".join(data), []
            if payload.strip() == "[DONE]":
                return
            try:
                event = json.loads(payload)
            except ValueError as exc:
                raise RemoteError(
                    f"The server at {self.url} streamed something that is not JSON on "
                    f"{path}: {payload[:80]!r}."
                ) from exc
            if isinstance(event, dict) and "error" in event:
                error = event["error"]
                code = error.get("code") if isinstance(error, dict) else None
                raise self._describe(code if isinstance(code, int) else 500, event, path)
            yield event

    def _lost(self, exc: BaseException) -> RemoteError:
        if isinstance(exc, TimeoutError | socket.timeout):
            return RemoteError(
                f"The server at {self.url} did not answer within "
                f"{self.endpoint.timeout_s:g} s. It may be overloaded; try again, or raise "
                "the remote timeout in settings."
            )
        if isinstance(exc, ConnectionRefusedError):
            return RemoteError(
                f"Could not connect to {self.url}: nothing is listening there. "
                "Is the server running, and is the port right?"
            )
        if isinstance(exc, socket.gaierror):
            return RemoteError(f"Could not find the host of {self.url}: {exc.strerror}.")
        if isinstance(exc, ssl.SSLError):
            return RemoteError(f"The secure connection to {self.url} failed: {exc.reason}.")
        return RemoteError(f"The connection to {self.url} was lost: {exc or type(exc).__name__}.")

    def _refused(self, response: http.client.HTTPResponse, path: str) -> EngineError:
        try:
            body = json.loads(response.read() or b"null")
        except (ValueError, OSError, http.client.HTTPException):
            body = None
        return self._describe(response.status, body, path, response.reason)

    def _describe(self, status: int, body: object, path: str, reason: str = "") -> EngineError:
        """An error answer (a status, or an error event mid-stream) as words."""
        detail = _error_text(body) or reason
        if status in (401, 403):
            return RemoteError(
                f"The server at {self.url} refused the API key ({status}: {detail}). "
                "Set the right key in Settings > Remote, or STOKE_REMOTE_API_KEY.",
                status,
            )
        if status == 404 and "model" in detail.lower():
            return RemoteError(
                f"The server at {self.url} does not serve that model ({detail}). "
                "Pick one it lists in Settings > Remote.",
                status,
            )
        if status == 404:
            return RemoteError(
                f"The server at {self.url} has no {path} ({detail}). Check the URL, or "
                "choose another remote mode.",
                status,
            )
        overflow = _context_overflow(body, detail)
        if overflow is not None:
            return overflow
        return RemoteError(f"The server at {self.url} refused {path} ({status}: {detail}).", status)


def _error_text(body: object) -> str:
    """The human part of the error shapes servers use: OpenAI's {"error": {"message"}},
    FastAPI's {"detail"}, plain strings."""
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body.get("message")))
        if isinstance(error, dict):
            return str(error.get("message") or error)
        if isinstance(error, list):  # FastAPI validation errors
            return "; ".join(str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in error)
        if error is not None:
            return str(error)
    return "" if body is None else str(body)[:200]


def _context_overflow(body: object, detail: str) -> ContextOverflowError | None:
    """Servers word a prompt over the context differently; keep their numbers when found:
    llama-server sends n_prompt_tokens and n_ctx, others put both numbers in the message."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "n_ctx" in error and "n_prompt_tokens" in error:
        return ContextOverflowError(int(error["n_prompt_tokens"]), int(error["n_ctx"]))
    lowered = detail.lower()
    if "context" not in lowered or not any(w in lowered for w in ("exceed", "longer", "maximum")):
        return None
    numbers = [int(n) for n in re.findall(r"\d+", detail)[:2]]
    if len(numbers) == 2 and numbers[0] != numbers[1]:
        return ContextOverflowError(max(numbers), min(numbers))
    return ContextOverflowError(0, 0, f"The prompt does not fit the server's context: {detail}")


def _watch_cancel(cancel: CancelToken, done: threading.Event, sock: socket.socket) -> None:
    """Shut the socket down once `cancel` is set, so a blocked read returns at once."""
    while not done.wait(_CANCEL_POLL_S):
        if cancel.cancelled:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            return
