"""The gateway's hot path (inference route → registry lease → proxy → lean upstream
client → relay) hosted by each candidate server, as a process the benchmark can
load and measure: `python -m tests.bench.gateway_hosts SERVER PORT UPSTREAM_HOST
UPSTREAM_PORT`, with one model, `bench/fast`, whose one replica is the upstream.

- `granian-rsgi`: the gateway as it ships (`gateway.transport.serve`: the public
  front under RSGI, the operational app on PORT + 1);
- `granian-asgi` and `uvicorn` (httptools, uvloop): the same inference handler
  behind a plain ASGI adapter, which is what serving it over ASGI would take (the
  request headers as a dict, the body read with receive(), the answer sent as ASGI
  messages);
- `granian-bare`: the floor of a proxy on granian RSGI: read the body, forward it to
  the one upstream on the same pooled HTTP/1.1 client, relay the answer chunk by
  chunk; no routing, keys, limits, metrics, deadlines or error shapes."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from gateway.app import GatewayHolder, build_apps
from gateway.errors import server_refusal
from gateway.inference import InferenceRoutes
from gateway.transport.exchange import Headers, Request
from gateway.transport.front import MAX_BODY_BYTES
from gateway.transport.upstream import UpstreamTransport
from tests.unit.gateway_support import fixed_state

MODEL = "bench/fast"


class ASGIReply:
    """A `Reply` over ASGI's send: what is sent or started is flushed as messages."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self.status = 0
        self.client_gone = False
        self._head: dict[str, Any] | None = None
        self._body: bytes | None = None
        self._streaming = False

    @staticmethod
    def _start(status: int, headers: Headers) -> dict[str, Any]:
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        return {"type": "http.response.start", "status": status, "headers": raw}

    def send(self, status: int, headers: Headers, body: bytes) -> None:
        self.status = status
        self._head, self._body = self._start(status, headers), body

    def start(self, status: int, headers: Headers) -> None:
        self.status = status
        self._head = self._start(status, headers)

    async def write(self, chunk: bytes) -> None:
        if self._head is not None:
            await self._send(self._head)
            self._head, self._streaming = None, True
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def flush(self) -> None:
        if self._head is not None:
            await self._send(self._head)
        if self._body is not None or self._streaming or self._head is not None:
            await self._send({"type": "http.response.body", "body": self._body or b""})


class ASGIHotPath:
    """The inference handler as an ASGI app (inference routes only)."""

    def __init__(self, holder: GatewayHolder) -> None:
        self.lean = InferenceRoutes(
            proxy=lambda: holder.state.proxy, access=lambda: holder.state.access
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        reply = ASGIReply(send)
        declared = headers.get("content-length")
        if declared is not None and int(declared) > MAX_BODY_BYTES:
            reply.send(413, *server_refusal(413, "too large"))
        else:
            chunks = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            handler = self.lean(scope["method"], scope["path"])
            if handler is None:
                reply.send(404, [], b"")
            else:
                await handler(
                    Request(scope["method"], scope["path"], headers, b"".join(chunks)), reply
                )
        await reply.flush()


class BareProxy:
    """granian RSGI + the lean upstream client, and nothing else (`granian-bare`)."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.client = UpstreamTransport()

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        body = await proto()
        forwarded = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        answer = await self.client.request(
            host=self.upstream[0], port=self.upstream[1], method=scope.method,
            target=scope.path, headers=forwarded, body=body,
            connect_timeout=10, read_timeout=120,
        )  # fmt: skip
        try:
            headers = [
                (k.decode("latin-1"), v.decode("latin-1"))
                for k, v in answer.headers
                if k.lower() not in (b"content-length", b"transfer-encoding", b"connection")
            ]
            stream = proto.response_stream(answer.status, headers)
            async for chunk in answer:
                await stream.send_bytes(chunk)
        finally:
            await answer.aclose()


@asynccontextmanager
async def no_lifespan() -> AsyncIterator[None]:
    yield


def main(server: str, port: int, upstream_host: str, upstream_port: int) -> None:
    holder = GatewayHolder()

    async def serve() -> None:
        holder.current = fixed_state(
            model=MODEL, replica_ips=[upstream_host], replica_port=upstream_port
        )
        if server == "granian-rsgi":
            from gateway.transport.serve import Listen
            from gateway.transport.serve import serve as serve_gateway

            public, ops = build_apps(holder)
            await serve_gateway(
                public=public,
                ops=ops,
                lifespan=no_lifespan,
                listen=Listen("127.0.0.1", port),
                ops_listen=Listen("127.0.0.1", port + 1),
            )
        elif server == "granian-bare":
            from granian.constants import HTTPModes, Interfaces
            from granian.server.embed import Server

            await Server(
                BareProxy(upstream_host, upstream_port),
                address="127.0.0.1",
                port=port,
                interface=Interfaces.RSGI,
                http=HTTPModes.http1,
                backlog=2048,
            ).serve()
        elif server == "granian-asgi":
            from granian.constants import HTTPModes, Interfaces
            from granian.server.embed import Server

            await Server(
                ASGIHotPath(holder),
                address="127.0.0.1",
                port=port,
                interface=Interfaces.ASGINL,
                http=HTTPModes.http1,
                backlog=2048,
            ).serve()
        elif server == "uvicorn":
            import uvicorn

            config = uvicorn.Config(
                ASGIHotPath(holder),
                host="127.0.0.1",
                port=port,
                loop="none",
                http="httptools",
                lifespan="off",
                access_log=False,
                log_level="warning",
                backlog=2048,
            )
            await uvicorn.Server(config).serve()
        else:
            raise SystemExit(f"unknown server {server!r}")

    import uvloop

    uvloop.run(serve())


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
