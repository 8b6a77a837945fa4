"""The `kama gateway` process: the app's lifespan (watches, Temporal client,
pollers) around the gateway's server, on uvloop, stopped gracefully by SIGTERM or
SIGINT (requests in flight may finish; new connections are refused; a second
signal drops them)."""

from __future__ import annotations

import asyncio
import logging
import signal

import uvloop

from gateway.asgi_bridge import asgi_lifespan
from gateway.errors import server_refusal
from gateway.inference import GatewayHandler
from gateway.server import GatewayServer

log = logging.getLogger("kama.gateway")

STOP_GRACE_S = 25.0  # inside Kubernetes' default 30 s termination grace period


async def serve_gateway(handler: GatewayHandler, *, host: str, port: int) -> None:
    stop, hurry = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        (hurry if stop.is_set() else stop).set()  # a second signal: stop now

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    async with asgi_lifespan(handler.app):
        server = GatewayServer(handle=handler, refusal_body=server_refusal)
        await server.start(host=host, port=port)
        log.info("gateway listening on %s:%d", host, server.port)
        await stop.wait()
        await server.stop(grace_s=STOP_GRACE_S, hurry=hurry)


def run_gateway(handler: GatewayHandler, *, host: str, port: int) -> None:
    uvloop.run(serve_gateway(handler, host=host, port=port))
