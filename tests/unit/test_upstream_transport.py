"""The gateway's HTTP/1.1 transport to replicas (gateway/upstream.py) against real
sockets: small asyncio servers on 127.0.0.1 that speak raw HTTP/1.1 and count their
connections, so keep-alive reuse, chunk-by-chunk delivery, closing a response
early, stale and expired idle connections and the httpx errors are checked the way
a replica would see them, through the native `request` API and through
`httpx.AsyncClient(transport=UpstreamTransport())`."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

import httpx
import pytest

from gateway.transport.upstream import UpstreamBody, UpstreamTransport

pytestmark = pytest.mark.timeout(10)  # a hang fails one test instead of the run

WAIT_S = 1.0  # the longest any single step of these tests may take


@dataclass
class Received:
    """One request as the server read it (header names lowercased)."""

    connection: int
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    header_names: list[str]


@dataclass
class Conn:
    """The server's side of one accepted connection (numbered from 1)."""

    replica: Replica
    index: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def read_request(self) -> Received | None:
        """The next request on this connection, or None once the client closed it."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        request_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
        method, target, _ = request_line.split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        names = [line.split(":", 1)[0].strip().lower() for line in lines]
        received = Received(self.index, method, target, headers, body, names)
        self.replica.requests.append(received)
        return received

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def client_left(self) -> bool:
        """Whether the client closes this connection (EOF or reset) within WAIT_S."""
        try:
            async with asyncio.timeout(WAIT_S):
                while await self.reader.read(1 << 16):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            pass
        return True


Serve = Callable[[Conn], Awaitable[None]]


class Replica:
    """A raw HTTP/1.1 server on 127.0.0.1 that runs `serve` on each accepted
    connection and keeps count of connections and requests."""

    def __init__(self, serve: Serve, *, host: str = "127.0.0.1") -> None:
        self._serve = serve
        self.host = host
        self.port = 0
        self.connections = 0
        self.requests: list[Received] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Replica:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            await self._serve(Conn(self, self.connections, reader, writer))
        except (ConnectionError, asyncio.CancelledError):
            pass  # a cancelled handler would be logged as an error by Python 3.11's streams
        finally:
            writer.close()
            self._tasks.discard(task)

    @property
    def origin(self) -> tuple[str, int]:
        return (self.host, self.port)

    def url(self, path: str = "/") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"


def response(
    body: bytes = b"", *, status: int = 200, headers: Sequence[tuple[str, str]] = ()
) -> bytes:
    """A complete response with a content-length."""
    head = [f"HTTP/1.1 {status} Whatever", f"content-length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode("ascii") + data + b"\r\n"


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"


def keep_alive(reply: Callable[[Received], bytes]) -> Serve:
    """Answer every request on a connection with `reply(request)` until the client closes."""

    async def serve(conn: Conn) -> None:
        while (request := await conn.read_request()) is not None:
            await conn.send(reply(request))

    return serve


def echo(request: Received) -> bytes:
    """The request as JSON, so a test can see what arrived."""
    seen = {
        "connection": request.connection,
        "method": request.method,
        "target": request.target,
        "host": request.headers.get("host"),
        "body": request.body.decode(),
    }
    return response(
        json.dumps(seen).encode(),
        headers=[("content-type", "application/json"), ("x-replica", "r0")],
    )


async def send(
    transport: UpstreamTransport,
    replica: Replica,
    *,
    method: str = "GET",
    target: str = "/",
    headers: Sequence[tuple[bytes, bytes]] = (),
    body: bytes = b"",
    read_timeout: float | None = WAIT_S,
) -> UpstreamBody:
    return await transport.request(
        host=replica.host,
        port=replica.port,
        method=method,
        target=target,
        headers=headers,
        body=body,
        connect_timeout=WAIT_S,
        read_timeout=read_timeout,
    )


def silent_replica() -> tuple[Serve, list[bool]]:
    """A server that reads one request, never answers, and records whether the
    client then hung up."""
    hung_up: list[bool] = []

    async def serve(conn: Conn) -> None:
        await conn.read_request()
        hung_up.append(await conn.client_left())

    return serve, hung_up


async def read_all(body: UpstreamBody) -> bytes:
    try:
        return b"".join([piece async for piece in body])
    finally:
        await body.aclose()


def free_port() -> int:
    """A port that nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture
async def transport() -> AsyncIterator[UpstreamTransport]:
    upstream = UpstreamTransport()
    yield upstream
    await upstream.aclose()


# keep-alive --------------------------------------------------------------------------


async def test_sequential_requests_share_one_connection(transport: UpstreamTransport) -> None:
    async with Replica(keep_alive(echo)) as replica:
        first = await send(
            transport,
            replica,
            method="POST",
            target="/v1/chat/completions?stream=false",
            headers=[(b"content-type", b"application/json")],
            body=b'{"model": "tiny"}',
        )
        assert first.status == 200
        assert (b"x-replica", b"r0") in first.headers
        assert (b"content-type", b"application/json") in first.headers
        seen = json.loads(await read_all(first))
        assert seen == {
            "connection": 1,
            "method": "POST",
            "target": "/v1/chat/completions?stream=false",
            "host": f"127.0.0.1:{replica.port}",
            "body": '{"model": "tiny"}',
        }
        assert transport.idle_connections(replica.origin) == 1

        second = await send(transport, replica, target="/health")
        assert json.loads(await read_all(second))["target"] == "/health"

    assert replica.connections == 1, "the second request should reuse the kept-alive connection"
    post, get = replica.requests
    assert post.connection == get.connection == 1
    assert post.headers["content-length"] == "17" and post.headers["content-type"] == (
        "application/json"
    )
    assert "content-length" not in get.headers and get.body == b""  # a GET declares no body


async def test_a_body_less_post_still_declares_its_length(transport: UpstreamTransport) -> None:
    async with Replica(keep_alive(echo)) as replica:
        await read_all(await send(transport, replica, method="POST", target="/slots"))
    (post,) = replica.requests
    assert post.headers["content-length"] == "0"


async def test_a_stale_content_length_header_is_replaced(transport: UpstreamTransport) -> None:
    async with Replica(keep_alive(echo)) as replica:
        body = await send(
            transport, replica, method="POST", headers=[(b"Content-Length", b"999")], body=b"abc"
        )
        assert json.loads(await read_all(body))["body"] == "abc"
    (post,) = replica.requests
    assert post.headers["content-length"] == "3"


# streaming -----------------------------------------------------------------------------


async def test_a_chunked_answer_arrives_chunk_by_chunk(transport: UpstreamTransport) -> None:
    client_has_first = asyncio.Event()

    async def serve(conn: Conn) -> None:
        await conn.read_request()
        await conn.send(CHUNKED_HEAD + chunk(b"data: one\n\n"))
        await client_has_first.wait()  # the rest exists only once the first piece arrived
        await conn.send(chunk(b"data: two\n\n") + LAST_CHUNK)
        await conn.read_request()  # keep the connection open

    async with Replica(serve) as replica:
        body = await send(transport, replica, method="POST", body=b"{}")
        assert body.status == 200
        assert (b"transfer-encoding", b"chunked") in body.headers
        pieces = aiter(body)
        assert await anext(pieces) == b"data: one\n\n"
        client_has_first.set()
        assert b"".join([piece async for piece in pieces]) == b"data: two\n\n"
        await body.aclose()
        assert transport.idle_connections(replica.origin) == 1  # a whole answer: reusable


async def test_closing_an_unfinished_answer_closes_the_connection(
    transport: UpstreamTransport,
) -> None:
    saw_client_leave: list[bool] = []

    async def serve(conn: Conn) -> None:
        if conn.index == 1:
            await conn.read_request()
            await conn.send(CHUNKED_HEAD + chunk(b"data: token\n\n"))
            saw_client_leave.append(await conn.client_left())
        else:
            await keep_alive(echo)(conn)

    async with Replica(serve) as replica:
        body = await send(transport, replica, method="POST", body=b"{}")
        assert await anext(aiter(body)) == b"data: token\n\n"
        await body.aclose()
        assert transport.idle_connections(replica.origin) == 0
        after = json.loads(await read_all(await send(transport, replica)))
        assert after["connection"] == 2
        # the first handler has seen the EOF by now or times out on its own
        while not saw_client_leave:
            await asyncio.sleep(0.01)
    assert saw_client_leave == [True], "the replica should see the client go away"
    assert replica.connections == 2


async def test_a_body_that_ends_with_the_connection_is_complete(
    transport: UpstreamTransport,
) -> None:
    async def serve(conn: Conn) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\npart one, ")
        await conn.send(b"part two")
        # handler returns: the connection closes, which ends the body

    async with Replica(serve) as replica:
        body = await send(transport, replica)
        assert await read_all(body) == b"part one, part two"
        assert transport.idle_connections(replica.origin) == 0


async def test_a_large_answer_left_unread_is_not_pooled(transport: UpstreamTransport) -> None:
    payload = b"x" * (1024 * 1024 + 10)  # its last read both pauses reading and ends it

    async with Replica(keep_alive(lambda _: response(payload))) as replica:
        body = await send(transport, replica)
        while not body.arrived:
            await asyncio.sleep(0.01)
        await body.aclose()  # the client left before anything was relayed
        assert transport.idle_connections(replica.origin) == 0
        again = await send(transport, replica)
        assert await read_all(again) == payload  # on a fresh, readable connection
        assert replica.connections == 2


async def test_a_large_answer_read_slowly_arrives_whole(transport: UpstreamTransport) -> None:
    payload = bytes(range(256)) * (4 * 4096)  # 4 MiB: reading pauses and resumes

    async with Replica(keep_alive(lambda _: response(payload))) as replica:
        body = await send(transport, replica)
        await asyncio.sleep(0.05)  # let the replica run ahead of the reader
        assert await read_all(body) == payload
        assert transport.idle_connections(replica.origin) == 1


# idle connections ----------------------------------------------------------------------


async def test_an_idle_connection_the_replica_closed_is_not_used(
    transport: UpstreamTransport,
) -> None:
    async def serve(conn: Conn) -> None:
        request = await conn.read_request()
        assert request is not None
        await conn.send(echo(request))  # keep-alive by default, then closed anyway
        await asyncio.sleep(0.05)

    async with Replica(serve) as replica:
        assert json.loads(await read_all(await send(transport, replica)))["connection"] == 1
        await asyncio.sleep(0.15)
        assert json.loads(await read_all(await send(transport, replica)))["connection"] == 2
    assert len(replica.requests) == 2


async def test_a_connection_closed_as_it_is_reused_is_retried_on_a_new_one(
    transport: UpstreamTransport,
) -> None:
    async def serve(conn: Conn) -> None:
        request = await conn.read_request()
        assert request is not None
        await conn.send(echo(request))
        if conn.index == 1:
            await conn.read_request()  # the reused request arrives; close without answering
        else:
            await keep_alive(echo)(conn)

    async with Replica(serve) as replica:
        await read_all(await send(transport, replica))
        body = await send(transport, replica, method="POST", body=b"again")
        seen = json.loads(await read_all(body))
    assert seen["connection"] == 2 and seen["body"] == "again"
    assert [r.connection for r in replica.requests] == [1, 1, 2]


async def test_a_connection_that_answered_in_part_is_not_retried(
    transport: UpstreamTransport,
) -> None:
    async def serve(conn: Conn) -> None:
        request = await conn.read_request()
        assert request is not None
        await conn.send(echo(request))
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\ncontent-le")  # and gone

    async with Replica(serve) as replica:
        await read_all(await send(transport, replica))
        with pytest.raises(httpx.RemoteProtocolError):
            await send(transport, replica, method="POST", body=b"once")
    assert replica.connections == 1 and len(replica.requests) == 2


async def test_an_expired_idle_connection_is_replaced() -> None:
    transport = UpstreamTransport(keepalive_expiry=0.2)
    async with Replica(keep_alive(echo)) as replica:
        assert json.loads(await read_all(await send(transport, replica)))["connection"] == 1
        assert json.loads(await read_all(await send(transport, replica)))["connection"] == 1
        await asyncio.sleep(0.4)
        assert json.loads(await read_all(await send(transport, replica)))["connection"] == 2
        await transport.aclose()
    assert replica.connections == 2


async def test_idle_connections_beyond_the_limit_are_closed() -> None:
    transport = UpstreamTransport(max_idle_per_origin=1)
    both_in = asyncio.Event()

    async def serve(conn: Conn) -> None:
        while (request := await conn.read_request()) is not None:
            if len(conn.replica.requests) == 2:
                both_in.set()
            await both_in.wait()  # the two requests overlap: two connections
            await conn.send(echo(request))

    async with Replica(serve) as replica:
        first, second = await asyncio.gather(send(transport, replica), send(transport, replica))
        await read_all(first)
        await read_all(second)
        assert transport.idle_connections(replica.origin) == 1
        await read_all(await send(transport, replica))
        await transport.aclose()
    assert replica.connections == 2


# errors ----------------------------------------------------------------------------------


async def test_a_refused_connection_is_a_connect_error(transport: UpstreamTransport) -> None:
    with pytest.raises(httpx.ConnectError):
        await transport.request(
            host="127.0.0.1",
            port=free_port(),
            method="GET",
            target="/",
            headers=[],
            body=b"",
            connect_timeout=WAIT_S,
            read_timeout=WAIT_S,
        )


async def test_a_silent_replica_is_a_read_timeout_and_is_hung_up_on(
    transport: UpstreamTransport,
) -> None:
    serve, hung_up = silent_replica()
    async with Replica(serve) as replica:
        with pytest.raises(httpx.ReadTimeout):
            await send(transport, replica, read_timeout=0.3)
        while not hung_up:
            await asyncio.sleep(0.01)
    assert hung_up == [True]


async def test_a_replica_that_stops_between_chunks_is_a_read_timeout(
    transport: UpstreamTransport,
) -> None:
    async def serve(conn: Conn) -> None:
        await conn.read_request()
        await conn.send(CHUNKED_HEAD + chunk(b"data: one\n\n"))
        await conn.client_left()

    async with Replica(serve) as replica:
        body = await send(transport, replica, read_timeout=0.3)
        pieces = aiter(body)
        assert await anext(pieces) == b"data: one\n\n"
        with pytest.raises(httpx.ReadTimeout):
            await anext(pieces)
        await body.aclose()


async def test_a_body_cut_short_is_a_protocol_error(transport: UpstreamTransport) -> None:
    async def serve(conn: Conn) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10)

    async with Replica(serve) as replica:
        body = await send(transport, replica)
        with pytest.raises(httpx.RemoteProtocolError):
            await read_all(body)
        assert transport.idle_connections(replica.origin) == 0


async def test_a_replica_that_closes_without_answering_is_a_protocol_error(
    transport: UpstreamTransport,
) -> None:
    async def serve(conn: Conn) -> None:
        await conn.read_request()

    async with Replica(serve) as replica:
        with pytest.raises(httpx.RemoteProtocolError, match="without answering"):
            await send(transport, replica)


async def test_garbage_instead_of_http_is_a_protocol_error(transport: UpstreamTransport) -> None:
    async def serve(conn: Conn) -> None:
        await conn.read_request()
        await conn.send(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await conn.client_left()

    async with Replica(serve) as replica:
        with pytest.raises(httpx.RemoteProtocolError, match="invalid HTTP response"):
            await send(transport, replica)


# through httpx -------------------------------------------------------------------------


async def test_httpx_client_gets_json_over_one_connection() -> None:
    async with (
        Replica(keep_alive(echo)) as replica,
        httpx.AsyncClient(transport=UpstreamTransport()) as client,
    ):
        first = await client.get(replica.url("/v1/models?limit=2"))
        second = await client.post(replica.url("/v1/completions"), json={"prompt": "hi"})
    assert first.status_code == 200 and first.http_version == "HTTP/1.1"
    assert first.headers["x-replica"] == "r0"
    assert first.json() == {
        "connection": 1,
        "method": "GET",
        "target": "/v1/models?limit=2",
        "host": f"127.0.0.1:{replica.port}",
        "body": "",
    }
    assert second.json()["method"] == "POST"
    assert json.loads(second.json()["body"]) == {"prompt": "hi"}
    assert replica.connections == 1
    assert replica.requests[0].header_names.count("host") == 1  # httpx's own is not repeated


async def test_httpx_client_streams_chunks_as_they_come() -> None:
    client_has_first = asyncio.Event()

    async def serve(conn: Conn) -> None:
        await conn.read_request()
        await conn.send(CHUNKED_HEAD + chunk(b"data: one\n\n"))
        await client_has_first.wait()
        await conn.send(chunk(b"data: two\n\n") + LAST_CHUNK)
        await conn.read_request()

    async with (
        Replica(serve) as replica,
        httpx.AsyncClient(transport=UpstreamTransport()) as client,
        client.stream("POST", replica.url("/v1/chat/completions"), json={"stream": True}) as res,
    ):
        assert res.status_code == 200
        assert res.headers["content-type"] == "text/event-stream"
        pieces = res.aiter_raw()
        assert await anext(pieces) == b"data: one\n\n"
        client_has_first.set()
        assert [piece async for piece in pieces] == [b"data: two\n\n"]


async def test_httpx_errors_surface_as_httpx_exceptions() -> None:
    async def silent(conn: Conn) -> None:
        await conn.read_request()
        await conn.client_left()

    async with (
        Replica(silent) as replica,
        httpx.AsyncClient(transport=UpstreamTransport()) as client,
    ):
        with pytest.raises(httpx.ReadTimeout):
            await client.get(replica.url(), timeout=httpx.Timeout(WAIT_S, read=0.3))
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{free_port()}/")
        with pytest.raises(httpx.UnsupportedProtocol):
            await client.get(f"https://127.0.0.1:{replica.port}/")


# found while writing these tests: each fails on gateway/upstream.py as it is -------------


async def test_httpx_head_request_returns_without_a_body() -> None:
    async def serve(conn: Conn) -> None:
        while (await conn.read_request()) is not None:
            await conn.send(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")  # HEAD: no body

    async with (
        Replica(serve) as replica,
        httpx.AsyncClient(transport=UpstreamTransport()) as client,
    ):
        try:
            res = await client.head(replica.url(), timeout=httpx.Timeout(WAIT_S, read=0.3))
        except httpx.ReadTimeout:
            pytest.fail(
                "the response to a HEAD request was parsed as if its "
                "content-length announced a body: client.head() waited for 5 bytes that "
                "never come"
            )
    assert res.status_code == 200 and res.content == b""


async def test_httpx_streamed_request_body_is_sent_with_one_framing() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'{"prompt": '
        yield b'"hi"}'

    async with (
        Replica(keep_alive(echo)) as replica,
        httpx.AsyncClient(transport=UpstreamTransport()) as client,
    ):
        await client.post(replica.url("/v1/completions"), content=body())
    (post,) = replica.requests
    assert "transfer-encoding" not in post.headers, (
        "a streamed httpx request body was sent with both "
        f"'transfer-encoding: {post.headers.get('transfer-encoding')}' (copied from httpx's "
        f"headers) and 'content-length: {post.headers.get('content-length')}' but unchunked "
        "bytes; a replica that honours transfer-encoding misreads the body"
    )
    assert post.body == b'{"prompt": "hi"}'


async def test_a_request_cancelled_before_its_answer_closes_the_connection(
    transport: UpstreamTransport,
) -> None:
    serve, hung_up = silent_replica()
    async with Replica(serve) as replica:
        waiting = asyncio.create_task(send(transport, replica, read_timeout=None))
        while not replica.requests:
            await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        while not hung_up:
            await asyncio.sleep(0.01)
    assert hung_up == [True], (
        "cancelling request() while it waits for the response "
        "head leaves the connection open (neither closed nor pooled), so the replica "
        "never learns that the client went away and the socket leaks"
    )


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback here")
async def test_an_ipv6_replica_gets_a_bracketed_host_header(transport: UpstreamTransport) -> None:
    async with Replica(keep_alive(echo), host="::1") as replica:
        await read_all(await send(transport, replica))
    (get,) = replica.requests
    assert get.headers["host"] == f"[::1]:{replica.port}", (
        f"an IPv6 pod IP gives 'host: {get.headers['host']}', "
        "not the bracketed form RFC 9110 requires"
    )
