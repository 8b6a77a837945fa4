"""What the public port must hold whatever HTTP server runs it (issue 12, item 2),
over real sockets on 127.0.0.1: trailers never pass for headers and are bounded,
an endless header or trailer value is refused while the operational port keeps
answering, a body sent in 1-byte chunks is refused after a bounded number of chunks
and costs about its size, a transfer coding other than `chunked` is refused, and so
are request lines and `Host` fields RFC 9112 calls invalid. Some of these granian
(hyper) already refuses itself; those tests document it, so a change of server cannot
lose them. How long the operational port's answers wait meanwhile (the event loop
never stalls) is a matter of speed, measured in tests/bench/bench_gateway_hostile.py."""

from __future__ import annotations

import asyncio
import json
import re
import time
import tracemalloc
from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.transport.framing import FREE_PIECES, MIN_PIECE_BYTES
from tests.unit.test_gateway_http import Gateway, completion, raw, running_gateway

pytestmark = pytest.mark.timeout(60)

CHUNKED_HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def status_of(answer: bytes) -> int:
    """The status of an HTTP/1.x answer; 0 when nothing (or no HTTP) came back."""
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else 0


def error_code(answer: bytes) -> str | None:
    code: str | None = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"]
    return code


class HealthProbe:
    """Asks the operational port's /healthz over and over, each answer a 200, and
    keeps the count and the slowest answer (the event loop's responsiveness while
    something else happens, which the benchmark reports)."""

    def __init__(self, gw: Gateway) -> None:
        self.url = f"{gw.ops_url}/healthz"
        self.slowest = 0.0
        self.answered = 0

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            while True:
                started = time.monotonic()
                assert (await http.get(self.url)).status_code == 200
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.answered += 1
                await asyncio.sleep(0.02)

    async def answers_again(self, *, within_s: float = 5) -> None:
        """Wait for one more answer than so far, so the probe's answers span what the
        test did before (a refusal can end before the probe's first request does)."""
        seen = self.answered
        async with asyncio.timeout(within_s):
            while self.answered <= seen:
                await asyncio.sleep(0.01)


def complete(answer: bytes) -> bool:
    """A whole answer with a Content-Length is in (a kept connection stays open)."""
    head, found, body = answer.partition(b"\r\n\r\n")
    for line in head.lower().split(b"\r\n"):
        if found and line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


async def send_slowly(url: str, pieces: AsyncIterator[bytes], *, wait_s: float = 10) -> bytes:
    """Write `pieces` as the peer reads them, as a client would until an answer comes
    back, and collect the answer until it is complete or the connection closes (a
    timeout is an AssertionError: the gateway must end such a request). A write into a connection
    the gateway closed ends the sending, not the reading."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    answered = asyncio.Event()

    async def send() -> None:
        try:
            async for piece in pieces:
                if answered.is_set():
                    return
                writer.write(piece)
                await writer.drain()
        except ConnectionError:
            pass

    sending = asyncio.create_task(send())
    received = b""
    try:
        async with asyncio.timeout(wait_s):
            while not complete(received) and (data := await reader.read(65536)):
                received += data
                answered.set()
    except ConnectionError:
        pass
    except TimeoutError:
        raise AssertionError(f"no end within {wait_s}s; received {received[:200]!r}") from None
    finally:
        sending.cancel()
        writer.close()
    return received


async def repeated(head: bytes, piece: bytes, *, times: int) -> AsyncIterator[bytes]:
    yield head
    for _ in range(times):
        yield piece


async def one_byte_chunks(body: bytes) -> AsyncIterator[bytes]:
    yield CHUNKED_HEAD
    for start in range(0, len(body), 1024):  # 1024 chunks of one byte per write
        yield b"".join(chunk(body[i : i + 1]) for i in range(start, min(start + 1024, len(body))))
    yield b"0\r\n\r\n"


async def test_trailer_fields_are_refused_and_never_reach_a_replica() -> None:
    body = json.dumps(completion()).encode()
    async with running_gateway() as gw:
        plain = await raw(gw.url, CHUNKED_HEAD + chunk(body) + b"0\r\n\r\n", wait_s=1)
        assert status_of(plain) == 200  # chunked without trailers is proxied
        assert gw.replica.requests == [completion()]
        trailed = CHUNKED_HEAD + chunk(body) + b"0\r\nx-request-id: smuggled\r\nhost: evil\r\n\r\n"
        answer = await raw(gw.url, trailed)
        assert status_of(answer) == 400 and error_code(answer) == "bad_request", answer
        assert b"connection: close" in answer.lower()
        assert gw.replica.requests == [completion()], "a request with trailers never goes on"


async def test_trailers_count_against_a_limit_while_the_ops_port_answers() -> None:
    """8 MiB of trailer fields, then one 8 MiB trailer value: both refused long before
    their end (hyper keeps at most 16 KiB of trailers), while /healthz answers."""
    body = json.dumps(completion()).encode()
    field = b"x-trailer: " + b"t" * 1000 + b"\r\n"
    async with running_gateway() as gw:
        probe = HealthProbe(gw)
        probing = asyncio.create_task(probe.run())
        try:
            many = await send_slowly(
                gw.url,
                repeated(CHUNKED_HEAD + chunk(body) + b"0\r\n", field * 64, times=128),
            )
            endless = await send_slowly(
                gw.url,
                repeated(CHUNKED_HEAD + chunk(body) + b"0\r\nx-big: ", b"v" * 65536, times=128),
            )
            await probe.answers_again()
        finally:
            probing.cancel()
        for answer in (many, endless):
            assert status_of(answer) == 400 and error_code(answer) == "bad_request", answer[:300]
        assert gw.replica.requests == []
        assert probe.answered > 0


async def test_an_endless_header_value_is_refused_while_the_ops_port_answers() -> None:
    """granian answers 431 once the head passes its buffer limit and closes the
    connection at once: a client still writing then gets a reset, which on Linux
    discards the 431 it had not read yet. The app never sees such a request, so the
    gateway cannot linger there; what it guarantees is the quick end and a free loop."""
    async with running_gateway() as gw:
        probe = HealthProbe(gw)
        probing = asyncio.create_task(probe.run())
        try:
            head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-big: "
            answer = await send_slowly(gw.url, repeated(head, b"v" * 65536, times=128))
            await probe.answers_again()
        finally:
            probing.cancel()
        assert status_of(answer) in (0, 431), answer[:300]
        assert gw.replica.requests == []
        assert probe.answered > 0


async def test_a_body_in_one_byte_chunks_costs_about_its_size() -> None:
    """A small body in 1-byte chunks is proxied whole; an 8 MiB one is refused early
    (each chunk is a frame the event loop handles), and neither costs more than a
    small multiple of its size in Python memory."""
    body = json.dumps(completion(prompt="p" * 800)).encode()  # under FREE_PIECES bytes
    async with running_gateway() as gw:
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            small = await send_slowly(gw.url, one_byte_chunks(body), wait_s=5)
            assert status_of(small) == 200, small[:300]
            assert gw.replica.requests == [json.loads(body)]
            tracemalloc.reset_peak()
            big = await send_slowly(
                gw.url, repeated(CHUNKED_HEAD, b"1\r\na\r\n" * 10922, times=768), wait_s=20
            )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert status_of(big) == 400 and error_code(big) == "bad_request", big[:300]
        # refused at the first chunk past the allowance: ~1,000 chunks read (each one
        # an await on the loop), not the 8 Mi the client would send
        said = re.search(rb"came in (\d+) chunks for (\d+) bytes", big)
        assert said, big[:300]
        chunks, carried = int(said[1]), int(said[2])
        assert chunks == FREE_PIECES + carried // MIN_PIECE_BYTES + 1, (chunks, carried)
        assert peak < 32 * 1024 * 1024, f"peak Python memory {peak / 2**20:.1f} MiB"
        assert len(gw.replica.requests) == 1


async def test_transfer_codings_other_than_chunked_are_refused() -> None:
    body = json.dumps(completion()).encode()
    cases = {
        # coding(s) as sent -> what RFC 9112 allows: 501 for a coding the gateway does
        # not implement, 400 for a framing that is not exactly one final `chunked`
        b"transfer-encoding: gzip, chunked\r\n": {501},
        b"transfer-encoding: chunked, chunked\r\n": {400},
        b"transfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n": {400, 501},
        b"transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n": {400},
        b"transfer-encoding: gzip\r\n": {400, 501},  # granian: 400 (not chunked last)
        b"transfer-encoding: identity\r\n": {400, 501},  # granian: 400
    }
    async with running_gateway() as gw:
        for coding, allowed in cases.items():
            head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n" + coding + b"\r\n"
            answer = await raw(gw.url, head + chunk(body) + b"0\r\n\r\n", wait_s=2)
            assert status_of(answer) in allowed, (coding, answer[:300])
        mixed_case = (
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: Chunked\r\n"
        )
        answer = await raw(gw.url, mixed_case + b"\r\n" + chunk(body) + b"0\r\n\r\n", wait_s=1)
        assert status_of(answer) == 200, "coding names are case-insensitive (RFC 9112 §7)"
        assert gw.replica.requests == [completion()]


async def test_invalid_request_lines_and_host_fields_are_400() -> None:
    async with running_gateway() as gw:
        for request in (
            b"GET /v1/models HTTP/2.0\r\nhost: x\r\n\r\n",  # granian: 400
            b"GET /v1/models\r\n\r\n",  # HTTP/0.9, granian: 400
            b"GET /v1/models HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\nhost: a\r\nhost: a\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
            b"POST /v1/completions HTTP/1.1\r\nhost: a\r\nHost: b\r\ncontent-length: 2\r\n\r\n{}",
        ):
            answer = await raw(gw.url, request, wait_s=1)
            assert status_of(answer) == 400, (request, answer[:300])
        http10 = await raw(gw.url, b"GET /v1/models HTTP/1.0\r\n\r\n", wait_s=1)
        assert status_of(http10) == 200, "HTTP/1.0 needs no Host"
        assert gw.replica.requests == []
