"""The gateway as clients and replicas see it, over real sockets on 127.0.0.1: the
public port (granian RSGI, the lean inference path, FastAPI for the rest) and the
operational port, in front of fake replicas that answer whole, stream, hang or die
mid-answer. What users rely on: answers relayed with their headers, streams relayed
as they arrive, a client that leaves closing its replica's request, the limits and
every refusal in the OpenAI error shape, metrics and health on their own port, and
the graceful stop. After every request the registry's in-flight counts are back to
zero: the lease was released whatever happened."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from gateway.app import GatewayHolder, GatewayState, build_apps
from gateway.held import DEFAULT_LIMITS, DEFAULT_MAX_HELD_BYTES, GatewayLimits
from gateway.media_urls import remote_media_url
from gateway.registry import Model
from gateway.transport import front
from gateway.transport.front import PublicFront
from gateway.transport.serve import Listen, serve
from kamadev.processes import free_port
from tests.unit.gateway_support import deployment, fixed_state, pod

pytestmark = pytest.mark.timeout(30)

MODEL = "ns/chat"
JSON = {"content-type": "application/json"}
WAIT_S = 5.0


@dataclass
class Replica:
    """A fake llama-server. The request body's `mode` says how it answers: `whole`,
    `stream` (two events, the second once `proceed` is set), `hang-stream` (one event,
    then nothing), `hang` (nothing), `slow` (whole, after 0.5 s), `die` (one event,
    then the connection drops)."""

    port: int
    requests: list[dict[str, object]] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # a client hung up on it
    proceed: asyncio.Event = field(default_factory=asyncio.Event)
    connections: int = 0  # open now
    most_connections: int = 0  # open at once, at most
    metrics_polls: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.most_connections = max(self.most_connections, self.connections)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET /metrics "):  # the gateway's backend-load poll
                    self.metrics_polls += 1
                    text = b"llamacpp:requests_processing 3\nllamacpp:requests_deferred 0\n"
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(text), text)
                    )
                    continue
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                request = json.loads(await reader.readexactly(length))
                self.requests.append(request)
                if not await self.answer(str(request.get("mode", "whole")), reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            self.connections -= 1
            writer.close()

    async def answer(
        self, mode: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False once the connection is done with."""
        if mode in ("whole", "slow"):
            if mode == "slow":
                await asyncio.sleep(0.5)
            body = b'{"choices":[{"text":"ok"}]}'
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            return True
        if mode == "named":  # as llama-server names its model: by its file
            body = b'{"choices":[{"text":"ok","model":"inner"}],"model":"/models/tiny.gguf"}'
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json; charset=utf-8\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            return True
        if mode == "named-stream":  # events cut across writes at awkward places
            events = (
                b"".join(
                    b'data: {"choices":[{"delta":{"content":"%d"}}],"model":"/models/tiny.gguf"}\n\n'
                    % n
                    for n in range(3)
                )
                + b"data: [DONE]\n\n"
            )
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            for start in range(0, len(events), 37):
                writer.write(_chunk(events[start : start + 37]))
                await writer.drain()
                await asyncio.sleep(0.001)
            writer.write(b"0\r\n\r\n")
            return True
        if mode == "die-json":  # half a JSON answer, then the connection drops
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b'content-length: 100\r\n\r\n{"model":"/models/tiny.gguf",'
            )
            await writer.drain()
            writer.transport.abort()
            return False
        if mode == "hang":
            await reader.read()  # until the gateway hangs up
            self.closed.set()
            return False
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        writer.write(_chunk(b'data: {"n": 1}\n\n'))
        await writer.drain()
        if mode == "die":
            writer.transport.abort()
            return False
        if mode == "hang-stream":
            await reader.read()
            self.closed.set()
            return False
        await self.proceed.wait()
        writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


@dataclass
class Gateway:
    url: str
    ops_url: str
    state: GatewayState
    replica: Replica
    stop: asyncio.Event
    task: asyncio.Task[None]
    front: PublicFront

    def in_flight(self) -> int:
        model = self.state.registry.models[MODEL]
        return model.in_flight + sum(e.in_flight for e in model.endpoints.values())


@asynccontextmanager
async def no_lifespan() -> AsyncIterator[None]:
    yield


@asynccontextmanager
async def running_gateway(
    *,
    replica_ips: tuple[str, ...] = ("127.0.0.1",),
    slots: int = 4,
    max_held_bytes: int = DEFAULT_MAX_HELD_BYTES,
    auth: str = "disabled",
    limits: GatewayLimits = DEFAULT_LIMITS,
) -> AsyncIterator[Gateway]:
    replica = Replica(port=free_port())
    listener = await asyncio.start_server(replica.handle, "127.0.0.1", replica.port)
    holder = GatewayHolder()
    holder.current = fixed_state(
        model=MODEL,
        replica_ips=list(replica_ips),
        replica_port=replica.port,
        slots=slots,
        max_held_bytes=max_held_bytes,
        auth=auth,
    )
    public, ops = build_apps(holder, limits=limits)
    port, ops_port, stop = free_port(), free_port(), asyncio.Event()
    task = asyncio.create_task(
        serve(
            public=public,
            ops=ops,
            lifespan=no_lifespan,
            listen=Listen("127.0.0.1", port),
            ops_listen=Listen("127.0.0.1", ops_port),
            stop=stop,
            grace_s=2.0,
        )
    )
    gateway = Gateway(
        url=f"http://127.0.0.1:{port}",
        ops_url=f"http://127.0.0.1:{ops_port}",
        state=holder.state,
        replica=replica,
        stop=stop,
        task=task,
        front=public,
    )
    async with httpx.AsyncClient() as http:
        for _ in range(100):
            try:
                if (await http.get(f"{gateway.url}/v1/models")).status_code in (200, 401):
                    break
            except httpx.HTTPError:
                await asyncio.sleep(0.05)
    try:
        yield gateway
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
        listener.close()
    assert gateway.in_flight() == 0, "every lease was released"


async def metrics_text(gw: Gateway) -> str:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{gw.ops_url}/metrics")).text


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    try:
        async with asyncio.timeout(WAIT_S):
            while not await check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {WAIT_S}s") from None


def completion(mode: str = "whole", **extra: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": "hi", "mode": mode, **extra}


async def test_an_answer_is_relayed_with_its_headers_and_counted() -> None:
    async with running_gateway() as gw, httpx.AsyncClient() as http:
        answer = await http.post(f"{gw.url}/v1/completions", json=completion())
        assert answer.status_code == 200 and answer.json() == {"choices": [{"text": "ok"}]}
        assert answer.headers["x-kama-pod"] == "chat-0"
        assert answer.headers["x-kama-model"] == MODEL
        assert answer.headers["content-type"] == "application/json"
        assert "keep-alive" not in answer.headers.get("connection", "")
        assert gw.replica.requests == [completion()]
        native = await http.post(
            f"{gw.url}/models/ns/chat/tokenize", json={"content": "x", "mode": "whole"}
        )
        assert native.status_code == 200
        text = await metrics_text(gw)
    assert (
        f'kama_gateway_requests_total{{code="200",model="{MODEL}",route="completions"}} 1.0' in text
    )
    assert f'kama_gateway_requests_total{{code="200",model="{MODEL}",route="tokenize"}} 1.0' in text


async def test_a_tokenize_input_is_capped_so_its_answer_stays_bounded() -> None:
    """A token list answers about 12 times its input: more than 1 MiB of input is
    refused before it reaches a replica, and 1 MiB still passes."""
    async with running_gateway() as gw, httpx.AsyncClient(timeout=30) as http:
        for route in ("tokenize", "detokenize"):
            big = await http.post(
                f"{gw.url}/models/ns/chat/{route}", json={"content": "x" * (1 << 20)}
            )
            assert big.status_code == 413, big.text
            assert route in big.json()["error"]["message"]
        assert gw.replica.requests == []
        fits = await http.post(
            f"{gw.url}/models/ns/chat/tokenize", json={"content": "x" * ((1 << 20) - 64)}
        )
        assert fits.status_code == 200


async def test_a_stream_is_relayed_as_it_arrives() -> None:
    async with (
        running_gateway() as gw,
        httpx.AsyncClient() as http,
        http.stream("POST", f"{gw.url}/v1/chat/completions", json=completion("stream")) as stream,
    ):
        assert stream.headers["content-type"] == "text/event-stream"
        lines = stream.aiter_lines()
        assert await anext(lines) == 'data: {"n": 1}'  # before the replica sent the rest
        gw.replica.proceed.set()
        rest = [line async for line in lines if line]
        assert rest == ["data: [DONE]"]


async def test_a_client_leaving_a_stream_closes_the_replicas_request() -> None:
    async with running_gateway() as gw, httpx.AsyncClient() as http:
        async with http.stream(
            "POST", f"{gw.url}/v1/chat/completions", json=completion("hang-stream")
        ) as stream:
            assert await anext(stream.aiter_lines()) == 'data: {"n": 1}'
        await asyncio.wait_for(gw.replica.closed.wait(), WAIT_S)

        async def released() -> bool:
            return gw.in_flight() == 0

        await eventually(released, "the lease released")


async def test_a_client_giving_up_on_a_long_answer_closes_the_replicas_request() -> None:
    async with running_gateway() as gw, httpx.AsyncClient() as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(
                f"{gw.url}/v1/completions",
                json=completion("hang"),
                timeout=httpx.Timeout(5, read=0.3),
            )
        await asyncio.wait_for(gw.replica.closed.wait(), WAIT_S)

        async def counted() -> bool:
            left = f'kama_gateway_requests_total{{code="499",model="{MODEL}",route="completions"}}'
            return gw.in_flight() == 0 and left in await metrics_text(gw)

        await eventually(counted, "the request counted as abandoned")


async def test_a_replica_failing_mid_stream_ends_it_with_an_openai_error_event() -> None:
    async with running_gateway() as gw, httpx.AsyncClient() as http:
        answer = await http.post(f"{gw.url}/v1/chat/completions", json=completion("die"))
        events = [line for line in answer.text.splitlines() if line]
        assert events[0] == 'data: {"n": 1}'
        error = json.loads(events[-1].removeprefix("data: "))["error"]
        assert error["code"] == "upstream_failed" and "chat-0" in error["message"]


async def test_a_refused_connection_is_retried_on_another_replica() -> None:
    # 127.0.0.2 has nothing listening on the replica port: refused before anything was sent
    async with (
        running_gateway(replica_ips=("127.0.0.2", "127.0.0.1")) as gw,
        httpx.AsyncClient() as http,
    ):
        gw.state.registry.models[MODEL].endpoints["chat-1"].latency_s = 1.0  # 127.0.0.2 first
        answer = await http.post(f"{gw.url}/v1/completions", json=completion())
        assert answer.status_code == 200 and answer.headers["x-kama-pod"] == "chat-1"
        assert (
            "chat-0" not in gw.state.registry.models[MODEL].endpoints
        )  # dropped until the watch says otherwise


async def test_refusals_use_the_openai_shape_and_never_reach_a_replica() -> None:
    async with running_gateway() as gw, httpx.AsyncClient(timeout=10) as http:
        big = b'{"model": "x", "prompt": "' + b"a" * (9 * 1024 * 1024) + b'"}'

        async def chunked() -> AsyncIterator[bytes]:
            for start in range(0, len(big), 1 << 20):
                yield big[start : start + (1 << 20)]

        checks = [
            (await http.post(f"{gw.url}/v1/completions", content=big), 413, "body_too_large"),
            (await http.post(f"{gw.url}/v1/completions", content=chunked()), 413, "body_too_large"),
            (
                await http.post(f"{gw.url}/v1/completions", content=b"{no", headers=JSON),
                400,
                "invalid_json",
            ),
            (
                await http.post(f"{gw.url}/v1/completions", content=b"{}"),
                415,
                "unsupported_media_type",
            ),
            (await http.post(f"{gw.url}/v1/completions", json=[1]), 400, "invalid_json"),
            (
                await http.post(f"{gw.url}/v1/completions", json={"model": "ns/nope"}),
                404,
                "model_not_found",
            ),
            (await http.post(f"{gw.url}/completion", json={"prompt": "x"}), 400, None),
            (await http.get(f"{gw.url}/nowhere"), 404, "not_found"),
            (await http.get(f"{gw.url}/v1/completions"), 404, "not_found"),
            (await http.post(f"{gw.url}/slots/0?action=erase", json={}), 403, "forbidden"),
            (await http.post(f"{gw.url}/props", json={}), 403, "forbidden"),
            # operational routes and documents are not on the public port
            (await http.get(f"{gw.url}/metrics"), 403, "forbidden"),
            (await http.get(f"{gw.url}/healthz"), 404, "not_found"),
            (await http.get(f"{gw.url}/openapi.json"), 404, "not_found"),
            (await http.get(f"{gw.url}/docs"), 404, "not_found"),
        ]
        for answer, status, code in checks:
            assert answer.status_code == status, (answer.request.url, answer.text)
            error = answer.json()["error"]
            assert error["message"] and error["code"] == code, error
        assert gw.replica.requests == []


async def test_operations_are_on_their_own_port_without_redirects() -> None:
    async with running_gateway() as gw, httpx.AsyncClient() as http:
        assert (await http.get(f"{gw.ops_url}/healthz")).json() == {"status": "ok"}
        ready = await http.get(f"{gw.ops_url}/readyz")
        assert ready.status_code == 503 and ready.json()["ready"] is False  # no watch has listed
        assert "kama_gateway_in_flight" in (await http.get(f"{gw.ops_url}/metrics")).text
        slash = await http.get(f"{gw.ops_url}/metrics/", headers={"host": "evil.example"})
        assert slash.status_code == 404 and "location" not in slash.headers
        assert (
            await http.post(f"{gw.ops_url}/v1/completions", json=completion())
        ).status_code == 404


async def test_a_watch_failing_for_long_keeps_the_gateway_ready_and_says_how_stale() -> None:
    """An API-server blip must not become a data-plane outage: once every watch has
    listed, the gateway stays ready while a watch fails (it routes from what it last
    saw), and says how long each has been failing on its metrics."""
    async with running_gateway() as gw, httpx.AsyncClient() as http:
        pods = gw.state.health.track("pods")
        pods.synced = True
        pods.failing_since = time.monotonic() - 3600  # an hour without the API server
        ready = await http.get(f"{gw.ops_url}/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["watches"]["pods"]["failingForSeconds"] >= 3600
        metrics = (await http.get(f"{gw.ops_url}/metrics")).text
        stale = [line for line in metrics.splitlines() if line.startswith("kama_gateway_watch_")]
        assert any('collection="pods"' in line for line in stale), stale
        pods.alive = False  # a watch loop that died is not ready (and not live)
        assert (await http.get(f"{gw.ops_url}/readyz")).status_code == 503


async def raw(url: str, data: bytes, *, wait_s: float = WAIT_S) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    received = b""
    try:
        async with asyncio.timeout(wait_s):
            while chunk := await reader.read(65536):
                received += chunk
    except TimeoutError:
        pass
    finally:
        writer.close()
    return received


async def test_a_body_that_stops_arriving_is_408(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(front, "BODY_ARRIVAL_S", 0.3)
    async with running_gateway() as gw:
        head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{"
        answer = await raw(gw.url, head, wait_s=3)
        assert answer.startswith(b"HTTP/1.1 408 ")
        error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
        assert error["code"] == "request_timeout"


async def test_what_the_server_refuses_itself() -> None:
    """granian answers these before the app sees them, with an empty body
    (documented in gateway/transport/serve.py)."""
    async with running_gateway() as gw:
        assert (await raw(gw.url, b"NONSENSE\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        bad_length = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: x\r\n\r\n"
        assert (await raw(gw.url, bad_length)).startswith(b"HTTP/1.1 400 ")
        huge_head = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 500_000 + b"\r\n\r\n"
        assert (await raw(gw.url, huge_head)).startswith(b"HTTP/1.1 431 ")


async def test_stopping_lets_requests_in_flight_finish_and_refuses_new_ones() -> None:
    async with running_gateway() as gw, httpx.AsyncClient() as http:
        slow = asyncio.create_task(http.post(f"{gw.url}/v1/completions", json=completion("slow")))
        async with asyncio.timeout(5):  # in flight: the replica has it (a busy machine is slow)
            while not gw.replica.requests:
                await asyncio.sleep(0.01)
        gw.stop.set()
        with pytest.raises(httpx.ConnectError):  # once the listener is closed
            async with asyncio.timeout(5):
                while True:  # each time a new connection
                    async with httpx.AsyncClient() as fresh:
                        # one accepted as the listener closed is closed unanswered
                        with contextlib.suppress(httpx.RemoteProtocolError):
                            await fresh.get(f"{gw.url}/v1/models")
                    await asyncio.sleep(0.01)
        answer = await slow
        assert answer.status_code == 200 and answer.json() == {"choices": [{"text": "ok"}]}
        await asyncio.wait_for(gw.task, timeout=5)


async def test_a_replica_gets_no_more_requests_or_connections_than_its_slots() -> None:
    """llama-server serves HTTP on `slots` + 4 threads, each of which keeps an idle
    keep-alive connection for seconds: a connection beyond them waits unanswered.
    So the gateway keeps at most `slots` requests on a replica and queues the rest
    itself, handing each freed slot to the longest waiting request, which reuses the
    connection that request left."""
    async with running_gateway(slots=2) as gw, httpx.AsyncClient(timeout=20) as http:
        answers = await asyncio.gather(
            *(http.post(f"{gw.url}/v1/completions", json=completion("slow")) for _ in range(8))
        )
        assert [a.status_code for a in answers] == [200] * 8
        assert gw.replica.most_connections <= 2, gw.replica.most_connections
        assert len(gw.replica.requests) == 8


async def test_load_polls_are_outside_the_slot_cap() -> None:
    """The backend-load poll reaches a replica whose slots are all taken (it costs
    llama-server one of its spare HTTP threads, not a slot)."""
    from gateway.backend_load import poll_one

    async with running_gateway(slots=1) as gw, httpx.AsyncClient(timeout=20) as http:
        busy = asyncio.create_task(http.post(f"{gw.url}/v1/completions", json=completion("hang")))
        endpoint = gw.state.registry.models[MODEL].endpoints["chat-0"]

        async def taken() -> bool:
            return endpoint.in_flight == 1

        await eventually(taken, "the only slot taken")
        upstream = httpx.AsyncClient(transport=gw.state.proxy.upstream)
        await poll_one(upstream, endpoint, port=gw.replica.port)
        assert gw.replica.metrics_polls == 1 and endpoint.others == 2  # 3 held, 1 of them ours
        busy.cancel()
        await asyncio.gather(busy, return_exceptions=True)

        async def released() -> bool:
            return gw.in_flight() == 0

        await eventually(released, "the lease released once its client left")


async def held_count(model: Model, count: int) -> bool:
    return model.held == count


async def test_held_requests_are_bounded_in_bytes_across_the_gateway() -> None:
    """Requests held for a cold start count their bodies against one budget for
    the whole gateway: past it, 429 at once, with Retry-After, in the OpenAI shape."""
    async with (
        running_gateway(replica_ips=(), max_held_bytes=3000) as gw,
        httpx.AsyncClient(timeout=20) as http,
    ):
        url = f"{gw.url}/v1/completions"
        first = asyncio.create_task(http.post(url, json=completion(prompt="a" * 2000)))
        model = gw.state.registry.models[MODEL]

        async def held() -> bool:
            return model.held == 1

        await eventually(held, "the first request held")
        refused = await asyncio.wait_for(http.post(url, json=completion(prompt="b" * 2000)), WAIT_S)
        assert refused.status_code == 429 and refused.headers["retry-after"]
        assert refused.json()["error"]["code"] == "held_bytes_full"
        small = asyncio.create_task(http.post(url, json=completion(prompt="c")))
        await eventually(lambda: held_count(model, 2), "a small one still fits")
        gw.state.registry.apply_pod("ADDED", pod("chat-0", model="chat", ip="127.0.0.1"))
        answers = await asyncio.gather(first, small)
        assert [a.status_code for a in answers] == [200, 200]
        assert gw.state.proxy.held.held == 0


async def test_answers_name_the_model_the_client_asked_for() -> None:
    """llama-server names its model file; the gateway answers with the name the
    client sent (its alias included), in whole answers and in every streamed event."""
    async with running_gateway() as gw, httpx.AsyncClient() as http:
        gw.state.registry.apply_deployment("MODIFIED", deployment("chat", aliases=["tiny"]))
        for name in (MODEL, "tiny"):
            whole = await http.post(
                f"{gw.url}/v1/chat/completions", json={**completion("named"), "model": name}
            )
            assert whole.status_code == 200 and whole.json()["model"] == name, whole.text
            assert whole.json()["choices"] == [{"text": "ok", "model": "inner"}]
            streamed = await http.post(
                f"{gw.url}/v1/chat/completions",
                json={**completion("named-stream"), "model": name},
            )
            events = [
                json.loads(line[6:]) for line in streamed.text.splitlines() if line[6:7] == "{"
            ]
            assert len(events) == 3 and {e["model"] for e in events} == {name}, streamed.text
            assert streamed.text.rstrip().endswith("data: [DONE]")


async def test_the_model_list_says_which_model_owns_each_alias() -> None:
    async with running_gateway() as gw, httpx.AsyncClient() as http:
        registry = gw.state.registry
        registry.apply_deployment("MODIFIED", deployment("chat", aliases=["tiny", "mine"]))
        late = deployment("late", namespace="other", uid="u2", aliases=["tiny", "own"],
                          created="2026-02-01T00:00:00Z")  # fmt: skip
        registry.apply_deployment("ADDED", late)
        listed = {m["id"]: m for m in (await http.get(f"{gw.url}/v1/models")).json()["data"]}
        assert listed[MODEL]["aliases"] == ["tiny", "mine"]
        assert listed["other/late"]["aliases"] == ["own"]
        assert listed["other/late"]["aliases_owned_elsewhere"] == {"tiny": MODEL}
        assert listed[MODEL]["aliases_owned_elsewhere"] == {}
        answer = await http.post(
            f"{gw.url}/v1/completions", json={**completion("named"), "model": "tiny"}
        )
        assert answer.headers["x-kama-model"] == MODEL  # the older claim routes


async def test_a_replica_failing_mid_json_answer_is_a_502_in_the_openai_shape() -> None:
    """A JSON answer is read whole before it is sent (to rename its model), so a
    replica that fails midway is still reported in the status."""
    async with running_gateway() as gw, httpx.AsyncClient() as http:
        answer = await http.post(f"{gw.url}/v1/completions", json=completion("die-json"))
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["code"] == "upstream_failed"


async def test_an_image_by_url_is_refused_unless_the_deployment_allows_it() -> None:
    """A vision model's llama-server fetches an image given by URL from the serving pod:
    any client could make the pod reach an address of its choosing. Only data: URLs
    pass, unless the deployment opts in (spec.routing.allowRemoteMediaUrls)."""
    remote = "http://169.254.169.254/latest/meta-data/"
    part = {"type": "image_url", "image_url": {"url": remote}}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": [part]}], "mode": "whole"}
    inline = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    async with running_gateway() as gw, httpx.AsyncClient() as http:
        url = f"{gw.url}/v1/chat/completions"
        refused = await http.post(url, json=chat)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "remote_media_not_allowed"
        allowed = chat | {"messages": [{"role": "user", "content": [inline]}]}
        assert (await http.post(url, json=allowed)).status_code == 200
        assert len(gw.replica.requests) == 1, "the refused request reached no replica"
        opted_in = deployment("chat")
        opted_in["spec"]["routing"] = {"allowRemoteMediaUrls": True}
        gw.state.registry.apply_deployment("MODIFIED", opted_in)
        assert (await http.post(url, json=chat)).status_code == 200


def test_every_api_s_image_url_is_found() -> None:
    remote = "https://example.com/cat.png"
    found: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": remote}]}]},
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": remote}]}]},
        {"input": [{"type": "input_image", "image_url": remote}]},
        {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is it?"},
            {"type": "image", "source": {"type": "url", "url": remote}},
        ]}]},
    ]  # fmt: skip
    for fields in found:
        assert remote_media_url(fields) == remote, fields
    inline = {"type": "image", "source": {"type": "base64", "data": "AAAA"}}
    nothing: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "text only"}]},
        {"messages": [{"role": "user", "content": [inline]}]},
        {"prompt": "https://example.com/cat.png"},
        {"messages": "not a list"},
    ]
    for fields in nothing:
        assert remote_media_url(fields) is None, fields
