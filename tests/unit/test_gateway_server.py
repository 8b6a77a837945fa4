"""The gateway's own HTTP/1.1 server (gateway/server.py) and its ASGI bridge, over
real sockets on 127.0.0.1: keep-alive, request framing and limits, pipelining,
back-pressure, disconnects cancelling the request, the graceful stop, and a
FastAPI app with its lifespan served through the bridge."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
import uvloop
from fastapi import FastAPI

from gateway import connection as server_module
from gateway.asgi_bridge import asgi_lifespan, call_asgi
from gateway.errors import server_refusal
from gateway.responder import Handler, Request, Responder
from gateway.server import GatewayServer

pytestmark = pytest.mark.timeout(15)

WAIT_S = 2.0

Answer = Handler


async def echo(request: Request, responder: Responder) -> None:
    """Answers with what it received, as JSON."""
    body = json.dumps(
        {"method": request.method, "path": request.path, "body": request.body.decode()}
    ).encode()
    responder.send_whole(200, [(b"content-type", b"application/json")], body)


@asynccontextmanager
async def serving(answer: Answer) -> AsyncIterator[tuple[GatewayServer, str]]:
    server = GatewayServer(handle=answer, refusal_body=server_refusal)
    await server.start(host="127.0.0.1", port=0)
    try:
        yield server, f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop(grace_s=0.5)


async def raw_exchange(port: int, data: bytes, *, until: bytes = b"") -> bytes:
    """Send raw bytes; read until `until` appears or the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    received = b""
    try:
        async with asyncio.timeout(WAIT_S):
            while chunk := await reader.read(65536):
                received += chunk
                if until and until in received:
                    break
    finally:
        writer.close()
    return received


async def test_keep_alive_connection_carries_many_requests() -> None:
    connections: list[int] = []

    async def answer(request: Request, responder: Responder) -> None:
        connections.append(len(server.connections))
        await echo(request, responder)

    async with serving(answer) as (server, url), httpx.AsyncClient() as client:
        for i in range(5):
            response = await client.post(f"{url}/v1/x", content=f"body {i}")
            assert response.json() == {"method": "POST", "path": "/v1/x", "body": f"body {i}"}
            assert response.headers["date"]
    assert connections == [1] * 5


async def test_a_chunked_request_body_arrives_whole() -> None:
    async def pieces() -> AsyncIterator[bytes]:
        for piece in (b"one ", b"two ", b"three"):
            yield piece

    async with serving(echo) as (_, url), httpx.AsyncClient() as client:
        response = await client.post(f"{url}/p", content=pieces())
    assert response.json()["body"] == "one two three"


async def test_streamed_answer_is_chunked_and_in_order() -> None:
    async def answer(_request: Request, responder: Responder) -> None:
        responder.start(200, [(b"content-type", b"text/event-stream")], content_length=None)
        for i in range(3):
            await responder.write(f"data: {i}\n\n".encode())
            await asyncio.sleep(0.01)
        responder.end()

    async with (
        serving(answer) as (_, url),
        httpx.AsyncClient() as client,
        client.stream("POST", f"{url}/s") as response,
    ):
        assert response.headers["transfer-encoding"] == "chunked"
        pieces = [piece async for piece in response.aiter_raw()]
    assert b"".join(pieces) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_oversized_body_is_413_in_the_openai_shape_and_never_reaches_the_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server_module, "MAX_BODY_BYTES", 1000)
    called: list[str] = []

    async def answer(request: Request, responder: Responder) -> None:
        called.append(request.path)
        await echo(request, responder)

    async with serving(answer) as (_, url), httpx.AsyncClient() as client:
        declared = await client.post(f"{url}/big", content=b"x" * 5000)

        async def undeclared() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b"y" * 500

        streamed = await client.post(f"{url}/big", content=undeclared())
    for response in (declared, streamed):
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "body_too_large"
        assert response.headers["connection"] == "close"
    assert called == []


async def test_malformed_http_is_400_and_the_connection_closes() -> None:
    async with serving(echo) as (server, _):
        received = await raw_exchange(server.port, b"NOT HTTP AT ALL\r\n\r\n")  # to EOF
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert json.loads(body)["error"]["code"] == "invalid_request"


async def test_an_oversized_head_is_431() -> None:
    async with serving(echo) as (server, _):
        big = b"x-filler: " + b"a" * (server_module.MAX_HEAD_BYTES + 10) + b"\r\n"
        received = await raw_exchange(
            server.port, b"GET / HTTP/1.1\r\nhost: x\r\n" + big + b"\r\n", until=b"}"
        )
    assert received.startswith(b"HTTP/1.1 431 ")


async def test_pipelined_requests_are_answered_in_order() -> None:
    async def answer(request: Request, responder: Responder) -> None:
        if request.path == "/slow":
            await asyncio.sleep(0.1)
        await echo(request, responder)

    async with serving(answer) as (server, _):
        requests = b"".join(
            f"POST /{p} HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\n{i}".encode()
            for i, p in enumerate(("slow", "fast", "last"))
        )
        received = await raw_exchange(server.port, requests, until=b'"/last", "body": "2"}')
    paths = [
        json.loads(part.split(b"\r\n\r\n")[1])["path"] for part in received.split(b"HTTP/1.1")[1:]
    ]
    assert paths == ["/slow", "/fast", "/last"]


async def test_expect_100_continue_is_honoured() -> None:
    async with serving(echo) as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(
            b"POST /e HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n"
        )
        async with asyncio.timeout(WAIT_S):
            interim = await reader.readuntil(b"\r\n\r\n")
        writer.write(b"hi")
        async with asyncio.timeout(WAIT_S):
            final = await reader.readuntil(b"}")
        writer.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert final.startswith(b"HTTP/1.1 200 ") and b'"body": "hi"' in final


async def test_a_client_disconnect_cancels_its_request() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def answer(_request: Request, _responder: Responder) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with serving(answer) as (server, _):
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /wait HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        async with asyncio.timeout(WAIT_S):
            await started.wait()
        writer.close()
        async with asyncio.timeout(WAIT_S):
            await cancelled.wait()


async def test_a_slow_reader_holds_back_the_writer() -> None:
    """Writes wait while the client reads nothing, so an answer is not piled up
    in the gateway's memory; they go on once the client reads."""
    written: list[int] = []
    piece = b"z" * 65536

    async def answer(_request: Request, responder: Responder) -> None:
        responder.start(200, [], content_length=None)
        for i in range(400):  # 26 MB: more than the socket buffers take
            await responder.write(piece)
            written.append(i)
        responder.end()

    async with serving(answer) as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /big HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        await asyncio.sleep(0.5)
        held_at = len(written)
        assert 0 < held_at < 400, "the writer neither started nor waited"
        async with asyncio.timeout(10):
            while not (await reader.read(1 << 20)).endswith(b"0\r\n\r\n"):
                pass
        total = len(written)
        writer.close()
    assert total == 400


async def test_stop_lets_requests_in_flight_finish_and_refuses_new_connections() -> None:
    release = asyncio.Event()

    async def answer(request: Request, responder: Responder) -> None:
        await release.wait()
        await echo(request, responder)

    server = GatewayServer(handle=answer, refusal_body=server_refusal)
    await server.start(host="127.0.0.1", port=0)
    url = f"http://127.0.0.1:{server.port}"
    async with httpx.AsyncClient() as client:
        in_flight = asyncio.create_task(client.post(f"{url}/a", content=b"1"))
        await asyncio.sleep(0.1)
        stopping = asyncio.create_task(server.stop(grace_s=WAIT_S))
        await asyncio.sleep(0.1)
        with pytest.raises(httpx.ConnectError):
            await client.post(f"{url}/b", content=b"2")  # a new connection is refused
        release.set()
        response = await in_flight
        await stopping
    assert response.status_code == 200 and response.headers["connection"] == "close"


async def test_fastapi_routes_and_lifespan_run_through_the_bridge() -> None:
    events: list[str] = []

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        events.append("startup")
        yield
        events.append("shutdown")

    app = FastAPI(lifespan=lifespan)

    @app.get("/items/{item}")
    async def item(item: str, q: str = "") -> dict[str, str]:
        return {"item": item, "q": q}

    async def answer(request: Request, responder: Responder) -> None:
        await call_asgi(app, request, responder)

    async with asgi_lifespan(app):
        assert events == ["startup"]
        async with serving(answer) as (_, url), httpx.AsyncClient() as client:
            found = await client.get(f"{url}/items/a%20b?q=1")
            missing = await client.get(f"{url}/nothing")
    assert events == ["startup", "shutdown"]
    assert found.json() == {"item": "a b", "q": "1"}
    assert missing.status_code == 404


async def test_an_http10_client_gets_a_stream_ended_by_the_close() -> None:
    async def answer(_request: Request, responder: Responder) -> None:
        responder.start(200, [], content_length=None)
        await responder.write(b"part one, ")
        await responder.write(b"part two")
        responder.end()

    async with serving(answer) as (server, _):
        received = await raw_exchange(server.port, b"POST /s HTTP/1.0\r\ncontent-length: 0\r\n\r\n")
    head, _, body = received.partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head.lower() and b"connection: close" in head.lower()
    assert body == b"part one, part two"


@pytest.mark.parametrize("target", [b"http://gw.example", b"http://gw.example?x=1", b"/a?b=c"])
async def test_every_request_target_form_is_answered(target: bytes) -> None:
    async with serving(echo) as (server, _):
        received = await raw_exchange(
            server.port, b"GET " + target + b" HTTP/1.1\r\nhost: x\r\n\r\n", until=b"}"
        )
    assert received.startswith(b"HTTP/1.1 200 ")


async def test_an_unparsable_target_or_a_missing_host_is_400() -> None:
    async with serving(echo) as (server, _):
        bad_target = await raw_exchange(
            server.port, b"GET http://h:99999/ HTTP/1.1\r\nhost: x\r\n\r\n"
        )
        no_host = await raw_exchange(server.port, b"GET / HTTP/1.1\r\n\r\n")
    assert bad_target.startswith(b"HTTP/1.1 400 ") and no_host.startswith(b"HTTP/1.1 400 ")


async def test_an_upgrade_request_is_answered_in_http11() -> None:
    """curl --http2 on http:// asks for h2c; the gateway ignores the upgrade."""
    async with serving(echo) as (server, _):
        received = await raw_exchange(
            server.port,
            b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings\r\n"
            b"upgrade: h2c\r\nhttp2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
            until=b"}",
        )
    assert received.startswith(b"HTTP/1.1 200 ") and b'"/v1/models"' in received


async def test_100_continue_waits_for_the_answer_being_written() -> None:
    async def answer(request: Request, responder: Responder) -> None:
        if request.path == "/first":
            responder.start(200, [], content_length=20)
            await responder.write(b"0123456789")
            await asyncio.sleep(0.3)
            await responder.write(b"abcdefghij")
            responder.end()
        else:
            await echo(request, responder)

    async with serving(answer) as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /first HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        await asyncio.sleep(0.1)
        writer.write(
            b"POST /second HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n"
        )
        async with asyncio.timeout(WAIT_S):
            first = await reader.readuntil(b"abcdefghij")
            interim = await reader.readuntil(b"\r\n\r\n")
        writer.write(b"hi")
        async with asyncio.timeout(WAIT_S):
            second = await reader.readuntil(b"}")
        writer.close()
    assert first.endswith(b"\r\n\r\n0123456789abcdefghij")
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n" and b'"body": "hi"' in second


async def test_an_endless_header_is_refused_before_it_ends() -> None:
    async with serving(echo) as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-endless: ")
        with contextlib.suppress(ConnectionError):
            for _ in range(64):  # 4 MiB of one header value, never ended
                writer.write(b"a" * 65536)
                await writer.drain()
        async with asyncio.timeout(WAIT_S):
            received = await reader.read(100)
        writer.close()
    assert received.startswith(b"HTTP/1.1 431 ")


async def test_a_pipelining_client_that_reads_nothing_piles_up_neither_requests_nor_answers() -> (
    None
):
    async def answer(_request: Request, responder: Responder) -> None:
        responder.send_whole(200, [], b"m" * 16384)

    async with serving(answer) as (server, _):
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        for _ in range(10):
            writer.write(b"GET /m HTTP/1.1\r\nhost: x\r\n\r\n" * 1000)
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
        (connection,) = server.connections
        assert connection.transport is not None
        buffered = connection.transport.get_write_buffer_size()
        queued = len(connection._pending)
        writer.transport.abort()
    assert buffered < 1 << 20, f"{buffered} bytes of answers buffered"
    assert queued < 256, f"{queued} requests queued"


async def test_a_client_that_stops_reading_is_dropped_after_the_drain_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server_module, "DRAIN_TIMEOUT_S", 0.5)

    async def answer(_request: Request, responder: Responder) -> None:
        responder.start(200, [], content_length=None)
        while True:
            await responder.write(b"z" * 65536)

    async with serving(answer) as (server, _):
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.sleep(1.5)
        left = len(server.connections)
        writer.transport.abort()
    assert left == 0


@pytest.mark.parametrize("extra", [b"\r\n", b"GET /next HTTP/1.1\r\n"])
async def test_the_arrival_deadline_spares_an_answer_in_flight(
    monkeypatch: pytest.MonkeyPatch, extra: bytes
) -> None:
    monkeypatch.setattr(server_module, "REQUEST_ARRIVAL_S", 0.5)

    async def answer(_request: Request, responder: Responder) -> None:
        responder.start(200, [], content_length=None)
        for i in range(5):
            await responder.write(b"data: %d\n\n" % i)
            await asyncio.sleep(0.5)
        responder.end()

    async with serving(answer) as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /s HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        await asyncio.sleep(0.2)
        writer.write(extra)  # a stray line end, or the start of a next request
        async with asyncio.timeout(5):
            received = await reader.readuntil(b"0\r\n\r\n")
        writer.close()
    assert b"data: 4" in received


async def test_a_request_that_stops_arriving_is_408(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "REQUEST_ARRIVAL_S", 0.5)
    async with serving(echo) as (server, _):
        received = await raw_exchange(
            server.port, b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc"
        )
    assert received.startswith(b"HTTP/1.1 408 ")


async def test_a_client_still_uploading_reads_its_413() -> None:
    async def upload() -> AsyncIterator[bytes]:
        for _ in range(24):  # 24 MiB at about 10 MiB/s: still sending long after the 413
            yield b"x" * (1 << 20)
            await asyncio.sleep(0.1)

    async with serving(echo) as (_, url), httpx.AsyncClient(timeout=30) as client:
        response = await client.post(f"{url}/v1/chat/completions", content=upload())
    assert response.status_code == 413


async def test_bodiless_statuses_carry_no_framing() -> None:
    async def answer(request: Request, responder: Responder) -> None:
        responder.send_whole(204 if request.path == "/204" else 304, [], b"")

    async with serving(answer) as (server, _):
        received = await raw_exchange(
            server.port,
            b"GET /204 HTTP/1.1\r\nhost: x\r\n\r\nGET /304 HTTP/1.1\r\nhost: x\r\n\r\n",
            until=b"HTTP/1.1 304 Not Modified\r\n",
        )
        await asyncio.sleep(0.1)
    assert b"content-length" not in received and b"transfer-encoding" not in received


async def test_stop_drops_a_client_that_reads_nothing() -> None:
    async def answer(_request: Request, responder: Responder) -> None:
        responder.start(200, [], content_length=None)
        while True:
            await responder.write(b"z" * 65536)

    server = GatewayServer(handle=answer, refusal_body=server_refusal)
    await server.start(host="127.0.0.1", port=0)
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    await asyncio.sleep(0.3)
    async with asyncio.timeout(WAIT_S + 2):
        await server.stop(grace_s=0.5)
    assert not server.connections
    writer.transport.abort()


@pytest.mark.parametrize(
    "check",
    [
        test_keep_alive_connection_carries_many_requests,
        test_streamed_answer_is_chunked_and_in_order,
        test_a_client_disconnect_cancels_its_request,
        test_a_slow_reader_holds_back_the_writer,
        test_an_endless_header_is_refused_before_it_ends,
        test_a_pipelining_client_that_reads_nothing_piles_up_neither_requests_nor_answers,
        test_stop_drops_a_client_that_reads_nothing,
    ],
    ids=lambda check: check.__name__.removeprefix("test_"),
)
def test_on_uvloop_too(check: Callable[[], Awaitable[None]]) -> None:
    """The gateway runs on uvloop, whose transports differ in details (a write to a
    closed one raises, for one); the unit tests above run on asyncio's own loop."""

    async def run() -> None:
        await check()

    uvloop.run(run())


async def test_a_failing_startup_stops_the_gateway_with_its_reason() -> None:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        raise RuntimeError("temporal is unreachable")
        yield  # pragma: no cover

    with pytest.raises(RuntimeError, match="temporal is unreachable"):
        async with asgi_lifespan(FastAPI(lifespan=lifespan)):
            pass
