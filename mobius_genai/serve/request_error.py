"""The one error type of a refused request, shared by the body's checks and the engine."""

from __future__ import annotations


class RequestError(Exception):
    """A request the server refuses: its HTTP status and OpenAI's error fields."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.kind = kind
