"""The gateway's Prometheus metrics. Labels are model, route, status code and pod;
never prompt text."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
