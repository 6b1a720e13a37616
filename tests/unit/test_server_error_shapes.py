"""One error type, answered in the shape of the request's API: OpenAI's object on its
routes, Anthropic's `{"type": "error", "error": {...}}` on /v1/messages, with the type and
status Anthropic's SDKs map to their exception classes."""

from __future__ import annotations

import pytest

from app.server.anthropic import error_shape
from app.server.errors import ApiError


@pytest.mark.parametrize(
    ("status", "kind", "anthropic_status"),
    [
        (400, "invalid_request_error", 400),
        (401, "authentication_error", 401),
        (404, "not_found_error", 404),
        (405, "invalid_request_error", 405),
        (413, "request_too_large", 413),
        (429, "rate_limit_error", 429),
        (500, "api_error", 500),
        (503, "overloaded_error", 529),  # the engine is loading or restarting: wait, retry
    ],
)
def test_anthropic_shape(status: int, kind: str, anthropic_status: int) -> None:
    error = ApiError(status, "In words.", kind="server_error", code="x")
    assert error.body("anthropic") == {
        "type": "error",
        "error": {"type": kind, "message": "In words."},
    }
    assert error.http_status("anthropic") == anthropic_status
    assert error.http_status() == status
    assert error.body()["error"] == {
        "message": "In words.",
        "type": "server_error",
        "param": None,
        "code": "x",
    }


def test_which_routes_answer_in_anthropics_shape() -> None:
    for path in ("/v1/messages", "/messages", "/v1/messages/count_tokens", "/v1/messages/"):
        assert error_shape(path) == "anthropic"
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/models", "/v1/messagesx"):
        assert error_shape(path) == "openai"
