"""One client connection to the gateway's server: requests in, answers out, in order.

Parsing is httptools'. A request is read whole (bodies are bounded) and then handed
to the server's handler as one task; the client leaving cancels that task. The rules
a public HTTP/1.1 front needs are kept here:

- limits: the head is bounded by the bytes that arrive before it ends (a single
  endless header cannot grow), the body by its declared or received size (431/413);
  an HTTP/1.1 request without Host, a malformed request or target is a 400;
- a refusal is written after the answers owed before it, then the connection
  lingers, reading and dropping what the client still sends (an upload in progress
  gets to read its 413) until it has been quiet for a moment, and then closes;
- pipelined requests are answered in order; reading pauses while one waits behind
  another, and while the client is not reading its answers, so neither queued
  requests nor answers pile up in memory;
- `Expect: 100-continue` is answered only when no other answer is being written;
- an Upgrade (h2c, websocket) is not supported and is ignored, so the request is
  answered in HTTP/1.1, as RFC 9110 allows;
- a client that half-closes is treated as gone (as uvicorn does), which is also how
  a client that gives up on a long non-streamed request is noticed at once.

Deadlines (idle keep-alive, a request's arrival, a lingering or closing connection)
are enforced by the server's once-a-second sweep, so no timer is set per request."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, cast
from urllib.parse import unquote

import httptools

from gateway.responder import Headers, Request, Responder

if TYPE_CHECKING:
    from gateway.server import GatewayServer

log = logging.getLogger("kama.gateway")

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 8 * 1024 * 1024
KEEPALIVE_IDLE_S = 60.0  # a client connection with nothing in flight
REQUEST_ARRIVAL_S = 30.0  # from a request's first byte to its last (slow senders)
LINGER_QUIET_S = 2.0  # a refused connection closes once the client is quiet this long
LINGER_MAX_S = 30.0  # ... or after this long in any case
CLOSE_FLUSH_S = 10.0  # a closing connection whose client reads nothing is then aborted
SLICE_BYTES = 4096  # parsed at a time, so requests queued from one read stay few
PIPELINED_SLICE_BYTES = 512  # ... and fewer while one is already being answered
DRAIN_TIMEOUT_S = 600.0  # a client that reads nothing of an answer for this long is dropped


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Refused(Exception):
    """A request the server answers itself (and closes the connection after)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClientConnection(asyncio.Protocol):
    def __init__(self, *, server: GatewayServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.must_close = False  # answer what is owed, then close
        self.writing_paused = False
        self.arriving_since: float | None = None  # a request is partly read
        self.idle_since = server.clock
        self.last_data = server.clock
        self.lingering_since: float | None = None
        self.closing_since: float | None = None
        self._drain: asyncio.Future[None] | None = None
        self._pending: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._responder: Responder | None = None
        self._owed_refusal: tuple[int, str] | None = None
        self._parsing = True  # false once a request was refused: the rest is dropped
        self._reading_paused = False
        self._head_open = True  # between requests or inside a head
        self._head_wire = 0  # bytes received since the last request ended
        self._continue_owed = False
        self._unparsed = b""
        self._reset_request()

    def _reset_request(self) -> None:
        self._url = b""
        self._head_bytes = 0
        self._headers: Headers = []
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._path = b"/"
        self._query = b""

    @property
    def busy(self) -> bool:
        return self._task is not None or bool(self._pending)

    # asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.last_data = self.server.clock
        if self._parsing:
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Parse in slices and stop once a request waits behind the one being
        answered: the rest stays unparsed and reading pauses, so a client that
        pipelines thousands of requests in one write has a few queued at a time."""
        start = 0
        while start < len(data) and self._parsing:
            if self._task is not None and self._pending:
                self._unparsed = data[start:]
                self._pause_reading()
                return
            piece = data[start : start + (PIPELINED_SLICE_BYTES if self.busy else SLICE_BYTES)]
            start += len(piece)
            if self._head_open:
                self._head_wire += len(piece)
            try:
                self.parser.feed_data(piece)
            except httptools.HttpParserCallbackError as exc:
                cause = exc.__context__
                if isinstance(cause, Refused):
                    self.refuse(cause.status, cause.message)
                else:
                    log.error("reading a request failed", exc_info=cause)
                    self.refuse(500, "the gateway failed to read the request")
                return
            except httptools.HttpParserUpgrade as exc:
                offset = exc.args[0] if exc.args else len(piece)
                self._ignore_upgrade()
                start -= len(piece) - offset
                continue
            except httptools.HttpParserError as exc:
                self.refuse(400, f"malformed HTTP request: {exc}")
                return
            if self._head_open and self._head_wire > MAX_HEAD_BYTES:
                self.refuse(431, f"request head is larger than {MAX_HEAD_BYTES} bytes")
                return

    def _ignore_upgrade(self) -> None:
        """The request asked to switch protocols and is already queued: it is
        answered in HTTP/1.1 and what follows is parsed as HTTP/1.1 again (a
        CONNECT's tunnel data cannot be, so that connection closes after its answer)."""
        if self.parser.get_method() == b"CONNECT":
            self.must_close = True
            self._parsing = False
        else:
            self.parser = httptools.HttpRequestParser(self)

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
        if self._task is None:
            self._start_next()

    # httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reset_request()
        self.arriving_since = self.server.clock

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))
        self._head_bytes += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        self._head_open = False
        if self._head_bytes > MAX_HEAD_BYTES:  # the wire count only sees a head that goes on
            raise Refused(431, f"request head is larger than {MAX_HEAD_BYTES} bytes")
        try:
            parsed = httptools.parse_url(self._url)
        except httptools.HttpParserInvalidURLError:
            raise Refused(400, "malformed request target") from None
        self._path = parsed.path or b"/"  # an absolute-form target may have none
        self._query = parsed.query or b""
        version = self.parser.get_http_version()
        fields = dict(self._headers)
        if version == "1.1" and b"host" not in fields:
            raise Refused(400, "an HTTP/1.1 request needs a Host header")
        declared = fields.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise Refused(413, f"request body is larger than {MAX_BODY_BYTES} bytes")
        if version == "1.1" and fields.get(b"expect", b"").lower() == b"100-continue":
            if self.busy:  # an answer is being written: the interim one waits for it
                self._continue_owed = True
            else:
                self.write(CONTINUE)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY_BYTES:
            raise Refused(413, f"request body is larger than {MAX_BODY_BYTES} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        path = self._path.decode("latin-1")
        version = self.parser.get_http_version()
        self._pending.append(
            Request(
                method=self.parser.get_method().decode("ascii"),
                path=unquote(path) if "%" in path else path,
                raw_path=self._path,
                query=self._query,
                headers=self._headers,
                body=b"".join(self._body),
                http_version=version,
                keep_alive=version == "1.1" and self.parser.should_keep_alive(),
            )
        )
        self.arriving_since = None
        self._continue_owed = False
        self._head_open, self._head_wire = True, 0
        self._reset_request()
        if self._task is None:
            self._start_next()
        else:
            self._pause_reading()  # pipelined: nothing more until its turn

    # requests and answers -----------------------------------------------------------------

    def _start_next(self) -> None:
        if self.closed or self.writing_paused:
            return  # resume_writing comes back here
        if not self._pending:
            if self._owed_refusal is not None:
                self._send_refusal(*self._owed_refusal)
                return
            self._resume_reading()
            self.idle_since = self.server.clock
            if self.arriving_since is not None:  # its deadline starts now, not while we wrote
                self.arriving_since = self.server.clock
            if self._continue_owed:
                self._continue_owed = False
                self.write(CONTINUE)
            return
        request = self._pending.popleft()
        self._responder = Responder(
            connection=self,
            keep_alive=request.keep_alive and not self.must_close,
            head_only=request.method == "HEAD",
            can_chunk=request.http_version == "1.1",
        )
        self._task = asyncio.get_running_loop().create_task(
            self.server.handle(request, self._responder)
        )
        self._task.add_done_callback(self._answered)
        if not self._pending:
            if self._unparsed:  # what was held back while this request waited
                data, self._unparsed = self._unparsed, b""
                self._feed(data)
            if not self._unparsed:
                self._resume_reading()  # so a client that leaves is noticed meanwhile

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
                self.abort()
            else:
                self._send_refusal(500, "the gateway failed to answer")
            return
        if not responder.keep_alive:
            self._pending.clear()
            self.close()
            return
        self._start_next()

    def write(self, data: bytes) -> None:
        transport = self.transport
        if not self.closed and transport is not None and not transport.is_closing():
            transport.write(data)

    async def drained(self) -> None:
        if not self.writing_paused or self.closed:
            return
        self._drain = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT_S):
                await self._drain
        except TimeoutError:
            self.abort()
            raise ConnectionResetError("the client stopped reading") from None
        finally:
            self._drain = None
        if self.closed:
            raise ConnectionResetError("the client disconnected")

    def _wake_drain(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    # refusing and closing ------------------------------------------------------------------

    def refuse(self, status: int, message: str) -> None:
        """Answer `status` once the answers owed before it are written, then linger
        and close. Nothing more is parsed on this connection."""
        if self.closed or self.lingering_since is not None or self._owed_refusal is not None:
            return
        self._parsing = False
        if self.busy:
            self._owed_refusal = (status, message)
        else:
            self._send_refusal(status, message)

    def _send_refusal(self, status: int, message: str) -> None:
        self._owed_refusal = None
        self._parsing = False
        if self.closed or self.lingering_since is not None:
            return
        headers, body = self.server.refusal_body(status, message)
        Responder(connection=self, keep_alive=False, head_only=False, can_chunk=False).send_whole(
            status, headers, body
        )
        self.lingering_since = self.server.clock
        transport = self.transport
        if transport is not None:
            if transport.can_write_eof():
                transport.write_eof()  # the client sees the end of the answer now
            self._resume_reading()  # and what it still sends is read and dropped

    def close(self) -> None:
        """Close once written; the sweep aborts it if the client never reads."""
        if self.transport is not None and not self.transport.is_closing():
            self.closing_since = self.server.clock
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def check_deadlines(self, now: float) -> None:
        """The server's sweep: whatever this connection has waited too long for."""
        if self.closing_since is not None:
            if now - self.closing_since > CLOSE_FLUSH_S:
                self.abort()
        elif self.lingering_since is not None:
            if now - self.last_data > LINGER_QUIET_S or now - self.lingering_since > LINGER_MAX_S:
                self.close()
        elif self.busy:
            pass  # an answer is under way; what arrives meanwhile waits its turn
        elif self.arriving_since is not None:
            if now - self.arriving_since > REQUEST_ARRIVAL_S:
                self.refuse(408, f"the request did not arrive within {REQUEST_ARRIVAL_S:g}s")
        elif now - self.idle_since > KEEPALIVE_IDLE_S:
            self.close()
