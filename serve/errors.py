"""The API's errors: OpenAI's error JSON, with its status and, for 429 and 503, when to retry."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi.responses import JSONResponse

from serve import protocol as api

RETRY_AFTER_S = 1
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """A request refused or failed: OpenAI's error JSON with this status (`code`: the status, or OpenAI's
    name of the error). `close`: the connection closes after the answer (a body left unread)."""

    def __init__(
        self, status: int, message: str, param: str | None = None, *, code: str | None = None,
        close: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.close = status, message, param, code, close

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        body = api.ErrorResponse(
            error=api.ErrorBody(message=self.message, type=ERROR_TYPES.get(self.status, "APIError"),
                                param=self.param, code=self.code or self.status)
        )  # fmt: skip
        headers = dict(headers or {})
        if self.status in (429, 503):
            headers["Retry-After"] = str(RETRY_AFTER_S)
        if self.close:
            headers["Connection"] = "close"
        return JSONResponse(body.model_dump(), status_code=self.status, headers=headers or None)
