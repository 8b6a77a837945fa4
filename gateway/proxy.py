"""Forwarding one request to one replica and relaying its answer byte for byte.

The replica is chosen by slot pressure; a connection that fails before anything was
sent is retried on another replica (the failing one stops being routed), any later
failure is the client's 502. The response is relayed as raw chunks as they come
(SSE included, no buffering); if the client goes away the upstream request is
closed, which is how llama-server learns to stop generating."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from fastapi.responses import StreamingResponse

from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.registry import Endpoint, Model, ModelRegistry
from gateway.routing import choose_endpoint
from gateway.wake import Waker
from kama.serving_plan import LLAMA_PORT

FORWARDED_REQUEST_HEADERS = ("content-type", "accept", "x-request-id")
DROPPED_RESPONSE_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "server", "date"}
)


@dataclass
class Proxy:
    registry: ModelRegistry
    http: httpx.AsyncClient
    waker: Waker
    metrics: GatewayMetrics

    async def forward(
        self,
        *,
        model: Model,
        method: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        route: str,
    ) -> StreamingResponse:
        started = time.monotonic()
        await self.waker.hold_until_ready(model)
        tried: set[str] = set()
        held_again = False
        while True:
            endpoint = choose_endpoint(model.endpoints.values(), exclude=frozenset(tried))
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
            request = self.http.build_request(
                method,
                f"http://{endpoint.ip}:{LLAMA_PORT}{path}",
                content=body,
                headers={k: v for k, v in headers.items() if k in FORWARDED_REQUEST_HEADERS},
            )
            self._begin(model, endpoint)
            sent = time.monotonic()
            try:
                upstream = await self.http.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                self._end(model, endpoint)
                self.metrics.upstream_errors.labels(model.key, "connect").inc()
                self.registry.drop_endpoint(model, endpoint)
                continue  # nothing reached the replica: safe to try another
            except httpx.HTTPError as exc:
                self._end(model, endpoint)
                self.metrics.upstream_errors.labels(model.key, type(exc).__name__).inc()
                raise GatewayError(
                    502, f"replica {endpoint.pod} failed: {type(exc).__name__}", type="api_error"
                ) from None
            endpoint.observe_latency(time.monotonic() - sent)
            response_headers = {
                k: v
                for k, v in upstream.headers.items()
                if k.lower() not in DROPPED_RESPONSE_HEADERS
            }
            response_headers["x-kama-pod"] = endpoint.pod
            response_headers["x-kama-model"] = model.key
            return StreamingResponse(
                self._relay(
                    upstream=upstream, model=model, endpoint=endpoint, route=route, started=started
                ),
                status_code=upstream.status_code,
                headers=response_headers,
            )

    def _begin(self, model: Model, endpoint: Endpoint) -> None:
        endpoint.in_flight += 1
        endpoint.served += 1
        model.in_flight += 1
        model.requests_since_report += 1
        self.metrics.in_flight.labels(model.key).inc()
        self.metrics.pod_in_flight.labels(model.key, endpoint.pod).inc()
        self.metrics.pod_requests.labels(model.key, endpoint.pod).inc()

    def _end(self, model: Model, endpoint: Endpoint) -> None:
        endpoint.in_flight -= 1
        model.in_flight -= 1
        self.metrics.in_flight.labels(model.key).dec()
        self.metrics.pod_in_flight.labels(model.key, endpoint.pod).dec()

    async def _relay(
        self,
        *,
        upstream: httpx.Response,
        model: Model,
        endpoint: Endpoint,
        route: str,
        started: float,
    ) -> AsyncIterator[bytes]:
        first = True
        try:
            async for chunk in upstream.aiter_raw():
                if first:
                    self.metrics.ttft.labels(model.key, route).observe(time.monotonic() - started)
                    first = False
                yield chunk
        except httpx.HTTPError as exc:
            self.metrics.upstream_errors.labels(model.key, type(exc).__name__).inc()
            raise  # abort the client's connection: a truncated answer must not look whole
        finally:
            await upstream.aclose()
            self._end(model, endpoint)
            self.metrics.duration.labels(model.key, route).observe(time.monotonic() - started)
            self.metrics.requests.labels(model.key, route, str(upstream.status_code)).inc()
