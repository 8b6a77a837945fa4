"""The public port's application under granian's RSGI interface.

granian parses HTTP/1.1, keeps connections, answers malformed requests and
oversized heads, and writes the framing; RSGI is its native interface, and the
cheapest one per request (the benchmark in tests/bench/bench_gateway.py compares it
with granian's ASGI and uvicorn). On top of it this front adds what a server cannot
know about this app:

- the lean path: a request the app's `LeanRoutes` claims (inference) goes straight
  to its handler; everything else goes to the FastAPI app (`gateway.transport.asgi`);
- what RFC 9112 asks of a server and granian leaves to the app (`framing`): Host
  present once, Transfer-Encoding exactly `chunked`, no trailers, a chunked body in
  chunks of a sane size; refused with `connection: close`, as the framing of what
  follows on that connection is in doubt;
- the body limit (413, from the declared length before anything is read, or as the
  body arrives; the rest of an upload is then read and dropped, within bounds, so the
  client gets to read the answer) and the body's arrival deadline (408), both
  answered in the app's refusal shape; a handler that fails before answering is a
  500 in that shape;
- a client that leaves cancels its request. granian reports a disconnect through a
  per-request future that costs about as much as the rest of a proxied request, so
  it is armed only for requests still running after `WATCH_AFTER_S` (a long
  generation, a request held for a cold start); a stream notices earlier, when a
  write fails.

One sweep every `SWEEP_S` arms those watches and enforces the arrival deadline, so
no timer is set per request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from granian._granian import RSGIHTTPProtocol as HTTPProtocol
from granian._granian import RSGIProtocolClosed as ProtocolClosed
from granian.rsgi import Scope

from gateway.transport.asgi import call_asgi
from gateway.transport.exchange import Headers, LeanRoutes, Refusal, Request
from gateway.transport.framing import BodyRefused, head_refusal, read_chunked

log = logging.getLogger("kama.gateway")

MAX_BODY_BYTES = 8 * 1024 * 1024
BODY_ARRIVAL_S = 30.0  # from the head to the body's last byte (slow senders)
DRAIN_BYTES = 64 * 1024 * 1024  # read and dropped after a 413, so the client reads it
DRAIN_PIECES = 4096  # each piece is an await: a body of tiny chunks is drained briefly
DRAIN_S = 2.0
CLOSE = ("connection", "close")
WATCH_AFTER_S = 0.2  # a request running this long is cancelled when its client leaves
SWEEP_S = 0.1


async def body_chunks(proto: Any) -> AsyncIterator[bytes]:
    """The body as it arrives (granian's own iterator can be started only once)."""
    async for chunk in proto:
        yield chunk


class RSGIReply:
    """A `Reply` on one RSGI request."""

    __slots__ = (
        "_proto",
        "_stream",
        "client_gone",
        "disconnect",
        "read_deadline",
        "started",
        "status",
        "task",
        "timed_out",
    )

    def __init__(self, proto: HTTPProtocol, task: asyncio.Task[Any] | None, now: float) -> None:
        self._proto = proto
        self._stream: Any = None
        self.task = task
        self.started = now
        self.status = 0
        self.client_gone = False
        self.timed_out = False
        self.read_deadline: float | None = None  # while the body is being read
        self.disconnect: Any = None  # granian's disconnect future, once armed

    def send(self, status: int, headers: Headers, body: bytes) -> None:
        self.status = status
        self._proto.response_bytes(status, headers, body)

    def start(self, status: int, headers: Headers) -> None:
        self.status = status
        self._stream = self._proto.response_stream(status, headers)

    async def write(self, chunk: bytes) -> None:
        try:
            await self._stream.send_bytes(chunk)
        except ProtocolClosed:
            self.client_gone = True
            raise ConnectionResetError("the client disconnected") from None

    def watch_disconnect(self) -> None:
        self.disconnect = self._proto.client_disconnect()
        self.disconnect.add_done_callback(self._left)

    def _left(self, future: Any) -> None:
        if future.cancelled():
            return  # the request ended first
        self.client_gone = True
        if self.task is not None:
            self.task.cancel()

    def time_out(self) -> None:
        self.timed_out = True
        if self.task is not None:
            self.task.cancel()

    def finish(self) -> None:
        """The request is over: a streamed answer ends when granian's stream is
        dropped (the reply itself may outlive this, held by a traceback), and an
        unfired disconnect watch would outlive the request."""
        self._stream = None
        if self.disconnect is not None:
            self.disconnect.cancel()


class PublicFront:
    """The RSGI application of the public port."""

    def __init__(
        self,
        *,
        lean: LeanRoutes,
        app: Any,  # an ASGI app (FastAPI)
        refusal: Refusal,
        max_body: int = MAX_BODY_BYTES,
    ) -> None:
        self.lean = lean
        self.app = app
        self.refusal = refusal
        self.max_body = max_body
        self.replies: set[RSGIReply] = set()
        self.clock = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    # RSGI hooks: granian calls these when its worker starts and stops
    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.clock = loop.time()
        self._sweeper = loop.call_later(SWEEP_S, self.sweep)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()

    def sweep(self) -> None:
        assert self._loop is not None
        self.clock = now = self._loop.time()
        try:
            for reply in self.replies:
                if reply.disconnect is None and now - reply.started >= WATCH_AFTER_S:
                    reply.watch_disconnect()
                deadline = reply.read_deadline
                if deadline is not None and now > deadline and not reply.timed_out:
                    reply.time_out()
        except Exception:
            log.exception("sweeping requests in flight failed")
        finally:
            self._sweeper = self._loop.call_later(SWEEP_S, self.sweep)

    async def __rsgi__(self, scope: Scope, proto: Any) -> None:
        if scope.proto != "http":  # a websocket upgrade: nothing here speaks it
            proto.close(404)
            return
        reply = RSGIReply(proto, asyncio.current_task(), self.clock)
        self.replies.add(reply)
        try:
            refused = head_refusal(http_version=scope.http_version, fields=scope.headers)
            if refused is not None:
                self._refuse(reply, *refused, close=True)
                return
            body = await self._read_body(scope, proto, reply)
            if body is None:
                return
            handler = self.lean(scope.method, scope.path)
            if handler is None:
                await call_asgi(self.app, scope=scope, body=body, reply=reply)
            else:
                await handler(Request(scope.method, scope.path, scope.headers, body), reply)
        except (asyncio.CancelledError, ConnectionError):
            if not reply.client_gone:
                raise  # the server is stopping: not ours to swallow
            task = reply.task
            if task is not None:
                task.uncancel()  # the client left: what it waited for is undone already
        except Exception:
            log.exception("answering %s %s failed", scope.method, scope.path)
            if not reply.status:
                self._refuse(reply, 500, "the gateway failed to answer")
        finally:
            self.replies.discard(reply)
            reply.finish()

    async def _read_body(self, scope: Scope, proto: Any, reply: RSGIReply) -> bytes | None:
        """The whole body, or None once the request was refused (too large, too
        slow). granian has checked that a declared length is a number, and holds the
        body to it."""
        declared = scope.headers.get("content-length")
        reply.read_deadline = self.clock + BODY_ARRIVAL_S
        try:
            if declared is not None and int(declared) > self.max_body:
                message = f"request body is larger than {self.max_body} bytes"
                self._refuse(reply, 413, message)
                await self._drain(body_chunks(proto), reply)
                return None
            if declared is not None:
                body: bytes = await proto()
                return body
            if "transfer-encoding" not in scope.headers:
                return b""
            stream = body_chunks(proto)
            try:
                return await read_chunked(stream, max_body=self.max_body)
            except BodyRefused as refused:
                self._refuse(reply, refused.status, refused.message, close=refused.status != 413)
                if refused.drain:
                    await self._drain(stream, reply)
                return None
        except asyncio.CancelledError:
            if not reply.timed_out or reply.client_gone or reply.task is None:
                raise
            reply.task.uncancel()
            if not reply.status:
                self._refuse(
                    reply, 408, f"the request body did not arrive within {BODY_ARRIVAL_S:g}s"
                )
            return None
        finally:
            reply.read_deadline = None

    async def _drain(self, stream: AsyncIterator[bytes], reply: RSGIReply) -> None:
        """After a refusal, read and drop what the client still sends (up to
        `DRAIN_BYTES` in `DRAIN_PIECES` pieces, for up to `DRAIN_S`): a connection
        closed under an upload in progress is reset, and the client might never read
        its answer."""
        reply.read_deadline = self.clock + DRAIN_S
        drained = pieces = 0
        async for chunk in stream:
            drained += len(chunk)
            pieces += 1
            if drained > DRAIN_BYTES or pieces > DRAIN_PIECES:
                break

    def _refuse(self, reply: RSGIReply, status: int, message: str, *, close: bool = False) -> None:
        headers, body = self.refusal(status, message)
        reply.send(status, [*headers, CLOSE] if close else headers, body)
