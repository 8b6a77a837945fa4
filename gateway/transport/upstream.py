"""The gateway's HTTP/1.1 connections to replicas, as an httpx transport.

httpx's default transport (httpcore on anyio) costs about a millisecond of CPU per
proxied request and checks every pooled socket on each request, which alone was
most of the gateway's added latency. Replicas are plain HTTP/1.1 servers on a pod
IP, so this transport does only that: one keep-alive pool per origin (most
recently used first, idle connections dropped after `keepalive_expiry`, below
llama-server's own 5 s), the response parsed by httptools, the body handed over
chunk by chunk as it arrives (reading pauses while a slow client lets chunks pile
up), and closing a response before its end closes the connection, which is how a
replica learns that the client went away. It stays an `httpx.AsyncBaseTransport`,
so the gateway keeps using `AsyncClient.send(stream=True)` and httpx's errors.

A response head is bounded whatever the replica does: it must arrive whole within
the read timeout (a total deadline, so a head dripped a byte at a time cannot extend
it) and within `MAX_HEAD_BYTES`; past either the connection is closed and the
request fails with `ResponseHeadTimeout` or `ResponseHeadTooLarge` (httpx errors, so
callers see a failed replica). Bodies are bounded by their readers (the proxy's
document limit, `activities.pod_reads` for polls)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, cast

import httptools
import httpx

DEFAULT_KEEPALIVE_EXPIRY_S = 2.0
DEFAULT_MAX_IDLE_PER_ORIGIN = 512
PAUSE_READING_BYTES = 1 << 20  # a slow client: stop reading from the replica above this
RESUME_READING_BYTES = 1 << 16
STALE_RACE_S = 0.05  # a reused connection lost this soon after the write is retried once
MAX_HEAD_BYTES = 64 * 1024  # a response head (status line and fields) larger than this fails

HOP_BY_HOP_REQUEST = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection"})

Origin = tuple[str, int]


class ResponseHeadTimeout(httpx.ReadTimeout):
    """The replica's response head did not arrive whole within the deadline."""


class ResponseHeadTooLarge(httpx.RemoteProtocolError):
    """The replica's response head was larger than `MAX_HEAD_BYTES`."""


async def _exchange(
    connection: UpstreamConnection,
    data: tuple[bytes, bytes],
    *,
    no_body: bool,
    read_timeout: float | None,
) -> None:
    """Send a request and wait for the response head; on any failure, cancellation
    included, the connection is closed (the replica must not keep working for a
    caller that is gone)."""
    connection.send_request(data, no_body=no_body)
    try:
        await connection.read_head(timeout=read_timeout)
    except BaseException:
        connection.close()
        raise


class UpstreamConnection(asyncio.Protocol):
    """One TCP connection to a replica, carrying one request at a time."""

    def __init__(
        self,
        *,
        on_lost: Callable[[UpstreamConnection], None],
        max_head_bytes: int = MAX_HEAD_BYTES,
    ) -> None:
        self._on_lost = on_lost
        self.max_head_bytes = max_head_bytes
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.sent_at = 0.0
        self.lost_at = 0.0
        self.parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self.received_any = False
        self.complete = False
        self.error: httpx.TransportError | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._head_bytes = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._head_done = False
        self._timed_out = False
        self._close_delimited = False
        self._no_body = False

    # asyncio.Protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("replica tried to upgrade the connection"))
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"invalid HTTP response from replica: {exc}"))
            return
        if not self._head_done:  # a head completed in this data is whole, whatever follows
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._fail(
                    ResponseHeadTooLarge(
                        f"replica's response head is over {self.max_head_bytes} bytes"
                    )
                )

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost_at = self._loop.time()
        if self._head_done and self._close_delimited and not self.keep_alive:
            self.complete = True  # a body that ends with the connection
        if not self.complete and self.error is None:
            if not self.received_any:
                message = "replica closed the connection without answering"
            else:
                message = "replica closed the connection before the response ended"
            self.error = httpx.RemoteProtocolError(message)
        self._wake()
        self._on_lost(self)

    # httptools callbacks ----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        names = {name.lower() for name, _ in self.headers}
        self._close_delimited = not ({b"content-length", b"transfer-encoding"} & names)
        self._head_done = True
        if self._no_body:
            self.complete = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > PAUSE_READING_BYTES and not self._paused and self.transport:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # the request side ---------------------------------------------------------------

    def _fail(self, error: httpx.TransportError) -> None:
        if self.error is None:
            self.error = error
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, *, timeout: float | None) -> None:
        self._waiter = self._loop.create_future()
        timer = None if timeout is None else self._loop.call_later(timeout, self._time_out)
        try:
            await self._waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        if self._timed_out:
            self.close()
            raise httpx.ReadTimeout(f"replica sent nothing for {timeout:g}s")

    def _time_out(self) -> None:
        self._timed_out = True
        self._wake()

    def send_request(self, data: tuple[bytes, bytes], *, no_body: bool = False) -> None:
        """Write a request: its head, then its body (not joined: a body of megabytes
        is not copied once more)."""
        if self._paused and self.transport is not None:
            self.transport.resume_reading()
        if no_body or self._no_body:  # a HEAD answer's head leaves the parser awaiting a body
            self.parser = httptools.HttpResponseParser(self)
        self._reset()
        self.sent_at = self._loop.time()
        self._no_body = no_body  # a HEAD answer: the parser cannot know it has no body
        assert self.transport is not None
        head, body = data
        self.transport.write(head)
        if body:
            self.transport.write(body)

    async def read_head(self, *, timeout: float | None) -> None:
        """Until the response head is in: whole within `timeout` (a total deadline,
        not one per piece), else ResponseHeadTimeout."""
        deadline = None if timeout is None else self._loop.time() + timeout
        while not self._head_done:
            if self.error is not None:
                raise self.error
            remaining = None if deadline is None else deadline - self._loop.time()
            if remaining is not None and remaining <= 0:
                self.close()
                raise ResponseHeadTimeout(f"replica's response head not in within {timeout:g}s")
            try:
                await self._wait(timeout=remaining)
            except httpx.ReadTimeout:
                raise ResponseHeadTimeout(
                    f"replica's response head not in within {timeout:g}s"
                ) from None

    async def read_chunk(self, *, timeout: float | None) -> bytes | None:
        """The next piece of the body, or None at its end."""
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._paused and self._buffered < RESUME_READING_BYTES and self.transport:
                    self._paused = False
                    self.transport.resume_reading()
                return chunk
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            await self._wait(timeout=timeout)

    def lost_right_after_send(self) -> bool:
        """Closed within moments of the request being written: the replica was closing
        this idle connection already (a crash mid-answer comes later)."""
        return self.closed and self.lost_at - self.sent_at < STALE_RACE_S

    def unread(self) -> bool:
        return bool(self._chunks)

    def take_whole_body(self) -> bytes | None:
        if not self.complete:
            return None
        body = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return body

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()


class UpstreamBody(httpx.AsyncByteStream):
    def __init__(
        self,
        *,
        connection: UpstreamConnection,
        release: Callable[[UpstreamConnection], None],
        read_timeout: float | None,
    ) -> None:
        self._connection = connection
        self._release = release
        self._read_timeout = read_timeout
        self._done = False
        self.status = connection.status
        self.headers = connection.headers

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self._connection.read_chunk(timeout=self._read_timeout)) is not None:
            yield chunk

    @property
    def arrived(self) -> bool:
        """The whole body is here (read or not)."""
        return self._connection.complete

    def take_whole_body(self) -> bytes | None:
        """The entire body if it has already arrived (it is then consumed), else None."""
        return self._connection.take_whole_body()

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        connection = self._connection
        reusable = connection.complete and connection.keep_alive and not connection.closed
        if reusable and not connection.unread():
            self._release(connection)
        else:
            connection.close()  # unread answer: the replica sees the client leave


class UpstreamTransport(httpx.AsyncBaseTransport):
    def __init__(
        self,
        *,
        keepalive_expiry: float = DEFAULT_KEEPALIVE_EXPIRY_S,
        max_idle_per_origin: int = DEFAULT_MAX_IDLE_PER_ORIGIN,
    ) -> None:
        self.keepalive_expiry = keepalive_expiry
        self.max_idle_per_origin = max_idle_per_origin
        self._idle: dict[Origin, deque[UpstreamConnection]] = {}
        self._origin_of: dict[UpstreamConnection, Origin] = {}
        self._reaper: asyncio.TimerHandle | None = None

    def idle_connections(self, origin: Origin) -> int:
        return len(self._idle.get(origin, ()))

    async def request(
        self,
        *,
        host: str,
        port: int,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        connect_timeout: float | None,
        read_timeout: float | None,
    ) -> UpstreamBody:
        """Send one request; return once the response head is in (status and headers
        on the returned body, which is read chunk by chunk and must be closed)."""
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        data = encode_request(
            method=method, target=target, host=authority, headers=headers, body=body
        )
        no_body = method == "HEAD"
        origin = (host, port)
        connection = self._idle_connection(origin)
        if connection is not None:
            try:
                await _exchange(connection, data, no_body=no_body, read_timeout=read_timeout)
            except httpx.RemoteProtocolError:
                if connection.received_any or not connection.lost_right_after_send():
                    raise  # the replica may have started on it: never send it twice
                connection = None  # the replica closed an idle connection as we reused it
        if connection is None:
            connection = await self._connect(origin, timeout=connect_timeout)
            await _exchange(connection, data, no_body=no_body, read_timeout=read_timeout)
        return UpstreamBody(connection=connection, release=self._release, read_timeout=read_timeout)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"replicas speak plain http, not {request.url.scheme}")
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        body = await self.request(
            host=request.url.host,
            port=request.url.port or 80,
            method=request.method,
            target=request.url.raw_path.decode("ascii"),
            headers=[(k, v) for k, v in request.headers.raw if k.lower() not in HOP_BY_HOP_REQUEST],
            body=await request.aread(),
            connect_timeout=timeouts.get("connect"),
            read_timeout=timeouts.get("read"),
        )
        return httpx.Response(
            body.status,
            headers=body.headers,
            stream=body,
            extensions={"http_version": b"HTTP/1.1"},
        )

    def _idle_connection(self, origin: Origin) -> UpstreamConnection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()  # most recently used: least likely to be stale
            if connection.closed or now - connection.idle_since > self.keepalive_expiry:
                connection.close()
                continue
            return connection
        return None

    async def _connect(self, origin: Origin, *, timeout: float | None) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_connection(
                    lambda: UpstreamConnection(on_lost=self._forget), *origin
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {origin[0]}:{origin[1]} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"connecting to {origin[0]}:{origin[1]}: {exc}") from None
        self._origin_of[connection] = origin
        return connection

    def _release(self, connection: UpstreamConnection) -> None:
        origin = self._origin_of.get(connection)
        if origin is None:
            connection.close()
            return
        idle = self._idle.setdefault(origin, deque())
        if len(idle) >= self.max_idle_per_origin:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().call_later(self.keepalive_expiry, self._reap)

    def _reap(self) -> None:
        """Close connections idle past the expiry (an idle keep-alive connection holds
        one of llama-server's HTTP threads until its own 5 s timeout)."""
        self._reaper = None
        deadline = time.monotonic() - self.keepalive_expiry
        for origin, idle in list(self._idle.items()):
            while idle and idle[0].idle_since <= deadline:
                idle.popleft().close()
            if not idle:
                del self._idle[origin]
        if self._idle:
            self._reaper = asyncio.get_running_loop().call_later(
                self.keepalive_expiry / 2, self._reap
            )

    def _forget(self, connection: UpstreamConnection) -> None:
        origin = self._origin_of.pop(connection, None)
        idle = self._idle.get(origin) if origin is not None else None
        if idle is not None and connection in idle:
            idle.remove(connection)

    async def aclose(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


def encode_request(
    *, method: str, target: str, host: str, headers: Sequence[tuple[bytes, bytes]], body: bytes
) -> tuple[bytes, bytes]:
    """An HTTP/1.1 request's head and body (the length is always declared)."""
    lines = [f"{method} {target} HTTP/1.1\r\nhost: {host}".encode("ascii")]
    lines += [name + b": " + value for name, value in headers if name.lower() != b"content-length"]
    if body or method not in ("GET", "HEAD"):
        lines.append(b"content-length: " + str(len(body)).encode("ascii"))
    return b"\r\n".join(lines) + b"\r\n\r\n", body
