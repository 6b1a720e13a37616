"""The server's one error type: an HTTP status and a message in words, answered in the shape
of the API the request was for: OpenAI's error object, or Anthropic's on its routes.

Anthropic's type follows the status as Anthropic's API uses them (its SDKs pick their
exception class by the status): 400 invalid_request_error, 401 authentication_error, 403
permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error, other
5xx api_error; an engine that is loading or restarting (503 here) is Anthropic's 529
overloaded_error, which its clients wait out and retry.
"""

from __future__ import annotations

from typing import Any, Literal

Shape = Literal["openai", "anthropic"]
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class ApiError(Exception):
    """An answer other than success: the HTTP status and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.retry_after = retry_after  # seconds, sent as Retry-After
        self.close = close  # end the connection after answering (its request is unreadable)

    def http_status(self, shape: Shape = "openai") -> int:
        return 529 if shape == "anthropic" and self.status == 503 else self.status

    def body(self, shape: Shape = "openai") -> dict[str, Any]:
        """The error object, in the shape of the request's API."""
        if shape == "anthropic":
            status = self.http_status(shape)
            kind = _ANTHROPIC_TYPES.get(
                status, "api_error" if status >= 500 else "invalid_request_error"
            )
            return {"type": "error", "error": {"type": kind, "message": self.message}}
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(param: str, message: str) -> ApiError:
    """A 400 naming the field that is wrong."""
    return ApiError(400, message, param=param)
