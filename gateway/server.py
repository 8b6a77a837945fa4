"""The gateway's HTTP/1.1 server: what accepts client connections and answers them.

Every proxied request pays for the server in front of it. Under uvicorn, the ASGI
machinery (a task, an event, message dicts and header checks per request, and a
second task to notice the client leaving) cost more CPU than the proxying itself.
This server parses with httptools (as uvicorn does) on uvloop, reads each request
whole, runs one task per request and writes answers straight onto the socket
(`gateway.connection`, `gateway.responder`). Inference requests go to the proxy;
everything else (model list, health, metrics, and the refusals of llama-server's
admin routes) to the FastAPI app through `gateway.asgi_bridge`.

The server itself keeps the clock and the Date header, sweeps connections once a
second for their deadlines, and stops gracefully: it stops accepting, closes idle
connections, lets requests in flight finish within a grace period, then drops the
rest (their requests are cancelled)."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from collections.abc import Callable

from gateway.connection import ClientConnection
from gateway.responder import Handler, Headers

log = logging.getLogger("kama.gateway")

SWEEP_INTERVAL_S = 1.0
STOP_POLL_S = 0.05
STOP_SETTLE_S = 1.0  # after dropping the last connections, for their requests to unwind

RefusalBody = Callable[[int, str], tuple[Headers, bytes]]  # the server's own 4xx/5xx


def http_date() -> bytes:
    return email.utils.formatdate(usegmt=True).encode("ascii")


class GatewayServer:
    def __init__(self, *, handle: Handler, refusal_body: RefusalBody) -> None:
        self.handle = handle
        self.refusal_body = refusal_body
        self.connections: set[ClientConnection] = set()
        self.clock = time.monotonic()
        self.date = http_date()
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, *, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientConnection(server=self), host, port, backlog=2048
        )
        self._sweep()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def _sweep(self) -> None:
        try:
            self.clock = now = time.monotonic()
            self.date = http_date()
            for connection in list(self.connections):
                connection.check_deadlines(now)
        except Exception:
            log.exception("sweeping client connections failed")
        finally:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_INTERVAL_S, self._sweep)

    async def stop(self, *, grace_s: float, hurry: asyncio.Event | None = None) -> None:
        """Stop accepting, close idle connections, let requests in flight finish
        (up to `grace_s`, or until `hurry` is set), then drop the rest."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace_s
        while self.connections and time.monotonic() < deadline:
            if hurry is not None and hurry.is_set():
                break
            for connection in list(self.connections):
                if not connection.busy and connection.lingering_since is None:
                    connection.close()
            await asyncio.sleep(STOP_POLL_S)
        for connection in list(self.connections):
            connection.abort()  # connection_lost cancels what it was answering
        settle = time.monotonic() + STOP_SETTLE_S
        while self.connections and time.monotonic() < settle:
            await asyncio.sleep(STOP_POLL_S)
        if self._sweeper is not None:
            self._sweeper.cancel()
