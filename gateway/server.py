"""The gateway's HTTP/1.1 server: what accepts client connections and answers them.

Every proxied request pays for the server in front of it. Under uvicorn, the ASGI
machinery (a task, an event, message dicts and header checks per request, and a
second task to notice the client leaving) cost more CPU than the proxying itself,
so the gateway could not keep up with one fast replica on a core of its own. This
server parses with httptools (as uvicorn does), reads each request whole (bodies
are bounded), runs one task per request, writes answers straight onto the
socket, and cancels a request's task the moment its client disconnects. Inference
requests go to the proxy through `Handler`; everything else (model list, health,
metrics, and the refusals of llama-server's admin routes) to the FastAPI app
through `gateway.asgi_bridge`.

What a production front needs is here: keep-alive with an idle timeout, a deadline
for a request's head and body to arrive (slow senders), limits on head and body
size (431/413, the connection then closed after a short linger so the client reads
the answer), pipelined requests answered in order, back-pressure from slow
readers, `Expect: 100-continue`, and a graceful stop that lets requests in flight
finish."""

from __future__ import annotations

import asyncio
import email.utils
import http
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import cast
from urllib.parse import unquote

import httptools

log = logging.getLogger("kama.gateway")

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 8 * 1024 * 1024
KEEPALIVE_IDLE_S = 60.0  # a client connection with nothing in flight
REQUEST_ARRIVAL_S = 30.0  # from a request's first byte to its last (slow senders)
LINGER_S = 2.0  # after refusing a request: let the client read the answer, then close
DRAIN_TIMEOUT_S = 600.0  # a client that stops reading an answer for this long is dropped
SWEEP_INTERVAL_S = 1.0
MAX_PIPELINED = 16  # requests read ahead of their answers before reading pauses

Headers = list[tuple[bytes, bytes]]
REASONS = {s.value: s.phrase.encode("ascii") for s in http.HTTPStatus}


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


class Refused(Exception):
    """A request the server itself answers (and closes the connection after)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


Handler = Callable[[Request, "Responder"], Coroutine[None, None, None]]
RefusalBody = Callable[[int, str], tuple[Headers, bytes]]


def plain_refusal(status: int, message: str) -> tuple[Headers, bytes]:
    return [(b"content-type", b"text/plain; charset=utf-8")], message.encode()


class Responder:
    """Writes one request's answer onto its connection: whole, or as a head then
    pieces (with the replica's content-length when known, chunked otherwise)."""

    def __init__(
        self,
        *,
        connection: ClientConnection,
        keep_alive: bool,
        head_only: bool,
        can_chunk: bool = True,
    ) -> None:
        self._connection = connection
        self.keep_alive = keep_alive
        self._head_only = head_only
        self._can_chunk = can_chunk  # HTTP/1.0 clients: an unknown length ends with the close
        self.started = False
        self.complete = False
        self._chunked = False

    @property
    def client_gone(self) -> bool:
        return self._connection.closed

    def _head(self, status: int, headers: Headers, framing: bytes) -> bytes:
        lines = [b"HTTP/1.1 %d %s" % (status, REASONS.get(status, b"Unknown"))]
        lines += [name + b": " + value for name, value in headers]
        lines.append(framing)
        lines.append(b"date: " + self._connection.server.date)
        if self._connection.server.stopping:
            self.keep_alive = False
        if not self.keep_alive and framing != b"connection: close":
            lines.append(b"connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def send_whole(self, status: int, headers: Headers, body: bytes) -> None:
        assert not self.started, "the answer was already started"
        self.started = self.complete = True
        head = self._head(status, headers, b"content-length: %d" % len(body))
        self._connection.write(head if self._head_only else head + body)

    def start(self, status: int, headers: Headers, *, content_length: int | None) -> None:
        assert not self.started, "the answer was already started"
        self.started = True
        if content_length is None and not self._can_chunk:
            self.keep_alive = False
            framing = b"connection: close"
        elif content_length is None:
            self._chunked = not self._head_only
            framing = b"transfer-encoding: chunked"
        else:
            framing = b"content-length: %d" % content_length
        self._connection.write(self._head(status, headers, framing))

    async def write(self, chunk: bytes) -> None:
        if not chunk or self._head_only:
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


class ClientConnection(asyncio.Protocol):
    """One client's connection: requests in, answers out, in order."""

    def __init__(self, *, server: GatewayServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.writing_paused = False
        self.arriving_since: float | None = None  # a request is partly read
        self.idle_since = server.clock
        self._drain: asyncio.Future[None] | None = None
        self._pending: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._responder: Responder | None = None
        self._lingering = False
        self._reading_paused = False
        self._reset_request()

    def _reset_request(self) -> None:
        self._url = b""
        self._headers: Headers = []
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0

    # asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the rest of a refused request: read and dropped until the close
        if self.arriving_since is None:
            self.arriving_since = self.server.clock
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__
            if isinstance(refused, Refused):
                self.refuse(refused.status, refused.message)
            else:
                raise
        except httptools.HttpParserUpgrade:
            self.refuse(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self.refuse(400, f"malformed HTTP request: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self._wake_drain()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client left: its request stops with it

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake_drain()

    # httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reset_request()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))
        self._count_head(len(name) + len(value))

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise Refused(431, f"request head is larger than {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        declared = dict(self._headers).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise Refused(413, f"request body is larger than {MAX_BODY_BYTES} bytes")
        for name, value in self._headers:
            if name == b"expect" and value.lower() == b"100-continue":
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY_BYTES:
            raise Refused(413, f"request body is larger than {MAX_BODY_BYTES} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        parsed = httptools.parse_url(self._url)
        path = parsed.path.decode("latin-1")
        if "%" in path:
            path = unquote(path)
        version = self.parser.get_http_version()
        self._pending.append(
            Request(
                method=self.parser.get_method().decode("ascii"),
                path=path,
                raw_path=parsed.path,
                query=parsed.query or b"",
                headers=self._headers,
                body=b"".join(self._body),
                http_version=version,
                keep_alive=version != "1.0" and self.parser.should_keep_alive(),
            )
        )
        self.arriving_since = None
        self._reset_request()
        if len(self._pending) >= MAX_PIPELINED and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()
        if self._task is None:
            self._start_next()

    # requests and answers -----------------------------------------------------------------

    def _start_next(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        if not self._pending or self.closed:
            self.idle_since = self.server.clock
            return
        request = self._pending.popleft()
        keep_alive = request.keep_alive and not self.server.stopping
        self._responder = Responder(
            connection=self,
            keep_alive=keep_alive,
            head_only=request.method == "HEAD",
            can_chunk=request.http_version != "1.0",
        )
        self._task = asyncio.get_running_loop().create_task(
            self.server.handle(request, self._responder)
        )
        self._task.add_done_callback(self._answered)

    def _answered(self, task: asyncio.Task[None]) -> None:
        responder = self._responder
        self._task = self._responder = None
        assert responder is not None
        failure = None if task.cancelled() else task.exception()
        if isinstance(failure, ConnectionError):
            log.warning("an answer was cut short: %s", failure)
        elif failure is not None:
            log.error("answering a request failed", exc_info=failure)
        if self.closed:
            return
        if not responder.complete:
            if responder.started:  # a truncated answer must not look whole
                self.close()
                return
            self.refuse(500, "the gateway failed to answer")
            return
        if not responder.keep_alive:
            self.close()
            return
        self._start_next()

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    async def drained(self) -> None:
        if not self.writing_paused or self.closed:
            return
        self._drain = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT_S):
                await self._drain
        except TimeoutError:
            self.close()
            raise ConnectionResetError("the client stopped reading") from None
        finally:
            self._drain = None
        if self.closed:
            raise ConnectionResetError("the client disconnected")

    def _wake_drain(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def refuse(self, status: int, message: str) -> None:
        """Answer `status` and close once the client had time to read it."""
        if self.closed or self._lingering:
            return
        if self._task is not None:  # an answer is under way: no clean way to add this one
            self._task.cancel()
            self.close()
            return
        headers, body = self.server.refusal_body(status, message)
        responder = Responder(connection=self, keep_alive=False, head_only=False)
        responder.send_whole(status, headers, body)
        self._lingering = True
        self._pending.clear()
        if self.transport is not None:
            if self.transport.can_write_eof():
                self.transport.write_eof()  # the client sees the end of the answer now
            self.transport.resume_reading()  # and its unread rest is dropped meanwhile
        asyncio.get_running_loop().call_later(LINGER_S, self.close)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    @property
    def busy(self) -> bool:
        return self._task is not None or bool(self._pending)


class GatewayServer:
    """Listens, keeps the clock and date header, sweeps idle and slow connections,
    and stops gracefully."""

    def __init__(self, *, handle: Handler, refusal_body: RefusalBody = plain_refusal) -> None:
        self.handle = handle
        self.refusal_body = refusal_body
        self.connections: set[ClientConnection] = set()
        self.clock = time.monotonic()
        self.date = email.utils.formatdate(usegmt=True).encode("ascii")
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, *, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientConnection(server=self), host, port, backlog=2048
        )
        self._sweep()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def _sweep(self) -> None:
        self.clock = now = time.monotonic()
        self.date = email.utils.formatdate(usegmt=True).encode("ascii")
        for connection in list(self.connections):
            arriving = connection.arriving_since
            if arriving is not None and now - arriving > REQUEST_ARRIVAL_S:
                connection.refuse(408, f"the request did not arrive within {REQUEST_ARRIVAL_S:g}s")
            elif not connection.busy and now - connection.idle_since > KEEPALIVE_IDLE_S:
                connection.close()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_INTERVAL_S, self._sweep)

    async def stop(self, *, grace_s: float) -> None:
        """Stop accepting, close idle connections, let requests in flight finish
        (up to `grace_s`), then close the rest."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace_s
        while True:
            for connection in list(self.connections):
                if not connection.busy:
                    connection.close()
            if not self.connections or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            await self._server.wait_closed()
