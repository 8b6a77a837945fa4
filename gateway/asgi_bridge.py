"""Running the gateway's FastAPI app (model list, health, metrics, refusals) on the
gateway's own server: one ASGI call per request, and the ASGI lifespan around the
server's life. Only what these routes use is supported: HTTP, bodies read whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.types import ASGIApp, Message

from gateway.responder import Request, Responder, without_framing

ASGI_VERSION = {"version": "3.0", "spec_version": "2.3"}


async def call_asgi(app: ASGIApp, request: Request, responder: Responder) -> None:
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": ASGI_VERSION,
        "http_version": request.http_version,
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.raw_path,
        "query_string": request.query,
        "root_path": "",
        "headers": request.headers,
        "server": None,
        "client": None,
    }
    body_sent = False
    status = 500
    headers: list[tuple[bytes, bytes]] = []
    gone = asyncio.Event()

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await gone.wait()  # never set: the server cancels this call if the client leaves
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = list(message.get("headers", []))
            return
        if message["type"] != "http.response.body":
            return
        body, more = message.get("body", b""), message.get("more_body", False)
        if not responder.started:
            rest, length = without_framing(headers)
            if not more:
                responder.send_whole(status, rest, body)
                return
            responder.start(status, rest, content_length=length)
        await responder.write(body)
        if not more:
            responder.end()

    await app(scope, receive, send)


@asynccontextmanager
async def asgi_lifespan(app: ASGIApp) -> AsyncIterator[None]:
    """The app's startup before the server listens, its shutdown after it stops; a
    failed startup or shutdown raises here."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()

    async def receive() -> Message:
        return await inbox.get()

    async def send(message: Message) -> None:
        await outbox.put(message)

    async def run() -> None:
        await app({"type": "lifespan", "asgi": ASGI_VERSION, "state": {}}, receive, send)

    task = asyncio.create_task(run())
    await inbox.put({"type": "lifespan.startup"})
    await _expect(task, outbox, "lifespan.startup.complete")
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await _expect(task, outbox, "lifespan.shutdown.complete")
        await task


async def _expect(task: asyncio.Task[None], outbox: asyncio.Queue[Message], wanted: str) -> None:
    getting = asyncio.ensure_future(outbox.get())
    await asyncio.wait({getting, task}, return_when=asyncio.FIRST_COMPLETED)
    if not getting.done():
        getting.cancel()
        task.result()  # the app's lifespan raised: raise it here
        raise RuntimeError(f"the app's lifespan ended instead of sending {wanted}")
    reply = getting.result()
    if reply["type"] != wanted:
        await asyncio.wait({task}, timeout=1.0)  # it raises after reporting the failure
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the message below says what failed
        raise RuntimeError(f"the app's lifespan failed: {reply.get('message', reply['type'])}")
