"""The server's one error type: an HTTP status and OpenAI's error object, in words."""

from __future__ import annotations

from typing import Any


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

    def body(self) -> dict[str, Any]:
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
