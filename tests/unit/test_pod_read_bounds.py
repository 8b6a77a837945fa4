"""Every read of a pod has a total deadline and a byte cap (issue 25, item 6), shown
against a local server that drips its answer a byte at a time (each byte well
within any per-read timeout, the whole far past the deadline) or sends too much:
the worker's `/slots` activity, the gateway's helper for `/metrics` polls and
`/readyz` probes, its backend-load poll, and the upstream transport's response head
all fail in bounded time with a typed error, and the worker answers None as for a
pod that does not answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from kubernetes import client as k8s

from activities import pod_reads as bounded
from activities.llama_server import LlamaServerActivities
from gateway.backend_load import POLL_TIMEOUT_S, poll_one
from gateway.registry import Endpoint
from gateway.transport.upstream import (
    ResponseHeadTimeout,
    ResponseHeadTooLarge,
    UpstreamTransport,
)
from kamadev.processes import free_port

pytestmark = pytest.mark.timeout(30)

DRIP_S = 0.2  # between two bytes: far within a per-read timeout
DEADLINE_S = 0.5
SLACK_S = 0.4  # scheduling on a loaded machine
BIG = 3 * 1024 * 1024
SLOTS = b'[{"id":0,"is_processing":true},{"id":1,"is_processing":false}]'


async def _drip(writer: asyncio.StreamWriter, data: bytes) -> None:
    for byte in data:
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(DRIP_S)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Paths starting `/drip` drip a 200 answer's body, `/drip-head` its head; `/big`
    sends BIG bytes with a length, `/big-chunked` without, `/big-head` a head of BIG
    bytes; anything else is llama-server's `/slots`. (A test puts the prefix in the
    pod's address to reach it through code that builds the rest of the URL.)"""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split(b" ")[1]
        if path.startswith(b"/drip-head"):
            await _drip(writer, b"HTTP/1.1 200 OK\r\nx-slow: " + b"a" * 100 + b"\r\n\r\n")
        elif path.startswith(b"/drip"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
            await _drip(writer, b"x" * 1000)
        elif path.startswith(b"/big-chunked"):
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(BIG // 65536):
                writer.write(b"10000\r\n" + b"x" * 65536 + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        elif path.startswith(b"/big-head"):
            writer.write(b"HTTP/1.1 200 OK\r\n" + b"x-big: " + b"a" * BIG + b"\r\n\r\n")
        elif path.startswith(b"/big"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % BIG + b"x" * BIG)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(SLOTS), SLOTS))
        await writer.drain()
        await reader.read()  # until the client hangs up
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


@asynccontextmanager
async def pod() -> AsyncIterator[int]:
    port = free_port()
    server = await asyncio.start_server(_answer, "127.0.0.1", port)
    try:
        yield port
    finally:
        server.close()


async def timed(coroutine: object) -> float:
    started = time.monotonic()
    await coroutine  # type: ignore[misc]
    return time.monotonic() - started


async def test_the_gateways_pod_reads_have_a_total_deadline_and_a_byte_cap() -> None:
    async with pod() as port, httpx.AsyncClient(timeout=5) as plain:
        http = httpx.AsyncClient(transport=UpstreamTransport(), timeout=5)
        for client in (plain, http):  # whatever transport carries it
            url = f"http://127.0.0.1:{port}"
            started = time.monotonic()
            with pytest.raises(bounded.PodReadTimeout):
                await bounded.read_pod(client, f"{url}/drip/metrics", deadline_s=DEADLINE_S)
            assert time.monotonic() - started < DEADLINE_S + SLACK_S
            with pytest.raises(bounded.PodAnswerTooLarge):
                await bounded.read_pod(
                    client, f"{url}/big/metrics", deadline_s=5, max_bytes=BIG // 2
                )
            with pytest.raises(bounded.PodAnswerTooLarge):
                await bounded.read_pod(
                    client, f"{url}/big-chunked/metrics", deadline_s=5, max_bytes=BIG // 2
                )
            answer = await bounded.read_pod(client, f"{url}/slots", deadline_s=DEADLINE_S)
            assert answer.status == 200 and answer.body == SLOTS
        await http.aclose()


async def test_a_dripping_replica_costs_the_backend_poll_only_its_deadline() -> None:
    async with pod() as port:
        http = httpx.AsyncClient(transport=UpstreamTransport(), timeout=5)
        endpoint = Endpoint(pod="p", ip=f"127.0.0.1:{port}/drip", slots=4)  # path in the ip
        endpoint.others = 7
        took = await timed(poll_one(http, endpoint, port=port))
        await http.aclose()
    assert took < POLL_TIMEOUT_S + SLACK_S
    assert endpoint.others == 7  # nothing read, nothing concluded


async def test_a_replicas_response_head_has_a_total_deadline_and_a_size_cap() -> None:
    async with pod() as port:
        transport = UpstreamTransport()

        async def request(target: str) -> None:
            answer = await transport.request(
                host="127.0.0.1",
                port=port,
                method="GET",
                target=target,
                headers=[],
                body=b"",
                connect_timeout=1,
                read_timeout=DEADLINE_S,  # a byte every DRIP_S never trips a per-read timeout
            )
            await answer.aclose()

        started = time.monotonic()
        with pytest.raises(ResponseHeadTimeout):
            await request("/drip-head/completion")
        assert time.monotonic() - started < DEADLINE_S + SLACK_S
        with pytest.raises(ResponseHeadTooLarge):
            await request("/big-head/completion")
        await request("/slots")  # a sane head still passes
        await transport.aclose()


async def test_the_workers_slots_read_has_a_total_deadline_and_a_byte_cap() -> None:
    async with pod() as port, httpx.AsyncClient(timeout=3.0) as http:
        llama = LlamaServerActivities(
            http=http, api=k8s.ApiClient(), deadline_s=DEADLINE_S, max_bytes=BIG // 2
        )
        assert await llama.count_busy(f"http://127.0.0.1:{port}/slots") == 1

        def at(prefix: str) -> str:
            return f"http://127.0.0.1:{port}{prefix}/slots"

        started = time.monotonic()
        assert await llama.count_busy(at("/drip")) is None
        assert time.monotonic() - started < DEADLINE_S + SLACK_S
        assert await llama.count_busy(at("/big")) is None
        assert await llama.count_busy(at("/big-chunked")) is None
        with pytest.raises(bounded.PodReadTimeout):
            await bounded.read_pod(
                http, f"http://127.0.0.1:{port}/drip/slots", deadline_s=DEADLINE_S, max_bytes=BIG
            )
        with pytest.raises(bounded.PodAnswerTooLarge):
            await bounded.read_pod(
                http, f"http://127.0.0.1:{port}/big/slots", deadline_s=5, max_bytes=BIG // 2
            )
