"""Forwarding one request to one replica and relaying its answer byte for byte.

The replica is chosen by slot pressure; a connection that fails before anything was
sent is retried on another replica (one that refused stops being routed until its pod
changes; one that timed out gets requests last for a few seconds), any later failure
is the client's 502. The answer is relayed straight onto the client's
connection as chunks arrive (SSE included, no buffering, the replica's
content-length kept when it sent one); if the client goes away the caller cancels
the relay and the unfinished upstream answer is closed, which is how llama-server
learns to stop generating."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import httpx

from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics, RequestSeries
from gateway.registry import Endpoint, Model, ModelRegistry
from gateway.responder import Responder, without_framing
from gateway.routing import choose_endpoint
from gateway.upstream import UpstreamBody, UpstreamTransport
from gateway.wake import Waker
from kama.serving_plan import LLAMA_PORT

log = logging.getLogger("kama.gateway")

FORWARDED_REQUEST_HEADERS = frozenset({b"content-type", b"accept", b"x-request-id"})
DROPPED_RESPONSE_HEADERS = frozenset(
    {b"transfer-encoding", b"content-length", b"connection", b"keep-alive", b"server", b"date"}
)
CONNECT_TIMEOUT_S = 2.0
UNREACHABLE_BACKOFF_S = 5.0  # a replica whose connection timed out gets requests last
READ_TIMEOUT_S = 600.0  # between two pieces of an answer, not for the whole answer

Headers = list[tuple[bytes, bytes]]


@dataclass
class Proxy:
    registry: ModelRegistry
    upstream: UpstreamTransport
    waker: Waker
    metrics: GatewayMetrics

    async def forward(
        self,
        *,
        model: Model,
        method: str,
        path: str,
        body: bytes,
        headers: Headers,
        route: str,
    ) -> Relay:
        started = time.monotonic()
        if not model.endpoints:
            await self.waker.hold_until_ready(model)
        forwarded = [(k, v) for k, v in headers if k in FORWARDED_REQUEST_HEADERS]
        tried: set[str] = set()
        held_again = False
        while True:
            endpoint = choose_endpoint(
                model.endpoints.values(), exclude=frozenset(tried), now=time.monotonic()
            )
            if endpoint is None:
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
            tried.add(endpoint.pod)
            series = self.metrics.series(model=model.key, route=route, pod=endpoint.pod)
            self.begin_request(model, endpoint, series)
            sent = time.monotonic()
            try:
                upstream = await self.upstream.request(
                    host=endpoint.ip,
                    port=LLAMA_PORT,
                    method=method,
                    target=path,
                    headers=forwarded,
                    body=body,
                    connect_timeout=CONNECT_TIMEOUT_S,
                    read_timeout=READ_TIMEOUT_S,
                )
            except httpx.ConnectTimeout:
                # slow, not gone (an overloaded node): others first for a while
                self.end_request(model, endpoint, series)
                self.metrics.upstream_errors.labels(model.key, "connect_timeout").inc()
                endpoint.unreachable_until = time.monotonic() + UNREACHABLE_BACKOFF_S
                log.warning("connecting to %s of %s timed out", endpoint.pod, model.key)
                continue  # nothing reached the replica: safe to try another
            except httpx.ConnectError as exc:
                # refused: its llama-server is gone, and the pod's watch will say so
                self.end_request(model, endpoint, series)
                self.metrics.upstream_errors.labels(model.key, "connect").inc()
                self.registry.drop_endpoint(model, endpoint)
                log.warning("%s of %s refused the connection: %s", endpoint.pod, model.key, exc)
                continue  # nothing reached the replica: safe to try another
            except httpx.HTTPError as exc:
                self.end_request(model, endpoint, series)
                self.metrics.upstream_errors.labels(model.key, type(exc).__name__).inc()
                log.warning("%s of %s failed before answering: %r", endpoint.pod, model.key, exc)
                raise GatewayError(
                    502, f"replica {endpoint.pod} failed: {type(exc).__name__}", type="api_error"
                ) from None
            except BaseException:  # cancelled: the client left while the replica worked
                self.end_request(model, endpoint, series)
                raise
            endpoint.observe_latency(time.monotonic() - sent)
            return Relay(
                proxy=self,
                upstream=upstream,
                model=model,
                endpoint=endpoint,
                series=series,
                route=route,
                started=started,
            )

    def begin_request(self, model: Model, endpoint: Endpoint, series: RequestSeries) -> None:
        endpoint.in_flight += 1
        endpoint.served += 1
        model.in_flight += 1
        model.requests_since_report += 1
        series.begin()

    def end_request(self, model: Model, endpoint: Endpoint, series: RequestSeries) -> None:
        endpoint.in_flight -= 1
        model.in_flight -= 1
        series.end()


@dataclass
class Relay:
    """One replica's answer, relayed to one client."""

    proxy: Proxy
    upstream: UpstreamBody
    model: Model
    endpoint: Endpoint
    series: RequestSeries
    route: str
    started: float

    def response_headers(self) -> tuple[Headers, int | None]:
        """The replica's headers to pass on, and its content-length if it sent one
        (the server writes the framing itself)."""
        headers, length = without_framing(self.upstream.headers, dropped=DROPPED_RESPONSE_HEADERS)
        headers.append((b"x-kama-pod", self.endpoint.pod.encode()))
        headers.append((b"x-kama-model", self.model.key.encode()))
        return headers, length

    async def send_to(self, responder: Responder) -> None:
        """Relay the answer onto the client's connection. The server cancels this if
        the client goes away; closing the unfinished upstream answer is then what
        tells llama-server to stop."""
        status = self.upstream.status
        headers, length = self.response_headers()
        try:
            whole = self.upstream.take_whole_body()
            if whole is not None:  # a short answer that is all here: one write
                self.series.ttft.observe(time.monotonic() - self.started)
                responder.send_whole(status, headers, whole)
                return
            responder.start(status, headers, content_length=length)
            first = True
            async for chunk in self.upstream:
                if first:
                    self.series.ttft.observe(time.monotonic() - self.started)
                    first = False
                await responder.write(chunk)
            responder.end()
        except httpx.HTTPError as exc:
            self.proxy.metrics.upstream_errors.labels(self.model.key, type(exc).__name__).inc()
            # the server closes the client's connection: a truncated answer must not look whole
            raise ConnectionAbortedError(
                f"replica {self.endpoint.pod} of {self.model.key} failed mid-answer: {exc!r}"
            ) from exc
        finally:
            await self.upstream.aclose()
            self.proxy.end_request(self.model, self.endpoint, self.series)
            self.series.duration.observe(time.monotonic() - self.started)
            self.proxy.metrics.count_request(
                model=self.model.key, route=self.route, code=str(status)
            )
