"""The gateway process's serving loop: the app's lifespan around two granian
listeners on one uvloop event loop, stopped gracefully by SIGTERM or SIGINT.

- the public port: the `PublicFront` under RSGI (inference, model list, refusals);
- the operational port: an ASGI app (metrics, health) under granian's ASGI
  interface, so scrapes and probes never share a port with clients.

granian runs embedded (`granian.server.embed`): both listeners, the app's clients,
watches and pollers share one event loop and one process, and the signals are ours.
Stopping: both listeners stop accepting and close idle connections, requests in
flight may finish for up to `STOP_GRACE_S` (inside Kubernetes' default 30 s
termination grace period), then the rest are dropped; a second signal drops them at
once. The lifespan ends after that.

What granian answers itself, before the app sees a request (an empty body, then the
connection closes): a malformed request line, header or framing is 400; a head past
`MAX_HEAD_BYTES` is 431 (checked as the head is read, so the exact bound depends on
how the bytes arrive); a head not complete within `HEAD_ARRIVAL_S` closes the
connection without an answer. HTTP/1.1 only: an h2c upgrade is answered in HTTP/1.1.

Clients that do not read: granian takes a whole answer, or each piece of a streamed
one, without back-pressure, and keeps it until the client reads it. So the public
listener carries the front's `client_write_timeout_s` as TCP_USER_TIMEOUT, which
accepted connections inherit: the kernel aborts a connection whose sent data stays
unacknowledged that long (including a client whose receive window stays closed),
hyper then drops the connection and the answer it held, and a stream still being
relayed fails its next write, which closes its replica's request. A client that
reads slowly but reads is not affected. For that the listening socket must exist
before granian's worker starts, as granian builds it off Linux (`_Listener`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import uvloop
from granian._granian import ListenerSpec
from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from granian.log import LogLevels
from granian.server.embed import Server

from gateway.transport.front import PublicFront

log = logging.getLogger("kama.gateway")

STOP_GRACE_S = 25.0
MAX_HEAD_BYTES = 64 * 1024
HEAD_ARRIVAL_S = 30.0
BACKLOG = 2048
MAX_CONCURRENT_REQUESTS = 16384  # granian's backpressure: long streams are many at once
# granian's own log lines go through the root logger, formatted like the gateway's
GRANIAN_LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"_granian": {"handlers": [], "propagate": True}},
}


@dataclass(frozen=True)
class Listen:
    host: str
    port: int


class _Listener(Server):
    """granian's embedded server, its listening socket built before the worker starts
    so that `write_timeout_s` (TCP_USER_TIMEOUT; 0 leaves the kernel's default) is
    set on it and inherited by every connection it accepts. On Linux granian would
    leave the socket to its worker; this builds it the way granian does elsewhere."""

    write_timeout_s: float = 0.0

    def _init_shared_socket(self) -> None:
        holder = ListenerSpec(self.bind_addr, self.bind_port, self.backlog).build()
        fd: int = holder.get_fd()
        self._shd: Any = holder
        self._sfd: Any = fd
        self._ssp = None
        if self.write_timeout_s > 0:
            listener = socket.socket(fileno=os.dup(fd))
            try:
                listener.setsockopt(
                    socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(self.write_timeout_s * 1000)
                )
            finally:
                listener.close()


def _server(
    target: Any, *, interface: Interfaces, at: Listen, write_timeout_s: float = 0.0
) -> Server:
    server = _Listener(
        target,
        address=at.host,
        port=at.port,
        interface=interface,
        http=HTTPModes.http1,
        websockets=False,
        backlog=BACKLOG,
        backpressure=MAX_CONCURRENT_REQUESTS,
        http1_settings=HTTP1Settings(
            header_read_timeout=int(HEAD_ARRIVAL_S * 1000), max_buffer_size=MAX_HEAD_BYTES
        ),
        log_dictconfig=GRANIAN_LOGGING,
        log_level=LogLevels.info,
    )
    server.write_timeout_s = write_timeout_s
    return server


async def serve(
    *,
    public: PublicFront,
    ops: Any,  # an ASGI app
    lifespan: Callable[[], AbstractAsyncContextManager[None]],
    listen: Listen,
    ops_listen: Listen,
    stop: asyncio.Event | None = None,
    grace_s: float = STOP_GRACE_S,
) -> None:
    """Serve until `stop` is set (or SIGTERM/SIGINT when it is not given)."""
    hurry = asyncio.Event()
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            (hurry if stop.is_set() else stop).set()  # a second signal: stop now

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
    async with lifespan():
        servers = [
            _server(
                public,
                interface=Interfaces.RSGI,
                at=listen,
                write_timeout_s=public.client_write_timeout_s,
            ),
            _server(ops, interface=Interfaces.ASGINL, at=ops_listen),
        ]
        running = [asyncio.create_task(server.serve()) for server in servers]
        log.info(
            "gateway listening on %s:%d (operations on %s:%d)",
            listen.host,
            listen.port,
            ops_listen.host,
            ops_listen.port,
        )
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([*running, stopping], return_when=asyncio.FIRST_COMPLETED)
            for task in running:
                if task.done():
                    task.result()  # a listener that could not start or died: raise its error
                    raise RuntimeError("a gateway listener stopped on its own")
        finally:
            stopping.cancel()
            for server in servers:
                server.stop()  # type: ignore[no-untyped-call]  # granian leaves it unannotated
            stopped: asyncio.Future[Any] = asyncio.gather(*running, return_exceptions=True)
            hurrying: asyncio.Future[Any] = asyncio.create_task(hurry.wait())
            await asyncio.wait(
                [stopped, hurrying], timeout=grace_s, return_when=asyncio.FIRST_COMPLETED
            )
            hurrying.cancel()
            for task in running:
                if not task.done():
                    log.warning("requests still in flight after the grace period are dropped")
                    task.cancel()
            for task in running:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


def run(
    *,
    public: PublicFront,
    ops: Any,
    lifespan: Callable[[], AbstractAsyncContextManager[None]],
    listen: Listen,
    ops_listen: Listen,
) -> None:
    """`serve` on uvloop until SIGTERM/SIGINT: the gateway process's main loop."""
    uvloop.run(
        serve(public=public, ops=ops, lifespan=lifespan, listen=listen, ops_listen=ops_listen)
    )
