"""Clients that read slowly cannot make the gateway hold their answers (issue 41, item
2), over real sockets on 127.0.0.1 against the real front (granian, RSGI): a stream
waits for its slow reader, so its replica's answer waits in the replica's socket and
the gateway's memory stays flat however many slow readers there are; what a
back-pressured client reads is the replica's answer byte for byte; past the
gateway-wide budget the connections owing most are aborted, and a request past the
answer deadline is ended with 504."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest

from gateway.held import GatewayLimits
from kamadev.processes import free_port
from tests.unit.test_gateway_memory_bounds import (
    Replica,
    completion,
    eventually,
    gateway_process,
    rss_bytes,
    running_gateway,
)

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024
PIECE = 256 * 1024


@dataclass
class StreamingReplica(Replica):
    """The memory tests' fake llama-server, whose completion is a JSON document of
    `answer_bytes`, declared by its content-length and written in pieces of `PIECE`,
    each once the previous one left its socket's buffer; `written` counts what it
    could write, per answer."""

    written: list[int] = field(default_factory=list)

    def body(self) -> bytes:
        return b'{"text":"' + bytes(range(97, 123)) * ((self.answer_bytes - 11) // 26) + b'"}'

    async def answer(self, writer: asyncio.StreamWriter) -> None:
        body = self.body()
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body)
        )
        number = len(self.written)
        self.written.append(0)
        for start in range(0, len(body), PIECE):
            writer.write(body[start : start + PIECE])
            await writer.drain()
            self.written[number] += len(body[start : start + PIECE])


def request_bytes(**extra: object) -> bytes:
    body = json.dumps(completion(**extra)).encode()
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )


def slow_client(port: int, *, rate: int, seconds: float, got: list[int], number: int) -> None:
    """Ask for a completion and read its answer at `rate` bytes/s for `seconds`."""
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.bind((f"127.0.3.{1 + number}", 0))
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.sendall(request_bytes())
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            data = sock.recv(rate // 10)
            if not data:
                break
            got[number] += len(data)
            time.sleep(0.1)
    except OSError:
        pass
    finally:
        sock.close()


async def test_slow_readers_of_large_answers_leave_the_gateway_flat() -> None:
    """Eight clients reading 64 MiB answers at 160 KiB/s for 6 s: without back-pressure
    the gateway would take each whole answer from its replica at once (512 MiB)."""
    readers, answer = 8, 64 * MiB
    replica, replica_port = StreamingReplica(answer_bytes=answer), free_port()
    await replica.listen(replica_port)
    limits = {"client_write_timeout_s": 0.0, "slots": readers}
    try:
        async with gateway_process(replica_port=replica_port, limits=limits) as gateway:
            await asyncio.sleep(0.5)
            idle = rss_bytes(gateway.process.pid)
            got = [0] * readers
            threads = [
                threading.Thread(
                    target=slow_client,
                    args=(gateway.port,),
                    kwargs={"rate": 160 * 1024, "seconds": 6.0, "got": got, "number": n},
                    daemon=True,
                )
                for n in range(readers)
            ]
            for thread in threads:
                thread.start()
            peak = idle
            while any(t.is_alive() for t in threads):
                peak = max(peak, rss_bytes(gateway.process.pid))
                await asyncio.sleep(0.05)
            written = sum(replica.written)
            print(
                f"idle RSS {idle / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB; replicas wrote "
                f"{written / MiB:.0f} MiB, clients read {sum(got) / MiB:.1f} MiB"
            )
            assert len(replica.written) == readers
            assert all(g > 0 for g in got)  # every slow reader was served as it read
            # each stream ran ahead of its reader by its 4 MiB budget and the sockets'
            # buffers, not by its whole answer
            assert written < readers * 16 * MiB, f"the replicas wrote {written / MiB:.0f} MiB"
            assert peak - idle < 96 * MiB, f"grew by {(peak - idle) / MiB:.0f} MiB"
    finally:
        replica.close()


async def test_a_back_pressured_answer_arrives_whole_once_read() -> None:
    """A client that pauses for a second, then reads: the stream waited for it (its
    replica wrote little more than the budget meanwhile) and what it reads is the
    replica's answer, byte for byte."""
    limits = GatewayLimits(client_write_timeout_s=0.0, max_unread_bytes_per_connection=2 * MiB)
    async with running_gateway(limits=limits) as gw:
        gw.replica.close()
        replica = StreamingReplica(answer_bytes=32 * MiB)
        await replica.listen(gw.replica_port)
        host, port = gw.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 16)
        writer.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_RCVBUF, 16384
        )
        writer.write(request_bytes())
        await eventually(lambda: replica.written and replica.written[0] > 0, "answering")
        await asyncio.sleep(1.0)
        ahead = replica.written[0]
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        body = await asyncio.wait_for(reader.readexactly(len(replica.body())), 30)
        writer.close()
        replica.close()
    print(f"the replica had written {ahead / MiB:.1f} MiB while its client read nothing")
    assert ahead < 12 * MiB
    assert body == replica.body()


async def test_past_the_gateway_budget_the_largest_debtors_are_aborted() -> None:
    """Six clients that take nothing of their 6 MiB answers (handed whole) against a
    16 MiB budget: connections are aborted (their answers end short) until what is owed fits, and an honest
    client is answered throughout."""
    limits = GatewayLimits(
        client_write_timeout_s=0.0,
        max_unread_bytes=16 * MiB,
        max_requests_per_client=0,
    )
    async with running_gateway(limits=limits, slots=8) as gw:
        gw.replica.answer_bytes = 6 * MiB
        host, port = gw.url.removeprefix("http://").split(":")
        clients = []
        for _ in range(6):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((host, int(port)))
            sock.sendall(request_bytes())
            clients.append(sock)
        await eventually(lambda: gw.replica.served == 6, "answered by the replica")
        unread = gw.front.unread
        assert unread is not None
        await eventually(lambda: unread.aborted >= 3, "the largest debtors aborted")
        await asyncio.sleep(1.0)
        assert unread.owed_total <= 16 * MiB
        cut = 0
        for sock in clients:  # an aborted connection ends before its answer did
            sock.settimeout(5)
            received = 0
            try:
                while received < 6 * MiB and (data := sock.recv(1 << 20)):
                    received += len(data)
            except OSError:
                pass
            sock.close()
            cut += received < 6 * MiB
        assert cut >= 3
        gw.replica.answer_bytes = 64
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.post(f"{gw.url}/v1/completions", json=completion())
        assert answer.status_code == 200


async def test_a_request_past_the_answer_deadline_is_ended_with_504() -> None:
    limits = GatewayLimits(answer_deadline_s=1.0)
    async with running_gateway(limits=limits) as gw:
        gw.replica.hold.clear()  # the replica never answers
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.post(f"{gw.url}/v1/completions", json=completion())
        assert answer.status_code == 504, answer.text
        assert "longer than 1s" in answer.json()["error"]["message"]
        gw.replica.hold.set()


async def test_a_stream_whose_client_takes_nothing_is_aborted_after_the_stall(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No room for `--unread-stall`: the connection is aborted (the answer ends short)
    and the request ends as a client gone, not as a failure of the gateway."""
    limits = GatewayLimits(
        client_write_timeout_s=0.0,
        max_unread_bytes_per_connection=1 * MiB,
        unread_stall_s=0.5,
    )
    async with running_gateway(limits=limits) as gw:
        gw.replica.close()
        replica = StreamingReplica(answer_bytes=32 * MiB)
        await replica.listen(gw.replica_port)
        host, port = gw.url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.sendall(request_bytes())
        unread = gw.front.unread
        assert unread is not None
        await eventually(lambda: unread.aborted == 1, "the stalled connection aborted")
        await eventually(lambda: not gw.front.replies, "the request over")
        sock.settimeout(5)
        received = 0
        try:
            while data := sock.recv(1 << 20):
                received += len(data)
        except OSError:
            pass
        sock.close()
        replica.close()
    assert received < 32 * MiB
    failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert failed == []  # neither the front's "answering ... failed" nor granian's
