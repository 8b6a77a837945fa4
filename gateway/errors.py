"""Errors in the shape of the API a client speaks, so its client library shows the
gateway's message instead of a parse failure: OpenAI's (`{"error": {"message",
"type", "param", "code"}}`) on OpenAI and llama-server routes, Anthropic's
(`{"type": "error", "error": {"type", "message"}}`) on the Messages routes."""

from __future__ import annotations

import json
from enum import StrEnum

from fastapi.responses import JSONResponse

from gateway.transport.exchange import Headers

JSON_CONTENT_TYPE = ("content-type", "application/json")
# what the server front refuses before a request reaches a route
SERVER_REFUSAL_CODES = {
    400: "bad_request",
    408: "request_timeout",
    413: "body_too_large",
    429: "too_many_requests",  # a client's requests in progress, or bodies arriving
    500: "internal_error",
    501: "not_implemented",
}


ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class ErrorShape(StrEnum):
    """Whose error shape a route answers in."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        retry_after_s: int | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.retry_after_s = retry_after_s
        self.headers = headers  # more headers (lower-case names), e.g. WWW-Authenticate

    def shape(self, style: ErrorShape = ErrorShape.OPENAI) -> dict[str, object]:
        if style is ErrorShape.ANTHROPIC:
            kind = ANTHROPIC_ERROR_TYPES.get(
                self.status, "api_error" if self.status >= 500 else "invalid_request_error"
            )
            return {"type": "error", "error": {"type": kind, "message": self.message}}
        return {
            "error": {"message": self.message, "type": self.type, "param": None, "code": self.code}
        }

    def encoded(self, style: ErrorShape = ErrorShape.OPENAI) -> tuple[Headers, bytes]:
        """Headers and body for the lean path's `Reply`, in `style`."""
        headers = [JSON_CONTENT_TYPE, *self.headers]
        if self.retry_after_s is not None:
            headers.append(("retry-after", str(self.retry_after_s)))
        return headers, json.dumps(self.shape(style)).encode()

    def event(self, style: ErrorShape = ErrorShape.OPENAI) -> bytes:
        """The error as the last event of a server-sent event stream, in `style`
        (Anthropic streams name their events)."""
        data = b"data: " + json.dumps(self.shape(style)).encode() + b"\n\n"
        return b"event: error\n" + data if style is ErrorShape.ANTHROPIC else data

    def response(self) -> JSONResponse:
        headers = dict(self.headers)
        if self.retry_after_s is not None:
            headers["retry-after"] = str(self.retry_after_s)
        return JSONResponse(self.shape(), status_code=self.status, headers=headers)


def server_refusal(status: int, message: str) -> tuple[Headers, bytes]:
    """The server front's own refusals (too large, too slow, failed) in the same shape."""
    kind = "api_error" if status >= 500 else "invalid_request_error"
    if status == 429:
        kind = "rate_limit_error"
    return GatewayError(status, message, type=kind, code=SERVER_REFUSAL_CODES.get(status)).encoded()
