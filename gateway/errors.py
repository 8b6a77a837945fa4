"""Errors in the OpenAI shape (`{"error": {"message", "type", "param", "code"}}`), so
OpenAI clients show the gateway's message instead of a parse failure."""

from __future__ import annotations

import json

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

    def shape(self) -> dict[str, object]:
        return {
            "error": {"message": self.message, "type": self.type, "param": None, "code": self.code}
        }

    def encoded(self) -> tuple[Headers, bytes]:
        """Headers and body for the lean path's `Reply`."""
        headers = [JSON_CONTENT_TYPE, *self.headers]
        if self.retry_after_s is not None:
            headers.append(("retry-after", str(self.retry_after_s)))
        return headers, json.dumps(self.shape()).encode()

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
