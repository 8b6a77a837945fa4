"""What an inference handler sees of one request, and how it answers: the boundary
between the server front and the app. Server-neutral on purpose, so the proxy can
be hosted by another server (the benchmark hosts it on several to compare them).

Headers going out are `(name, value)` strings, as granian takes them; framing
(content-length of a whole answer, chunking) is the server's, except that a streamed
answer may declare its length, and the server then keeps it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

Headers = list[tuple[str, str]]


class HeaderLookup(Protocol):
    def get(self, key: str, default: Any = None) -> Any: ...


@dataclass(slots=True)
class Request:
    method: str
    path: str  # percent-decoded, without the query
    headers: HeaderLookup  # names lower-case
    body: bytes
    # who the front's `HeadCheck` admitted the request as, before its body was read;
    # `head_checked` is False where the host has no head check (the benchmarks' hosts)
    principal: object = None
    head_checked: bool = False


@dataclass(frozen=True, slots=True)
class HeadVerdict:
    """What the app decides from a request's head alone, before a body byte is read or
    counted: who it is admitted as (`Request.principal`), or the answer refusing it."""

    principal: object = None
    refusal: tuple[int, Headers, bytes] | None = None  # status, headers, body
    # who is counted when it is refused (`refusal_pacing`): the key; None: the address
    requester: str | None = None
    # called once when the admitted request is over, however it ended (a concurrency
    # cap's place given back)
    release: Callable[[], None] | None = None


HeadCheck = Callable[[str, str, "HeaderLookup"], HeadVerdict]  # (method, path, headers)


class Reply(Protocol):
    """One request's answer: `send` it whole, or `start` it and `write` pieces.
    `status` is 0 until an answer started; `client_gone` says the client left (the
    handler is then cancelled, and writes raise `ConnectionResetError`)."""

    status: int
    client_gone: bool

    def send(self, status: int, headers: Headers, body: bytes) -> None: ...

    def start(self, status: int, headers: Headers) -> None: ...

    async def write(self, chunk: bytes) -> None: ...


Handler = Callable[[Request, Reply], Awaitable[None]]
LeanRoutes = Callable[[str, str], Handler | None]  # (method, path) -> handler, or None
Refusal = Callable[[int, str], tuple[Headers, bytes]]  # the body of the front's own refusals
