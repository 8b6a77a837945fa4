"""One request as the gateway's server hands it over, and the writer of its answer.

The answer goes straight onto the client's socket: whole (one write, its length
declared), or a head followed by pieces, framed by the replica's content-length when
known and chunked otherwise (close-delimited for HTTP/1.0 clients, which cannot read
chunks). Statuses that never carry a body (1xx, 204, 304) get neither a length nor
a body, and a HEAD answer gets the length without the body."""

from __future__ import annotations

import http
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.connection import ClientConnection

Headers = list[tuple[bytes, bytes]]
REASONS = {s.value: s.phrase.encode("ascii") for s in http.HTTPStatus}
CLOSE_DELIMITED = b"connection: close"
FRAMING_HEADERS = frozenset({b"content-length", b"transfer-encoding"})


@dataclass
class Request:
    method: str
    path: str
    raw_path: bytes
    query: bytes
    headers: Headers  # names lower-cased, in arrival order
    body: bytes
    http_version: str
    keep_alive: bool


Handler = Callable[[Request, "Responder"], Coroutine[None, None, None]]


def without_framing(
    headers: Headers, *, dropped: frozenset[bytes] = FRAMING_HEADERS
) -> tuple[Headers, int | None]:
    """Headers to pass on (names lower-cased, `dropped` left out: the responder writes
    the framing itself) and the content-length they declared, if any."""
    kept: Headers = []
    length: int | None = None
    for name, value in headers:
        lower = name.lower()
        if lower == b"content-length" and value.isdigit():
            length = int(value)
        elif lower not in dropped:
            kept.append((lower, value))
    return kept, length


def bodiless(status: int) -> bool:
    return status < 200 or status in (204, 304)


class Responder:
    """Writes one request's answer onto its connection."""

    def __init__(
        self,
        *,
        connection: ClientConnection,
        keep_alive: bool,
        head_only: bool,
        can_chunk: bool,
    ) -> None:
        self._connection = connection
        self.keep_alive = keep_alive
        self._head_only = head_only
        self._can_chunk = can_chunk
        self.started = False
        self.complete = False
        self._chunked = False
        self._no_body = head_only

    @property
    def client_gone(self) -> bool:
        return self._connection.closed

    def _head(self, status: int, headers: Headers, framing: bytes | None) -> bytes:
        connection = self._connection
        if connection.server.stopping or connection.must_close:
            self.keep_alive = False
        lines = [b"HTTP/1.1 %d %s" % (status, REASONS.get(status, b"Unknown"))]
        lines += [name + b": " + value for name, value in headers]
        if framing is not None:
            lines.append(framing)
        lines.append(b"date: " + connection.server.date)
        if not self.keep_alive and framing != CLOSE_DELIMITED:
            lines.append(b"connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def send_whole(self, status: int, headers: Headers, body: bytes) -> None:
        assert not self.started, "the answer was already started"
        self.started = self.complete = True
        if bodiless(status):
            self._connection.write(self._head(status, headers, None))
            return
        head = self._head(status, headers, b"content-length: %d" % len(body))
        self._connection.write(head if self._head_only else head + body)

    def start(self, status: int, headers: Headers, *, content_length: int | None) -> None:
        assert not self.started, "the answer was already started"
        self.started = True
        framing: bytes | None
        if bodiless(status):
            self._no_body, framing = True, None
        elif content_length is not None:
            framing = b"content-length: %d" % content_length
        elif self._head_only:
            framing = None
        elif self._can_chunk:
            self._chunked, framing = True, b"transfer-encoding: chunked"
        else:  # an HTTP/1.0 client: the body ends with the connection
            self.keep_alive, framing = False, CLOSE_DELIMITED
        self._connection.write(self._head(status, headers, framing))

    async def write(self, chunk: bytes) -> None:
        if not chunk or self._no_body:
            return
        connection = self._connection
        if connection.closed:
            raise ConnectionResetError("the client disconnected")
        connection.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if self._chunked else chunk)
        if connection.writing_paused:
            await connection.drained()

    def end(self) -> None:
        if self._chunked:
            self._connection.write(b"0\r\n\r\n")
        self.complete = True
