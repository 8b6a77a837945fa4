"""Every read of a pod has a total deadline and a byte cap (issue 25, item 6), shown
against a local server that drips its answer a byte at a time (each byte well
within any per-read timeout, the whole far past the deadline) or sends too much:
the worker's `/slots` activity, the gateway's helper for `/metrics` polls and
`/readyz` probes, its backend-load poll, and the upstream transport's response head
all fail with a typed error at their deadline, and the worker answers None as for a
pod that does not answer.

"At the deadline" is shown by counting, not timing: the pod drips on the event loop
that runs the reader's deadline, so when the reader gives up the pod has dripped the
bytes due before the deadline (a busy machine slows the drip, it never speeds it up),
and not the rest of an answer it would take far longer to send."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

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
# Dripped by the deadline: the bytes at 0, 0.2 and 0.4 s after the request came in.
# CLOSING more may go while the reader closes on a busy machine (the 0.4 s of slack
# this test allowed when it timed the read); a reader that gave up more than a second
# after the request lets more through, one without a total deadline the whole answer.
DUE_BY_DEADLINE = int(DEADLINE_S / DRIP_S) + 1
CLOSING = 2
BIG = 3 * 1024 * 1024
DRIPPED_HEAD = b"HTTP/1.1 200 OK\r\nx-slow: " + b"a" * 100 + b"\r\n\r\n"
DRIPPED_BODY = b"x" * 1000
SLOTS = b'[{"id":0,"is_processing":true},{"id":1,"is_processing":false}]'


@dataclass
class Pod:
    port: int
    dripped: list[int] = field(default_factory=list)  # bytes sent, per dripped answer

    def gave_up_in_time(self, answer_bytes: int) -> None:
        """The last dripped answer was given up on at its deadline: with only the
        bytes due by then sent, far from the whole answer."""
        assert self.dripped, "nothing was dripped"
        sent = self.dripped[-1]
        assert sent < answer_bytes, "read to the end: no total deadline"
        assert sent <= DUE_BY_DEADLINE + CLOSING, f"{sent} bytes dripped before it gave up"


async def _drip(writer: asyncio.StreamWriter, data: bytes, *, pod: Pod) -> None:
    pod.dripped.append(0)
    for byte in data:
        writer.write(bytes([byte]))
        await writer.drain()
        pod.dripped[-1] += 1
        await asyncio.sleep(DRIP_S)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, pod: Pod) -> None:
    """Paths starting `/drip` drip a 200 answer's body, `/drip-head` its head; `/big`
    sends BIG bytes with a length, `/big-chunked` without, `/big-head` a head of BIG
    bytes; anything else is llama-server's `/slots`. (A test puts the prefix in the
    pod's address to reach it through code that builds the rest of the URL.)"""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split(b" ")[1]
        if path.startswith(b"/drip-head"):
            await _drip(writer, DRIPPED_HEAD, pod=pod)
        elif path.startswith(b"/drip"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(DRIPPED_BODY))
            await _drip(writer, DRIPPED_BODY, pod=pod)
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
            # one answer a connection: a kept connection would carry the next request
            # to a pod that no longer reads it
            writer.write(
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
                % (len(SLOTS), SLOTS)
            )
        await writer.drain()
        await reader.read()  # until the client hangs up
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


@asynccontextmanager
async def pod() -> AsyncIterator[Pod]:
    served = Pod(port=free_port())
    server = await asyncio.start_server(
        functools.partial(_answer, pod=served), "127.0.0.1", served.port
    )
    try:
        yield served
    finally:
        server.close()


async def test_the_gateways_pod_reads_have_a_total_deadline_and_a_byte_cap() -> None:
    async with pod() as served, httpx.AsyncClient(timeout=5) as plain:
        http = httpx.AsyncClient(transport=UpstreamTransport(), timeout=5)
        for client in (plain, http):  # whatever transport carries it
            url = f"http://127.0.0.1:{served.port}"
            with pytest.raises(bounded.PodReadTimeout):
                await bounded.read_pod(client, f"{url}/drip/metrics", deadline_s=DEADLINE_S)
            served.gave_up_in_time(len(DRIPPED_BODY))
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
    assert POLL_TIMEOUT_S == DEADLINE_S, "the drip's bytes due by the deadline assume it"
    async with pod() as served:
        http = httpx.AsyncClient(transport=UpstreamTransport(), timeout=5)
        endpoint = Endpoint(pod="p", ip=f"127.0.0.1:{served.port}/drip", slots=4)  # path in the ip
        endpoint.others = 7
        await poll_one(http, endpoint, port=served.port)
        served.gave_up_in_time(len(DRIPPED_BODY))
        await http.aclose()
    assert endpoint.others == 7  # nothing read, nothing concluded


async def test_a_replicas_response_head_has_a_total_deadline_and_a_size_cap() -> None:
    async with pod() as served:
        transport = UpstreamTransport()
        port = served.port

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

        with pytest.raises(ResponseHeadTimeout):
            await request("/drip-head/completion")
        served.gave_up_in_time(len(DRIPPED_HEAD))
        with pytest.raises(ResponseHeadTooLarge):
            await request("/big-head/completion")
        await request("/slots")  # a sane head still passes
        await transport.aclose()


async def test_the_workers_slots_read_has_a_total_deadline_and_a_byte_cap() -> None:
    async with pod() as served, httpx.AsyncClient(timeout=3.0) as http:
        port = served.port
        llama = LlamaServerActivities(
            http=http, api=k8s.ApiClient(), deadline_s=DEADLINE_S, max_bytes=BIG // 2
        )
        assert await llama.count_busy(f"http://127.0.0.1:{port}/slots") == 1

        def at(prefix: str) -> str:
            return f"http://127.0.0.1:{port}{prefix}/slots"

        assert await llama.count_busy(at("/drip")) is None
        served.gave_up_in_time(len(DRIPPED_BODY))
        assert await llama.count_busy(at("/big")) is None
        assert await llama.count_busy(at("/big-chunked")) is None
        with pytest.raises(bounded.PodReadTimeout):
            await bounded.read_pod(
                http, f"http://127.0.0.1:{port}/drip/slots", deadline_s=DEADLINE_S, max_bytes=BIG
            )
        served.gave_up_in_time(len(DRIPPED_BODY))
        with pytest.raises(bounded.PodAnswerTooLarge):
            await bounded.read_pod(
                http, f"http://127.0.0.1:{port}/big/slots", deadline_s=5, max_bytes=BIG // 2
            )
