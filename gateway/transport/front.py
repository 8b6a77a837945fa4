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
- what a client may make the gateway hold (`gateway.held`): at most
  `max_requests_per_client` requests in progress from one address (429 past it,
  with `connection: close`), and the bodies arriving at once, over all clients,
  within `max_upload_bytes` (a declared length is counted before anything is read,
  a chunked body as it arrives; 429 past it). Both are answered before the body is
  read, which is then drained as after a 413. The client's address is the peer's:
  behind a proxy or load balancer that does not keep it, every client shares one;
- what a client has not taken of its answers (`unread_answers`): a streamed answer
  waits for a slow reader (back-pressure to its replica), a connection that took no
  room for `stall_s` is aborted, and past the gateway-wide total the largest
  debtors' connections are aborted; a request still running `answer_deadline_s`
  after it arrived is ended;
- a requester (its key, or its address without one) refused again and again has each
  next request wait first (`refusal_pacing`), so that ignoring `Retry-After` costs it
  time instead of costing other tenants the gateway's CPU;
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
from gateway.transport.exchange import (
    HeadCheck,
    Headers,
    HeadVerdict,
    LeanRoutes,
    Refusal,
    Request,
)
from gateway.transport.framing import BodyRefused, head_refusal, read_chunked
from gateway.transport.refusal_pacing import RefusalPacing
from gateway.transport.unread_answers import (
    AnswerAborted,
    AnswerDebt,
    UnreadAnswers,
    UnreadLimits,
    answer_debt,
)

log = logging.getLogger("kama.gateway")

MAX_BODY_BYTES = 8 * 1024 * 1024
BODY_ARRIVAL_S = 30.0  # from the head to the body's last byte (slow senders)
DRAIN_BYTES = 64 * 1024 * 1024  # read and dropped after a 413, so the client reads it
DRAIN_PIECES = 4096  # each piece is an await: a body of tiny chunks is drained briefly
DRAIN_S = 2.0
CLOSE = ("connection", "close")
WATCH_AFTER_S = 0.2  # a request running this long is cancelled when its client leaves
SWEEP_S = 0.1
DEBTS_EVERY = 5  # sweeps between two looks at what clients have not taken
DEFAULT_ANSWER_DEADLINE_S = 3600.0  # a request's whole life, from its head to its last byte
DEFAULT_MAX_UPLOAD_BYTES = 256 * 1024 * 1024  # bodies arriving at once, over all clients
DEFAULT_MAX_REQUESTS_PER_CLIENT = 256  # requests in progress from one address; 0: no cap
RETRY_AFTER_BUSY_S = 1
# refused requests whose bodies are read and dropped at once (so their clients read the
# answer): key-less clients cannot take more of the gateway than this; past it a
# refusal closes the connection instead
REFUSED_DRAINS = 64
ADMITTED = HeadVerdict()  # where the app has no head check


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
        "debt",
        "disconnect",
        "overdue",
        "read_deadline",
        "scope",
        "started",
        "status",
        "task",
        "timed_out",
        "unread",
    )

    def __init__(
        self,
        proto: HTTPProtocol,
        task: asyncio.Task[Any] | None,
        now: float,
        *,
        scope: Scope | None = None,
        unread: UnreadAnswers | None = None,
    ) -> None:
        self._proto = proto
        self._stream: Any = None
        self.task = task
        self.started = now
        self.status = 0
        self.client_gone = False
        self.timed_out = False
        self.overdue = False  # ended by the answer deadline
        self.read_deadline: float | None = None  # while the body is being read
        self.disconnect: Any = None  # granian's disconnect future, once armed
        self.scope = scope  # its connection's addresses, for `unread`
        self.unread = unread
        self.debt: AnswerDebt | None = None  # what its client has not taken, once answered

    def send(self, status: int, headers: Headers, body: bytes) -> None:
        self.status = status
        if self.unread is not None:
            self.unread.handing(self._debt(), len(body))
        self._proto.response_bytes(status, headers, body)

    def start(self, status: int, headers: Headers) -> None:
        self.status = status
        self._stream = self._proto.response_stream(status, headers)

    async def write(self, chunk: bytes) -> None:
        unread = self.unread
        if unread is not None:
            debt = self._debt()
            try:
                await unread.room(debt, len(chunk))
            except AnswerAborted:
                self.client_gone = True  # its connection aborted: the request ends quietly
                raise
            unread.handing(debt, len(chunk))
        try:
            await self._stream.send_bytes(chunk)
        except ProtocolClosed:
            self.client_gone = True
            raise ConnectionResetError("the client disconnected") from None

    def _debt(self) -> AnswerDebt:
        if self.debt is None:
            scope = self.scope
            self.debt = answer_debt(
                local=scope.server if scope is not None else "",
                peer=scope.client if scope is not None else "",
                on_abort=self.end,
            )
        return self.debt

    def end(self) -> None:
        """End the request: its client left, takes its answer too slowly, or too long."""
        self.client_gone = True
        if self.task is not None:
            self.task.cancel()

    def watch_disconnect(self) -> None:
        self.disconnect = self._proto.client_disconnect()
        self.disconnect.add_done_callback(self._left)

    def _left(self, future: Any) -> None:
        if future.cancelled():
            return  # the request ended first
        self.end()

    def time_out(self) -> None:
        self.timed_out = True
        if self.task is not None:
            self.task.cancel()

    def finish(self) -> None:
        """The request is over: a streamed answer ends when granian's stream is
        dropped (the reply itself may outlive this, held by a traceback), and an
        unfired disconnect watch would outlive the request."""
        self._stream = None
        self.task = None
        if self.disconnect is not None:
            self.disconnect.cancel()
        if self.unread is not None and self.debt is not None:
            self.unread.settle(self.debt)


class PublicFront:
    """The RSGI application of the public port."""

    def __init__(
        self,
        *,
        lean: LeanRoutes,
        app: Any,  # an ASGI app (FastAPI)
        refusal: Refusal,
        max_body: int = MAX_BODY_BYTES,
        max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
        max_requests_per_client: int = DEFAULT_MAX_REQUESTS_PER_CLIENT,
        client_write_timeout_s: float = 0.0,  # applied by the server to its sockets
        head_check: HeadCheck | None = None,
        unread: UnreadLimits | None = None,  # None: answers are not measured
        answer_deadline_s: float = DEFAULT_ANSWER_DEADLINE_S,  # 0: none
    ) -> None:
        self.lean = lean
        self.app = app
        self.refusal = refusal
        self.max_body = max_body
        self.max_upload_bytes = max_upload_bytes
        self.max_requests_per_client = max_requests_per_client
        self.client_write_timeout_s = client_write_timeout_s
        self.head_check = head_check
        self.unread = None if unread is None else UnreadAnswers(limits=unread)
        self.answer_deadline_s = answer_deadline_s
        self.sweeps = 0
        self.uploading = 0  # bytes of bodies being received, over all requests
        self.draining_refused = 0  # refused requests whose bodies are being dropped
        self.per_client: dict[str, int] = {}  # requests in progress per client address
        self.pacing = RefusalPacing()  # requesters refused again and again wait first
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
        self.sweeps += 1
        try:
            # requests that arrived before this are past the answer deadline
            overdue_before = now - self.answer_deadline_s if self.answer_deadline_s else None
            for reply in self.replies:
                if reply.disconnect is None and now - reply.started >= WATCH_AFTER_S:
                    reply.watch_disconnect()
                deadline = reply.read_deadline
                if deadline is not None and now > deadline and not reply.timed_out:
                    reply.time_out()
                elif (
                    overdue_before is not None
                    and reply.started < overdue_before
                    and not reply.client_gone
                ):
                    log.warning("ended a request past its %gs deadline", self.answer_deadline_s)
                    reply.overdue = True
                    reply.end()
            if self.unread is not None and self.sweeps % DEBTS_EVERY == 0:
                self.unread.sweep()
        except Exception:
            log.exception("sweeping requests in flight failed")
        finally:
            self._sweeper = self._loop.call_later(SWEEP_S, self.sweep)

    async def __rsgi__(self, scope: Scope, proto: Any) -> None:
        if scope.proto != "http":  # a websocket upgrade: nothing here speaks it
            proto.close(404)
            return
        reply = RSGIReply(
            proto, asyncio.current_task(), self.clock, scope=scope, unread=self.unread
        )
        self.replies.add(reply)
        client = _address(scope.client)
        busy = self.per_client.get(client, 0)
        self.per_client[client] = busy + 1
        verdict: HeadVerdict | None = None
        try:
            refused = head_refusal(http_version=scope.http_version, fields=scope.headers)
            if refused is not None:
                self._refuse(reply, *refused, close=True)
                return
            verdict = await self._admit_head(scope, proto, reply, busy=busy, client=client)
            if verdict is None:
                return
            await self._paced(verdict.requester or client)
            body = await self._read_body(scope, proto, reply)
            if body is None:
                return
            handler = self.lean(scope.method, scope.path)
            if handler is None:
                await call_asgi(self.app, scope=scope, body=body, reply=reply)
            else:
                request = Request(
                    scope.method,
                    scope.path,
                    scope.headers,
                    body,
                    principal=verdict.principal,
                    head_checked=self.head_check is not None,
                )
                await handler(request, reply)
        except (asyncio.CancelledError, ConnectionError):
            if not reply.client_gone:
                raise  # the server is stopping: not ours to swallow
            task = reply.task
            if task is not None:
                task.uncancel()  # the client left: what it waited for is undone already
            if reply.overdue and not reply.status:
                message = f"the request took longer than {self.answer_deadline_s:g}s"
                self._refuse(reply, 504, message, close=True)
        except Exception:
            log.exception("answering %s %s failed", scope.method, scope.path)
            if not reply.status:
                self._refuse(reply, 500, "the gateway failed to answer")
        finally:
            if verdict is not None and verdict.release is not None:
                verdict.release()
            if reply.status == 429 or (verdict is None and reply.status == 401):
                requester = verdict.requester if verdict is not None else None
                self.pacing.refused(requester or client, now=self.clock)
            self.replies.discard(reply)
            reply.finish()
            left = self.per_client[client] - 1
            if left:
                self.per_client[client] = left
            else:
                del self.per_client[client]

    async def _paced(self, requester: str) -> None:
        """Wait first if `requester` was refused again and again (`refusal_pacing`)."""
        wait = self.pacing.delay(requester, now=self.clock)
        if not wait:
            return
        self.pacing.paced += 1
        try:
            await asyncio.sleep(wait)
        finally:
            self.pacing.paced -= 1

    async def _admit_head(
        self, scope: Scope, proto: Any, reply: RSGIReply, *, busy: int, client: str
    ) -> HeadVerdict | None:
        """What the head alone decides, before a body byte is read or counted: the
        client already has `busy` requests in progress, or the app's head check (the
        API key and its request limit) refuses it. None once refused: answered, and
        its body dropped as after a 413 (`_refuse_unread`)."""
        if self.max_requests_per_client and busy >= self.max_requests_per_client:
            message = (
                f"this client already has {busy} requests in progress "
                f"(at most {self.max_requests_per_client}); retry later"
            )
            headers, body = self.refusal(429, message)
            headers = [*headers, ("retry-after", str(RETRY_AFTER_BUSY_S)), CLOSE]
            await self._paced(client)
            await self._refuse_unread(proto, reply, 429, headers, body)
            return None
        if self.head_check is None:
            return ADMITTED
        verdict = self.head_check(scope.method, scope.path, scope.headers)
        if verdict.refusal is not None:
            await self._paced(client)  # a refusal from the head is paced by address
            await self._refuse_unread(proto, reply, *verdict.refusal)
            return None
        return verdict

    async def _refuse_unread(
        self, proto: Any, reply: RSGIReply, status: int, headers: Headers, body: bytes
    ) -> None:
        """Answer a request refused from its head, then read and drop what its client
        still sends, so that it reads the answer: at most REFUSED_DRAINS such drains at
        once, past which the answer closes the connection unread."""
        if self.draining_refused >= REFUSED_DRAINS:
            reply.send(status, headers if CLOSE in headers else [*headers, CLOSE], body)
            return
        reply.send(status, headers, body)
        self.draining_refused += 1
        try:
            await self._drain(body_chunks(proto), reply)
        except asyncio.CancelledError:
            if not reply.timed_out or reply.client_gone or reply.task is None:
                raise
            reply.task.uncancel()  # the drain's own deadline
        finally:
            reply.read_deadline = None
            self.draining_refused -= 1

    async def _read_body(self, scope: Scope, proto: Any, reply: RSGIReply) -> bytes | None:
        """The whole body, or None once the request was refused (too large, too slow,
        no room). granian has checked that a declared length is a number, and holds
        the body to it."""
        declared = scope.headers.get("content-length")
        reply.read_deadline = self.clock + BODY_ARRIVAL_S
        counted = [0]  # bytes of this body counted as arriving, given back at the end
        try:
            if declared is not None and int(declared) > self.max_body:
                message = f"request body is larger than {self.max_body} bytes"
                self._refuse(reply, 413, message)
                await self._drain(body_chunks(proto), reply)
                return None
            if declared is not None:
                try:
                    self._count_upload(counted, int(declared))
                except BodyRefused as refused:
                    self._refuse_upload(reply, refused)
                    await self._drain(body_chunks(proto), reply)
                    return None
                body: bytes = await proto()
                return body
            if "transfer-encoding" not in scope.headers:
                return b""
            stream = body_chunks(proto)
            try:
                return await read_chunked(
                    self._counted_chunks(stream, counted), max_body=self.max_body
                )
            except BodyRefused as refused:
                self._refuse_upload(reply, refused)
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
            self.uploading -= counted[0]

    def _count_upload(self, counted: list[int], size: int) -> None:
        """Count `size` more bytes of a body as arriving; BodyRefused 429 past the
        uploads budget."""
        if self.uploading + size > self.max_upload_bytes:
            raise BodyRefused(
                429,
                f"the gateway is already receiving {self.uploading} bytes of request bodies "
                f"(at most {self.max_upload_bytes}); retry later",
                drain=True,
            )
        self.uploading += size
        counted[0] += size

    async def _counted_chunks(
        self, stream: AsyncIterator[bytes], counted: list[int]
    ) -> AsyncIterator[bytes]:
        async for chunk in stream:
            self._count_upload(counted, len(chunk))
            yield chunk

    def _refuse_upload(self, reply: RSGIReply, refused: BodyRefused) -> None:
        self._refuse(
            reply,
            refused.status,
            refused.message,
            close=refused.status != 413,
            retry_after=RETRY_AFTER_BUSY_S if refused.status == 429 else None,
        )

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

    def _refuse(
        self,
        reply: RSGIReply,
        status: int,
        message: str,
        *,
        close: bool = False,
        retry_after: int | None = None,
    ) -> None:
        headers, body = self.refusal(status, message)
        if retry_after is not None:
            headers = [*headers, ("retry-after", str(retry_after))]
        reply.send(status, [*headers, CLOSE] if close else headers, body)


def _address(peer: str) -> str:
    """The client's address from granian's `host:port` (`[v6]:port` for IPv6)."""
    return peer.rpartition(":")[0] or peer
