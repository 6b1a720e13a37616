"""The HTTP side of the API server: connections (the connection limit's mark), request bodies
read and checked, and every error as OpenAI's JSON error object in words, none carrying
Python's exception text or echoing the request's bytes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from app.engine.host import EngineCrashedError
from app.engine.protocol import ContextOverflowError, EngineError
from app.engine.remote_http import RemoteError
from app.server.schema import ApiError, check_json

FAILED = "The server failed on this request; its log says why."
REQUEST_REFUSALS = frozenset({400, 404, 413, 422})  # a remote engine's "this request is wrong"


class Gate:
    """The connections open now, each counted from the moment it is accepted: aiohttp's own
    list learns of a connection a loop turn later, so a burst of connections accepted
    together would all find it short and all be let in."""

    def __init__(self) -> None:
        self.open = 0


class Connection(web.RequestHandler):
    """One client connection, counted at `gate` while it lives. `admitted` is False when it
    opened beyond the connection limit. Errors aiohttp answers itself (HTTP that does not
    parse) come in OpenAI's JSON shape, in words, without echoing the offending bytes."""

    def __init__(self, manager: web.Server, *, gate: Gate, limit: int, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.admitted = gate.open < limit
        self._gate = gate
        gate.open += 1
        self._counted = True

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        if self._counted:
            self._counted = False
            self._gate.open -= 1

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs it; raises if too late
        if status >= 500:
            error = ApiError(status, FAILED, kind="server_error")
        else:
            error = ApiError(
                status,
                "The request is not valid HTTP/1.1: check the request line, the header names "
                "and values, and Content-Length.",
                code="bad_http_request",
            )
        response = web.json_response(error.body(), status=status)
        response.force_close()
        return response


async def write_event(response: web.StreamResponse, body: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(body)}\n\n".encode())


def too_large(size: int | None, limit: int) -> ApiError:
    actual = f" ({size:,} bytes)" if size is not None else ""
    return ApiError(
        413,
        f"The request body is too large{actual}: this server takes up to {limit:,} bytes.",
        code="request_too_large",
    )


def http_error(exc: web.HTTPException) -> ApiError:
    if exc.status == 413:
        return ApiError(413, exc.text or "The request body is too large.", code="request_too_large")
    if exc.status == 404:
        return ApiError(
            404,
            "No such endpoint; this server has /v1/models, /v1/chat/completions, "
            "/v1/completions, /v1/messages, /v1/responses and /health.",
            code="not_found",
        )
    if exc.status == 405:
        return ApiError(405, f"{exc.reason}: check the HTTP method.", code="method_not_allowed")
    return ApiError(exc.status, exc.reason)


def engine_error(exc: EngineError) -> ApiError:
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, EngineCrashedError):
        return ApiError(503, str(exc), kind="server_error", code="engine_restarting")
    if isinstance(exc, RemoteError) and exc.status in REQUEST_REFUSALS:
        return ApiError(400, str(exc), code="remote_refused")  # resending would not help
    return ApiError(503, str(exc), kind="server_error", code="engine_error")


async def read_body(request: web.Request, limit: int, timeout: float) -> dict[str, Any]:
    """The JSON object the request carries, read within `timeout` seconds and checked for
    what json.loads lets through (check_json); every failure in words."""
    if request.content_length is not None and request.content_length > limit:
        raise too_large(request.content_length, limit)
    try:
        raw = await asyncio.wait_for(request.read(), timeout)
    except web.HTTPRequestEntityTooLarge as exc:
        raise too_large(None, limit) from exc
    except TimeoutError as exc:
        raise ApiError(
            408,
            f"The request body did not arrive within {timeout:g} s; send it at once.",
            code="request_timeout",
            close=True,
        ) from exc
    try:
        body = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise ApiError(400, "The request body is not UTF-8 text.") from exc
    except json.JSONDecodeError as exc:
        raise ApiError(
            400,
            f"The request body is not valid JSON ({exc.msg.lower()} at line {exc.lineno}, "
            f"column {exc.colno}).",
        ) from exc
    except RecursionError as exc:
        raise ApiError(400, "The request body is nested too deeply.") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    check_json(body)
    return body
