"""The gateway's Prometheus metrics. Labels are model, route, status code and pod;
never prompt text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MAX_CACHED_SERIES = 4096


@dataclass(frozen=True)
class RequestSeries:
    """The labelled series one proxied request updates (looked up once per
    model, route and pod rather than on every request)."""

    in_flight: Any
    pod_in_flight: Any
    pod_requests: Any
    ttft: Any
    duration: Any


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._series: dict[tuple[str, str, str], RequestSeries] = {}
        r = self.registry
        self.requests = Counter(
            "kama_gateway_requests", "Requests answered", ["model", "route", "code"], registry=r
        )
        self.in_flight = Gauge(
            "kama_gateway_in_flight", "Requests being proxied", ["model"], registry=r
        )
        self.queued = Gauge(
            "kama_gateway_queued", "Requests held for a replica", ["model"], registry=r
        )
        self.queue_wait = Histogram(
            "kama_gateway_queue_wait_seconds", "Time held for a replica", ["model"], registry=r
        )
        self.ttft = Histogram(
            "kama_gateway_time_to_first_byte_seconds",
            "Time to the first response byte from upstream",
            ["model", "route"],
            registry=r,
        )
        self.duration = Histogram(
            "kama_gateway_request_duration_seconds",
            "Whole request duration",
            ["model", "route"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "kama_gateway_upstream_errors", "Upstream failures", ["model", "kind"], registry=r
        )
        self.cold_starts = Counter(
            "kama_gateway_cold_starts", "Wake workflows started", ["model"], registry=r
        )
        self.cold_start_duration = Histogram(
            "kama_gateway_cold_start_seconds",
            "From the first held request to a ready replica",
            ["model"],
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.pod_in_flight = Gauge(
            "kama_gateway_pod_in_flight", "Requests in flight per pod", ["model", "pod"], registry=r
        )
        self.pod_requests = Counter(
            "kama_gateway_pod_requests", "Requests sent per pod", ["model", "pod"], registry=r
        )

    def series(self, *, model: str, route: str, pod: str) -> RequestSeries:
        key = (model, route, pod)
        found = self._series.get(key)
        if found is None:
            if len(self._series) >= MAX_CACHED_SERIES:
                self._series.clear()
            found = RequestSeries(
                in_flight=self.in_flight.labels(model),
                pod_in_flight=self.pod_in_flight.labels(model, pod),
                pod_requests=self.pod_requests.labels(model, pod),
                ttft=self.ttft.labels(model, route),
                duration=self.duration.labels(model, route),
            )
            self._series[key] = found
        return found
