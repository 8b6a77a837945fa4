"""Errors in the OpenAI shape (`{"error": {"message", "type", "param", "code"}}`), so
OpenAI clients show the gateway's message instead of a parse failure."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        headers = {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}
        body = {
            "error": {"message": self.message, "type": self.type, "param": None, "code": self.code}
        }
        return JSONResponse(body, status_code=self.status, headers=headers)
