"""The parts of RFC 9112 request framing that granian (hyper) leaves to the
application, and the reading of a chunked body under the front's limits.

granian already refuses, before the app sees anything: a request line that is not
HTTP/1.0 or HTTP/1.1 (`HTTP/2.0`, HTTP/0.9), two Content-Length fields, a
Transfer-Encoding whose last coding is not `chunked`, chunked framing in HTTP/1.0,
a head over the buffer limit (431), and more than 16 KiB of chunk extensions or of
trailer fields (hyper's own limits; RSGI never hands trailers to the app). What it
lets through, and this module refuses:

- a request with no Host (HTTP/1.1) or more than one Host field (RFC 9112 §3.2);
- a Transfer-Encoding other than exactly one `chunked`: codings before it (`gzip,
  chunked`) are not implemented here (501, RFC 9112 §6.1), and `chunked` twice or
  the field twice is malformed (400). granian would decode such a body as plain
  chunked and hand it on as if no other coding had been applied;
- trailer fields. granian delivers a trailer section and a body that failed midway
  (a bad chunk size, trailers over hyper's limit, a reset) the same way, as one
  empty piece before the end, so the two cannot be told apart and both are refused:
  a body that failed must never pass for a whole one, and nothing in the OpenAI API
  sends trailers;
- a body in pathologically small chunks. Every chunk is one await on the event loop
  (about 35 µs), so 8 MiB in 1-byte chunks would keep the loop busy for minutes; a
  chunked body may use `FREE_PIECES` pieces plus one per `MIN_PIECE_BYTES` it carries,
  which real clients (and TCP segments) stay well within. The body is gathered in
  one buffer, so it costs about its size in memory however it is cut."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

FREE_PIECES = 1024
MIN_PIECE_BYTES = 1024  # beyond FREE_PIECES, the least a piece carries on average

Refusal = tuple[int, str]


class HeadFields(Protocol):
    """A request head's fields as granian gives them: `keys` once per name, `values`
    and `items` once per field line, names lower-case."""

    def keys(self) -> list[str]: ...

    def values(self) -> list[str]: ...

    def items(self) -> list[tuple[str, str]]: ...

    def get(self, key: str, default: Any = None) -> Any: ...


class BodyRefused(Exception):
    """The body cannot be taken. `drain`: the client may still be sending it, so read
    and drop what follows (bounded) before the connection closes, or it may never
    read the answer."""

    def __init__(self, status: int, message: str, *, drain: bool) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.drain = drain


def head_refusal(*, http_version: str, fields: HeadFields) -> Refusal | None:
    """Why the request head must be refused (status, message), or None."""
    names = fields.keys()
    if len(fields.values()) != len(names):  # a name on several lines: count them all
        names = [name for name, _ in fields.items()]
    hosts = names.count("host")
    if hosts > 1:
        return 400, "the request has more than one Host field"
    if hosts == 0 and http_version == "1.1":
        return 400, "an HTTP/1.1 request needs a Host field"
    transfer_encoding: str | None = fields.get("transfer-encoding")
    if transfer_encoding is None:
        return None
    if names.count("transfer-encoding") > 1:
        return 400, "Transfer-Encoding must be one field whose only coding is chunked"
    codings = [coding.strip().lower() for coding in transfer_encoding.split(",")]
    if codings == ["chunked"]:
        return None
    if codings.count("chunked") != 1 or codings[-1] != "chunked":
        return 400, "Transfer-Encoding must apply chunked once, last"
    others = ", ".join(codings[:-1])
    return 501, f"transfer coding {others} is not implemented; send the body without it"


async def read_chunked(pieces: AsyncIterator[bytes], *, max_body: int) -> bytes:
    """A chunked body as granian hands it over (data pieces, then one empty piece at
    the end), or BodyRefused."""
    body = bytearray()
    count = 0
    ended = False
    async for piece in pieces:
        if ended:  # a second empty piece: a trailer section, or the body failed
            raise BodyRefused(
                400,
                "the chunked request body carried trailer fields, which the gateway "
                "does not accept, or its framing was malformed",
                drain=False,
            )
        if not piece:
            ended = True
            continue
        count += 1
        body += piece
        if len(body) > max_body:
            raise BodyRefused(413, f"request body is larger than {max_body} bytes", drain=True)
        if count > FREE_PIECES + len(body) // MIN_PIECE_BYTES:
            raise BodyRefused(
                400,
                f"the request body came in {count} chunks for {len(body)} bytes; send it "
                f"in chunks of at least {MIN_PIECE_BYTES} bytes or with a Content-Length",
                drain=True,
            )
    return bytes(body)
