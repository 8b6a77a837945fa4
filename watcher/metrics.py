"""The watcher's own Prometheus metrics: what it saw and what it told the workflows.

- `kama_watcher_events_total{resource,type}`: objects delivered by the watches
  (ADDED, MODIFIED, DELETED, and SYNC for every object a (re-)list replays);
- `kama_watcher_events_skipped_total{reason}`: events not handled on their own:
  `coalesced` (a later event of the same object, or of a pod of the same deployment,
  replaced it while it waited) or `unchanged` (a pod write that changed nothing a
  workflow reads);
- `kama_watcher_nudges_total{kind,outcome}`: signal-with-starts of an entity workflow
  (`ok`, or `error`: the event is retried after a pause);
- `kama_watcher_signals_total{signal,outcome}`: signals to a deployment's workflow on
  behalf of its pods and artifact (`ok`, `not_found`: no workflow to tell, `error`);
- `kama_watcher_watch_restarts_total{collection,reason}`: re-lists after an expired
  resourceVersion (`gone`) or a failed watch (`error`), read from `WatchHealth`;
- `kama_watcher_watch_ready{collection}`: 1 while the collection is listed and watched.

Labels are resource kinds, event types and signal names: never object names, so the
number of series does not grow with the number of models."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from informer.watch import WatchHealth


class WatchHealthCollector(Collector):
    """Restarts and readiness of each watched collection, read at scrape time."""

    def __init__(self, *, health: WatchHealth) -> None:
        self.health = health

    def collect(self) -> Iterator[Metric]:
        restarts = CounterMetricFamily(
            "kama_watcher_watch_restarts",
            "Re-lists of a watched collection, by reason (gone: resourceVersion expired)",
            labels=["collection", "reason"],
        )
        ready = GaugeMetricFamily(
            "kama_watcher_watch_ready",
            "Whether the collection is listed and its watch connected",
            labels=["collection"],
        )
        for name, collection in self.health.snapshot().items():
            for reason, count in sorted(collection.restarts.items()):
                restarts.add_metric([name, reason], count)
            ready.add_metric([name], 1.0 if collection.connected() else 0.0)
        yield restarts
        yield ready


class WatcherMetrics:
    """The watcher's metrics in a registry of their own (a test builds as many as it
    likes; the process serves one)."""

    def __init__(self, *, health: WatchHealth | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.events = Counter(
            "kama_watcher_events",
            "Objects delivered by the watches, by resource and event type",
            ["resource", "type"],
            registry=self.registry,
        )
        self.skips = Counter(
            "kama_watcher_events_skipped",
            "Events not handled on their own, by reason (coalesced, unchanged)",
            ["reason"],
            registry=self.registry,
        )
        self.nudges = Counter(
            "kama_watcher_nudges",
            "Signal-with-starts of entity workflows, by kind and outcome",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.signals = Counter(
            "kama_watcher_signals",
            "Signals to deployment workflows about their pods and artifact, by outcome",
            ["signal", "outcome"],
            registry=self.registry,
        )
        if health is not None:
            self.registry.register(WatchHealthCollector(health=health))

    def event(self, *, resource: str, type: str) -> None:
        self.events.labels(resource=resource, type=type).inc()

    def skipped(self, *, reason: str) -> None:
        self.skips.labels(reason=reason).inc()

    def nudged(self, *, kind: str, outcome: str) -> None:
        self.nudges.labels(kind=kind, outcome=outcome).inc()

    def signalled(self, *, signal: str, outcome: str) -> None:
        self.signals.labels(signal=signal, outcome=outcome).inc()
