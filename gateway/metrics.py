"""The gateway's Prometheus metrics. Labels are model, route, status code and pod,
and an API key's namespace and name (`KeyUsageSeries`); never prompt text, never a
key or its hash.

The series every proxied request touches (requests by code, in-flight per model
and per pod, requests per pod, time to first byte, duration) are plain numbers
updated in place and turned into metric families only when `/metrics` is scraped:
prometheus_client's labelled metrics take a lock and a label lookup per update,
which added up to more CPU per request than routing it. The rest (queue, cold
starts, upstream errors) are ordinary prometheus_client metrics."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

LATENCY_BUCKETS = Histogram.DEFAULT_BUCKETS[:-1]  # seconds; +Inf is implied


class LatencyHistogram:
    """A Prometheus histogram without a lock (the event loop is its only writer)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, float]]:
        cumulative, running = [], 0
        for bound, count in zip([*map(str, LATENCY_BUCKETS), "+Inf"], self.counts, strict=True):
            running += count
            cumulative.append((bound, float(running)))
        return cumulative


@dataclass(slots=True)
class Level:
    value: int = 0


@dataclass(slots=True)
class PodLoad:
    in_flight: int = 0
    requests: int = 0


@dataclass(frozen=True, slots=True)
class RequestSeries:
    """What one proxied request updates, looked up once per model, route and pod."""

    model_in_flight: Level
    pod: PodLoad
    ttft: LatencyHistogram
    duration: LatencyHistogram

    def begin(self) -> None:
        self.model_in_flight.value += 1
        self.pod.in_flight += 1
        self.pod.requests += 1

    def end(self) -> None:
        self.model_in_flight.value -= 1
        self.pod.in_flight -= 1


@dataclass(eq=False)  # registered with prometheus_client, which hashes collectors
class HotPathSeries:
    """The per-request series, exported by `collect` at scrape time."""

    requests: dict[tuple[str, str, str], int] = field(default_factory=dict)
    model_in_flight: dict[str, Level] = field(default_factory=dict)
    pods: dict[tuple[str, str], PodLoad] = field(default_factory=dict)
    ttft: dict[tuple[str, str], LatencyHistogram] = field(default_factory=dict)
    duration: dict[tuple[str, str], LatencyHistogram] = field(default_factory=dict)

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "kama_gateway_requests", "Requests answered", labels=["model", "route", "code"]
        )
        for labels, count in self.requests.items():
            requests.add_metric(labels, count)
        in_flight = GaugeMetricFamily(
            "kama_gateway_in_flight", "Requests being proxied", labels=["model"]
        )
        for model, level in self.model_in_flight.items():
            in_flight.add_metric([model], level.value)
        pod_in_flight = GaugeMetricFamily(
            "kama_gateway_pod_in_flight", "Requests in flight per pod", labels=["model", "pod"]
        )
        pod_requests = CounterMetricFamily(
            "kama_gateway_pod_requests", "Requests sent per pod", labels=["model", "pod"]
        )
        for (model, pod), load in self.pods.items():
            pod_in_flight.add_metric([model, pod], load.in_flight)
            pod_requests.add_metric([model, pod], load.requests)
        yield from (requests, in_flight, pod_in_flight, pod_requests)
        for name, doc, histograms in (
            (
                "kama_gateway_time_to_first_byte_seconds",
                "Time to the first response byte from upstream",
                self.ttft,
            ),
            ("kama_gateway_request_duration_seconds", "Whole request duration", self.duration),
        ):
            family = HistogramMetricFamily(name, doc, labels=["model", "route"])
            for (model, route), histogram in histograms.items():
                family.add_metric([model, route], histogram.buckets(), histogram.total)
            yield family


@dataclass(slots=True)
class KeyUsage:
    """What one API key (a ModelAccessKey) used, for chargeback."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    limited: dict[str, int] = field(default_factory=dict)  # refusals by limit


@dataclass(eq=False)  # registered with prometheus_client, which hashes collectors
class KeyUsageSeries:
    """Per-key usage, labelled by the ModelAccessKey's namespace and name (never the
    key or its hash); a key's series go when the key does, so memory follows the keys
    that exist."""

    keys: dict[tuple[str, str], KeyUsage] = field(default_factory=dict)

    def of(self, *, namespace: str, name: str) -> KeyUsage:
        return self.keys.setdefault((namespace, name), KeyUsage())

    def forget(self, *, namespace: str, name: str) -> None:
        self.keys.pop((namespace, name), None)

    def collect(self) -> Iterator[Metric]:
        labels = ["key_namespace", "key"]
        requests = CounterMetricFamily(
            "kama_gateway_key_requests", "Requests admitted per API key", labels=labels
        )
        prompt = CounterMetricFamily(
            "kama_gateway_key_prompt_tokens",
            "Prompt tokens per API key, as the models reported them",
            labels=labels,
        )
        completion = CounterMetricFamily(
            "kama_gateway_key_completion_tokens",
            "Completion tokens per API key, as the models reported them",
            labels=labels,
        )
        limited = CounterMetricFamily(
            "kama_gateway_key_rate_limited",
            "Requests refused (429) by a per-key limit",
            labels=[*labels, "limit"],
        )
        for (namespace, name), usage in self.keys.items():
            requests.add_metric([namespace, name], usage.requests)
            prompt.add_metric([namespace, name], usage.prompt_tokens)
            completion.add_metric([namespace, name], usage.completion_tokens)
            for limit, count in usage.limited.items():
                limited.add_metric([namespace, name, limit], count)
        yield from (requests, prompt, completion, limited)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.hot = HotPathSeries()
        self.registry.register(self.hot)
        self.keys = KeyUsageSeries()
        self.registry.register(self.keys)
        self._series: dict[tuple[str, str, str], RequestSeries] = {}
        r = self.registry
        self.watch_failing = Gauge(
            "kama_gateway_watch_failing_seconds",
            "How long each watch has failed in a row (0: connected); the gateway routes "
            "from its last listing meanwhile",
            ["collection"],
            registry=r,
        )
        self.queued = Gauge(
            "kama_gateway_queued", "Requests held for a replica", ["model"], registry=r
        )
        self.held_bytes = Gauge(
            "kama_gateway_held_bytes",
            "Bytes of request bodies held for a replica or a free slot",
            registry=r,
        )
        self.slot_waiting = Gauge(
            "kama_gateway_slot_waiting",
            "Requests waiting for a free slot on a ready replica",
            ["model"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "kama_gateway_queue_wait_seconds", "Time held for a replica", ["model"], registry=r
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

    def count_request(self, *, model: str, route: str, code: str) -> None:
        key = (model, route, code)
        self.hot.requests[key] = self.hot.requests.get(key, 0) + 1

    def series(self, *, model: str, route: str, pod: str) -> RequestSeries:
        key = (model, route, pod)
        found = self._series.get(key)
        if found is None:
            hot = self.hot
            found = RequestSeries(
                model_in_flight=hot.model_in_flight.setdefault(model, Level()),
                pod=hot.pods.setdefault((model, pod), PodLoad()),
                ttft=hot.ttft.setdefault((model, route), LatencyHistogram()),
                duration=hot.duration.setdefault((model, route), LatencyHistogram()),
            )
            self._series[key] = found
        return found

    def forget_pod(self, model: str, pod: str) -> None:
        """A pod is gone: drop its per-pod series (requests still in flight there
        finish on their own copy; the per-model and per-route series keep counting)."""
        self.hot.pods.pop((model, pod), None)
        for key in [k for k in self._series if k[0] == model and k[2] == pod]:
            del self._series[key]
