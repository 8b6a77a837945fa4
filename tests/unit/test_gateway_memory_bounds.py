"""The gateway's memory is bounded by its configuration whatever clients do (issue
25, item 5), over real sockets on 127.0.0.1: a hundred clients that send 8 MiB
requests and never read the answers grow the gateway process's memory by less than
a set bound while its readiness holds; a client that leaves an answer unread has
its connection aborted after the write timeout; requests waiting for a slot are
capped per model and over the gateway, and one client's requests in progress are
capped, each 429 with Retry-After in the OpenAI shape; and a replica that refused a
connection is routed to again once it answers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from gateway.app import GatewayHolder, GatewayState, build_apps
from gateway.held import GatewayLimits
from gateway.namespace_shares import NamespaceShares
from gateway.transport.front import PublicFront
from gateway.transport.serve import Listen, serve
from kamadev.processes import free_port
from tests.unit.gateway_support import deployment, fixed_state, pod

pytestmark = pytest.mark.timeout(90)

MODEL = "ns/chat"
MiB = 1024 * 1024
WAIT_S = 5.0


@dataclass
class Replica:
    """A fake llama-server: `/health` is 200; a completion is answered with
    `answer_bytes` of JSON at once, or, while `hold` is clear, once it is set."""

    answer_bytes: int = 64
    hold: asyncio.Event = field(default_factory=asyncio.Event)
    served: int = 0
    server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET /health "):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    continue
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while length:  # read and drop, without holding the whole body
                    length -= len(await reader.read(min(length, 1 << 20)))
                await self.answer(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def answer(self, writer: asyncio.StreamWriter) -> None:
        await self.hold.wait()
        self.served += 1
        body = b'{"text":"' + b"a" * max(0, self.answer_bytes - 11) + b'"}'
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()

    async def listen(self, port: int) -> None:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", port)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


@dataclass
class Gateway:
    url: str
    state: GatewayState
    replica: Replica
    replica_port: int
    front: PublicFront


@asynccontextmanager
async def running_gateway(
    *, limits: GatewayLimits, slots: int = 1, replica_up: bool = True
) -> AsyncIterator[Gateway]:
    replica, replica_port = Replica(), free_port()
    replica.hold.set()
    if replica_up:
        await replica.listen(replica_port)
    holder = GatewayHolder()
    holder.current = fixed_state(
        model=MODEL, replica_ips=["127.0.0.1"], replica_port=replica_port, slots=slots
    )
    holder.current.proxy.max_waiting_requests = limits.max_waiting_requests
    public, ops = build_apps(holder, limits=limits)
    port, stop = free_port(), asyncio.Event()
    task = asyncio.create_task(
        serve(
            public=public,
            ops=ops,
            lifespan=no_lifespan,
            listen=Listen("127.0.0.1", port),
            ops_listen=Listen("127.0.0.1", free_port()),
            stop=stop,
            grace_s=1.0,
        )
    )
    gateway = Gateway(f"http://127.0.0.1:{port}", holder.state, replica, replica_port, public)
    async with httpx.AsyncClient() as http:
        for _ in range(100):
            try:
                await http.get(f"{gateway.url}/v1/models")
                break
            except httpx.HTTPError:
                await asyncio.sleep(0.05)
    try:
        yield gateway
    finally:
        replica.hold.set()
        stop.set()
        await asyncio.wait_for(task, timeout=10)
        replica.close()


@asynccontextmanager
async def no_lifespan() -> AsyncIterator[None]:
    yield


def completion(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": "hi", **extra}


async def eventually(check: object, what: str) -> None:
    assert callable(check)
    try:
        async with asyncio.timeout(WAIT_S):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {WAIT_S}s") from None


def assert_429(answer: httpx.Response, code: str) -> None:
    assert answer.status_code == 429, answer.text
    assert int(answer.headers["retry-after"]) > 0
    error = answer.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == code, error
    assert error["message"]


async def test_requests_waiting_for_a_slot_are_capped_per_model_and_overall() -> None:
    limits = GatewayLimits(max_waiting_requests=3)
    async with running_gateway(limits=limits) as gw, httpx.AsyncClient(timeout=20) as http:
        gw.replica.hold.clear()
        url = f"{gw.url}/v1/completions"
        model = gw.state.registry.models[MODEL]
        busy = [asyncio.create_task(http.post(url, json=completion())) for _ in range(4)]
        await eventually(lambda: gw.state.proxy.waiting == 3, "one in flight, three waiting")
        assert_429(await http.post(url, json=completion()), "queue_full")  # the gateway's cap

        gw.state.proxy.max_waiting_requests = 100
        model.max_queued = 4  # the model's maxQueuedRequests
        busy.append(asyncio.create_task(http.post(url, json=completion())))
        await eventually(lambda: gw.state.proxy.waiting == 4, "four waiting")
        refused = await http.post(url, json=completion())
        assert_429(refused, "queue_full")
        assert "maxQueuedRequests" in refused.json()["error"]["message"]

        gw.replica.hold.set()
        assert [a.status_code for a in await asyncio.gather(*busy)] == [200] * 5
        assert gw.state.proxy.waiting == 0 and gw.state.proxy.held.held == 0


async def test_a_requester_refused_again_and_again_waits_before_its_next_request() -> None:
    """Issue #41's soak: a flood that ignores Retry-After had the gateway refuse 1,700
    requests a second, at the cost of every other tenant's latency. Past its allowance
    of refusals a requester's next request waits (a timer) before it is looked at."""
    limits = GatewayLimits(max_waiting_requests=1)
    async with running_gateway(limits=limits) as gw, httpx.AsyncClient(timeout=20) as http:
        gw.replica.hold.clear()
        url = f"{gw.url}/v1/completions"
        busy = [asyncio.create_task(http.post(url, json=completion())) for _ in range(2)]
        await eventually(lambda: gw.state.proxy.waiting == 1, "one in flight, one waiting")
        pacing = gw.front.pacing
        for _ in range(pacing.pace_after + 1):
            assert_429(await http.post(url, json=completion()), "queue_full")
        assert pacing.paced == 0
        paced = asyncio.create_task(http.post(url, json=completion()))
        await eventually(lambda: pacing.paced == 1, "the next request waiting first")
        assert_429(await paced, "queue_full")
        assert pacing.paced == 0
        gw.replica.hold.set()
        assert [a.status_code for a in await asyncio.gather(*busy)] == [200] * 2


async def test_one_namespaces_flood_leaves_the_others_their_share_of_waiting() -> None:
    """Requests waiting for slots shared one gateway-wide cap: one tenant's flood of
    waiting requests got every other tenant 429. Now a namespace's models may have at
    most its share of the waiting requests (and of their held bytes)."""
    limits = GatewayLimits(max_waiting_requests=4)
    async with running_gateway(limits=limits) as gw, httpx.AsyncClient(timeout=20) as http:
        proxy, registry = gw.state.proxy, gw.state.registry
        proxy.shares = NamespaceShares(share=0.5)
        registry.apply_deployment("ADDED", deployment("chat", namespace="other", uid="u-other"))
        registry.apply_pod(
            "ADDED", pod("chat-o", namespace="other", model="chat", ip="127.0.0.1", slots=1)
        )
        gw.replica.hold.clear()
        url = f"{gw.url}/v1/completions"
        flood = [asyncio.create_task(http.post(url, json=completion())) for _ in range(3)]
        await eventually(lambda: proxy.shares.waiting.get("ns") == 2, "ns at its share")
        for _ in range(3):  # without shares the third would take the others' room
            refused = await http.post(url, json=completion())
            assert_429(refused, "queue_full")
        message = refused.json()["error"]["message"]
        assert "namespace ns already has 2 requests waiting (at most 2" in message
        honest = [
            asyncio.create_task(http.post(url, json=completion(model="other/chat")))
            for _ in range(3)
        ]
        await eventually(lambda: proxy.shares.waiting.get("other") == 2, "other waits too")
        assert proxy.waiting == 4
        gw.replica.hold.set()
        answers = await asyncio.gather(*flood, *honest)
        assert [a.status_code for a in answers] == [200] * 6
        assert proxy.shares.waiting == {} and proxy.shares.held == {}

    bounded = NamespaceShares(share=0.5)
    with bounded.counted("ns", size=600):
        refusal = bounded.refusal("ns", size=500, max_waiting=100, max_held=2000)
        assert refusal is not None and refusal.code == "held_bytes_full"
        assert bounded.refusal("other", size=500, max_waiting=100, max_held=2000) is None
    with pytest.raises(ValueError, match="share"):
        NamespaceShares(share=0)


async def test_one_client_may_have_only_so_many_requests_in_progress() -> None:
    limits = GatewayLimits(max_requests_per_client=2)
    async with running_gateway(limits=limits, slots=4) as gw:
        gw.replica.hold.clear()
        url = f"{gw.url}/v1/completions"
        async with (
            httpx.AsyncClient(timeout=20) as client,
            httpx.AsyncClient(
                timeout=20, transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2")
            ) as other,
        ):
            busy = [asyncio.create_task(client.post(url, json=completion())) for _ in range(2)]
            await eventually(lambda: gw.state.registry.models[MODEL].in_flight == 2, "two in")
            refused = await client.post(url, json=completion())
            assert refused.headers["connection"] == "close"
            assert_429(refused, "too_many_requests")
            assert "2 requests in progress" in refused.json()["error"]["message"]
            other_answer = asyncio.create_task(other.post(url, json=completion()))
            await eventually(
                lambda: gw.state.registry.models[MODEL].in_flight == 3, "another client's is in"
            )
            gw.replica.hold.set()
            answers = await asyncio.gather(*busy, other_answer)
            assert [a.status_code for a in answers] == [200] * 3
            assert (await client.post(url, json=completion())).status_code == 200  # room again
        assert gw.state.proxy.registry.models[MODEL].in_flight == 0


async def test_bodies_arriving_at_once_are_budgeted() -> None:
    limits = GatewayLimits(max_upload_bytes=MiB)
    async with running_gateway(limits=limits) as gw, httpx.AsyncClient(timeout=20) as http:
        url = f"{gw.url}/v1/completions"
        host, port = gw.url.removeprefix("http://").split(":")
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(  # 900 KiB announced, a little sent, the rest never comes
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n{" % (900 * 1024)
        )
        await writer.drain()
        async with asyncio.timeout(5):  # the gateway counted the announced length
            while gw.front.uploading == 0:
                await asyncio.sleep(0.01)
        big = completion(prompt="b" * (200 * 1024))
        assert_429(await http.post(url, json=big), "too_many_requests")
        assert (await http.post(url, json=completion())).status_code == 200  # a small one fits
        writer.close()


async def test_a_replica_that_refused_a_connection_is_routed_to_again() -> None:
    async with (
        running_gateway(limits=GatewayLimits(), replica_up=False) as gw,
        httpx.AsyncClient(timeout=20) as http,
    ):
        url = f"{gw.url}/v1/completions"
        refused = await http.post(url, json=completion())
        assert refused.status_code == 502  # its only replica refused: nothing else to try
        model = gw.state.registry.models[MODEL]
        assert "chat-0" not in model.endpoints  # not routed to while it refuses
        await gw.replica.listen(gw.replica_port)  # llama-server is back; the Pod unchanged
        await eventually(lambda: "chat-0" in model.endpoints, "routed to again")
        answer = await http.post(url, json=completion())
        assert answer.status_code == 200 and answer.headers["x-kama-pod"] == "chat-0"


async def test_an_answer_left_unread_is_dropped_after_the_write_timeout() -> None:
    """granian takes an answer whole, without back-pressure; the kernel's write
    timeout on the client's connection is what frees it when the client never
    reads: the connection is aborted and the gateway keeps nothing."""
    limits = GatewayLimits(client_write_timeout_s=1.0)
    async with running_gateway(limits=limits) as gw:
        gw.replica.answer_bytes = 8 * MiB
        host, port = gw.url.removeprefix("http://").split(":")
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect((host, int(port)))
        body = json.dumps(completion()).encode()
        client.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await eventually(lambda: gw.replica.served == 1, "answered by the replica")
        await asyncio.sleep(3.0)  # past the write timeout, reading nothing
        client.setblocking(False)
        received = 0
        with pytest.raises(ConnectionResetError):  # aborted: what is left never comes
            while True:
                try:
                    data = client.recv(1 << 20)
                except BlockingIOError:
                    await asyncio.sleep(0.05)
                    continue
                if not data:
                    break
                received += len(data)
        assert received < 8 * MiB
        client.close()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@dataclass
class GatewayProcess:
    process: asyncio.subprocess.Process
    port: int
    ops_port: int


@asynccontextmanager
async def gateway_process(
    *, replica_port: int, limits: Mapping[str, object]
) -> AsyncIterator[GatewayProcess]:
    """`tests.unit.memory_gateway` in its own process (its memory measured apart from
    the clients'), once it serves; stopped with SIGTERM."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.unit.memory_gateway",
        str(replica_port),
        json.dumps(limits),
        stdout=subprocess.PIPE,
        cwd=os.getcwd(),
    )
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        _, port, ops_port = line.decode().split()
        yield GatewayProcess(process, int(port), int(ops_port))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()


CLIENTS = 100
BODY_BYTES = 8 * MiB - 1024
RSS_BOUND = 256 * MiB
ROUNDS = 2  # connections per client, one request each, every answer left unread
ANSWER_BYTES = 1 * MiB  # each answer a client leaves unread (a long completion's JSON)


def never_reading_client(number: int, port: int, body: bytes, sockets: list[socket.socket]) -> None:
    """Send `ROUNDS` requests, each on its own connection from this client's own
    address, and read nothing."""
    for _ in range(ROUNDS):
        sock = socket.socket()
        sockets.append(sock)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(30)
            sock.bind((f"127.0.{1 + number // 250}.{1 + number % 250}", 0))
            sock.connect(("127.0.0.1", port))
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n" % len(body)
            )
            sock.sendall(body)
        except OSError:
            pass  # refused and closed, or aborted: the gateway did its part


async def test_clients_that_never_read_cannot_grow_the_gateway_past_its_bound() -> None:
    limits = {
        "max_held_bytes": 32 * MiB,
        "max_upload_bytes": 32 * MiB,
        "max_waiting_requests": 64,
        "max_requests_per_client": 4,
        "client_write_timeout_s": 2.0,
        "slots": 4,
    }
    replica, replica_port = Replica(answer_bytes=ANSWER_BYTES), free_port()
    replica.hold.set()
    await replica.listen(replica_port)
    sockets: list[socket.socket] = []
    try:
        async with (
            gateway_process(replica_port=replica_port, limits=limits) as gateway,
            httpx.AsyncClient(timeout=30) as http,
        ):
            url = f"http://127.0.0.1:{gateway.port}"
            ops = f"http://127.0.0.1:{gateway.ops_port}"
            warm = await http.post(f"{url}/v1/completions", json=completion(prompt="a" * MiB))
            assert warm.status_code == 200
            await asyncio.sleep(0.5)
            pid = gateway.process.pid
            idle = rss_bytes(pid)
            body = json.dumps(completion(prompt="p" * (BODY_BYTES - 64))).encode()
            threads = [
                threading.Thread(
                    target=never_reading_client, args=(n, gateway.port, body, sockets), daemon=True
                )
                for n in range(CLIENTS)
            ]
            started = time.monotonic()
            for thread in threads:
                thread.start()
            peak, unready = idle, 0
            while any(t.is_alive() for t in threads) or time.monotonic() - started < 4:
                peak = max(peak, rss_bytes(pid))
                if (await http.get(f"{ops}/readyz", timeout=5)).status_code != 200:
                    unready += 1
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
            print(
                f"idle RSS {idle / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB "
                f"(+{(peak - idle) / MiB:.0f}), {replica.served} answered, {took:.1f}s"
            )
            assert peak - idle < RSS_BOUND, f"grew by {(peak - idle) / MiB:.0f} MiB"
            assert unready == 0
            assert replica.served > 0  # the gateway kept serving through it
            after = await http.post(f"{url}/v1/completions", json=completion())
            assert after.status_code == 200
    finally:
        for sock in sockets:
            sock.close()
        replica.close()
