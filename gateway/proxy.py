"""Forwarding one request to one replica and relaying its answer byte for byte.

The replica comes from the registry as a lease (released once, in one `finally`,
whatever happens). A connection that fails before anything was sent is retried on
another replica (one that refused stops being routed until its pod changes; one
that timed out gets requests last for a few seconds); any later failure is the
client's 502. The answer is relayed as chunks arrive (SSE included, no buffering,
the replica's content-length kept when it sent one). If the client goes away the
front cancels the request and the unfinished upstream answer is closed, which is
how llama-server learns to stop generating. A replica that fails mid-answer cannot
be reported in the status any more: a length-framed answer ends short (the client
sees the connection close early), and an event stream gets a last event in the
OpenAI error shape, which OpenAI clients raise."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import httpx

from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.registry import Lease, Model, ModelRegistry
from gateway.transport.exchange import HeaderLookup, Headers, Reply
from gateway.transport.upstream import UpstreamBody, UpstreamTransport
from kama.serving_plan import LLAMA_PORT

log = logging.getLogger("kama.gateway")

FORWARDED_REQUEST_HEADERS = tuple(
    (name, name.encode()) for name in ("content-type", "accept", "x-request-id")
)
DROPPED_RESPONSE_HEADERS = frozenset(
    {b"transfer-encoding", b"content-length", b"connection", b"keep-alive", b"server", b"date"}
)
CONNECT_TIMEOUT_S = 2.0
UNREACHABLE_BACKOFF_S = 5.0  # a replica whose connection timed out gets requests last
READ_TIMEOUT_S = 600.0  # between two pieces of an answer, not for the whole answer


class Holder(Protocol):
    """What the proxy needs of the wake queue: wait until a model has a replica."""

    async def hold_until_ready(self, model: Model) -> None: ...


def forwarded_headers(headers: HeaderLookup) -> list[tuple[bytes, bytes]]:
    forwarded = []
    for name, raw in FORWARDED_REQUEST_HEADERS:
        value = headers.get(name)
        if value is not None:
            forwarded.append((raw, value.encode("latin-1")))
    return forwarded


@dataclass
class Proxy:
    registry: ModelRegistry
    upstream: UpstreamTransport
    waker: Holder
    replica_port: int = LLAMA_PORT

    async def forward(
        self,
        *,
        model: Model,
        method: str,
        path: str,
        body: bytes,
        headers: HeaderLookup,
        route: str,
        reply: Reply,
    ) -> None:
        """Answer `reply` from a replica of `model`, or raise GatewayError."""
        started = time.monotonic()
        if not model.endpoints:
            await self.waker.hold_until_ready(model)
        forwarded = forwarded_headers(headers)
        tried: set[str] = set()
        held_again = False
        while True:
            lease = self.registry.acquire(model, route=route, exclude=tried, now=time.monotonic())
            if lease is None:
                if not tried and not held_again:  # the replicas left since the hold
                    await self.waker.hold_until_ready(model)
                    held_again = True
                    continue
                raise GatewayError(
                    502,
                    f"no replica of {model.key} accepted the connection",
                    type="api_error",
                    code="upstream_unavailable",
                )
            tried.add(lease.endpoint.pod)
            try:
                upstream = await self._send(
                    lease, method=method, path=path, headers=forwarded, body=body
                )
                if upstream is None:
                    continue  # nothing reached that replica: another one may take it
                relay = Relay(
                    lease=lease, upstream=upstream, metrics=self.registry.metrics, started=started
                )
                await relay.to(reply)
                return
            finally:
                lease.release()

    async def _send(
        self,
        lease: Lease,
        *,
        method: str,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> UpstreamBody | None:
        """The replica's answer once its head is in; None if the connection failed
        before anything was sent (safe to try another replica)."""
        model, endpoint = lease.model, lease.endpoint
        errors = self.registry.metrics.upstream_errors
        sent = time.monotonic()
        try:
            upstream = await self.upstream.request(
                host=endpoint.ip,
                port=self.replica_port,
                method=method,
                target=path,
                headers=headers,
                body=body,
                connect_timeout=CONNECT_TIMEOUT_S,
                read_timeout=READ_TIMEOUT_S,
            )
        except httpx.ConnectTimeout:
            # slow, not gone (an overloaded node): others first for a while
            errors.labels(model.key, "connect_timeout").inc()
            endpoint.unreachable_until = time.monotonic() + UNREACHABLE_BACKOFF_S
            log.warning("connecting to %s of %s timed out", endpoint.pod, model.key)
            return None
        except httpx.ConnectError as exc:
            # refused: its llama-server is gone, and the pod's watch will say so
            errors.labels(model.key, "connect").inc()
            self.registry.drop_endpoint(model, endpoint)
            log.warning("%s of %s refused the connection: %s", endpoint.pod, model.key, exc)
            return None
        except httpx.HTTPError as exc:
            errors.labels(model.key, type(exc).__name__).inc()
            log.warning("%s of %s failed before answering: %r", endpoint.pod, model.key, exc)
            raise GatewayError(
                502, f"replica {endpoint.pod} failed: {type(exc).__name__}", type="api_error"
            ) from None
        endpoint.observe_latency(time.monotonic() - sent)
        return upstream


@dataclass
class Relay:
    """One replica's answer, relayed to one client."""

    lease: Lease
    upstream: UpstreamBody
    metrics: GatewayMetrics
    started: float

    def response_headers(self) -> tuple[Headers, str | None]:
        """The replica's headers to pass on, and its content-length if it sent one."""
        headers: Headers = []
        length = None
        for name, value in self.upstream.headers:
            lower = name.lower()
            if lower == b"content-length":
                length = value.decode("latin-1")
            elif lower not in DROPPED_RESPONSE_HEADERS:
                headers.append((lower.decode("latin-1"), value.decode("latin-1")))
        headers.append(("x-kama-pod", self.lease.endpoint.pod))
        headers.append(("x-kama-model", self.lease.model.key))
        return headers, length

    async def to(self, reply: Reply) -> None:
        series = self.lease.series
        headers, length = self.response_headers()
        try:
            whole = self.upstream.take_whole_body()
            if whole is not None:  # a short answer that is all here: one write
                series.ttft.observe(time.monotonic() - self.started)
                reply.send(self.upstream.status, headers, whole)
                return
            if length is not None:
                headers.append(("content-length", length))
            reply.start(self.upstream.status, headers)
            first = True
            async for chunk in self.upstream:
                if first:
                    series.ttft.observe(time.monotonic() - self.started)
                    first = False
                await reply.write(chunk)
        except httpx.HTTPError as exc:
            self.metrics.upstream_errors.labels(self.lease.model.key, type(exc).__name__).inc()
            log.warning(
                "replica %s of %s failed mid-answer: %r",
                self.lease.endpoint.pod,
                self.lease.model.key,
                exc,
            )
            if length is None and _is_event_stream(headers):
                await reply.write(self._error_event(exc))
        finally:
            await self.upstream.aclose()
            series.duration.observe(time.monotonic() - self.started)

    def _error_event(self, exc: httpx.HTTPError) -> bytes:
        error = GatewayError(
            502,
            f"replica {self.lease.endpoint.pod} failed mid-answer: {type(exc).__name__}",
            type="api_error",
            code="upstream_failed",
        )
        return b"data: " + json.dumps(error.shape()).encode() + b"\n\n"


def _is_event_stream(headers: Headers) -> bool:
    return any(name == "content-type" and v.startswith("text/event-stream") for name, v in headers)
