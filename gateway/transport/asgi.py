"""The FastAPI app's routes on the RSGI public port.

granian serves one interface per listener, and the public port's is RSGI (the
cheapest per proxied request), so the few requests that are not inference (the
model list, the refusals of unknown and admin routes) reach FastAPI through one
ASGI call here: the body already read whole, the answer collected and sent whole.
Those answers are small JSON; nothing streamed goes this way."""

from __future__ import annotations

import asyncio
from typing import Any

from granian.rsgi import Scope

from gateway.transport.exchange import Reply

ASGI_VERSION = {"version": "3.0", "spec_version": "2.3"}


def _scope(scope: Scope) -> dict[str, Any]:
    host, _, port = scope.server.rpartition(":")
    client_host, _, client_port = scope.client.rpartition(":")
    return {
        "type": "http",
        "asgi": ASGI_VERSION,
        "http_version": scope.http_version,
        "method": scope.method,
        "scheme": scope.scheme,
        "path": scope.path,
        "raw_path": scope.path.encode("utf-8"),
        "query_string": scope.query_string.encode("latin-1"),
        "root_path": "",
        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in scope.headers.items()],
        "server": (host, int(port or 0)),
        "client": (client_host, int(client_port or 0)),
    }


async def call_asgi(app: Any, *, scope: Scope, body: bytes, reply: Reply) -> None:
    """Run one request through an ASGI app and send its answer whole."""
    status = 500
    headers: list[tuple[str, str]] = []
    chunks: list[bytes] = []
    first = True

    async def receive() -> dict[str, Any]:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Future()  # never done: the front cancels the call if the client leaves
        return {"type": "http.disconnect"}  # pragma: no cover

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            headers.extend(
                (k.decode("latin-1"), v.decode("latin-1"))
                for k, v in message.get("headers", ())
                if k.lower() not in (b"content-length", b"transfer-encoding")
            )
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(_scope(scope), receive, send)
    reply.send(status, headers, b"".join(chunks))
