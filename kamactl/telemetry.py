"""Prometheus endpoints of the worker and the watcher, two per process:

- Kama's own metrics (`KAMA_METRICS_PORT`): a prometheus_client registry of the
  process (the watcher's watch events and nudges, the worker's workflows by type and
  state), served by prometheus_client's HTTP server at `/metrics`;
- the Temporal SDK's metrics (`KAMA_TEMPORAL_METRICS_PORT`): workflow and activity task
  latencies, failures, poller counts, sticky-cache hits, exported by the SDK's Rust core
  through the runtime's telemetry configuration (`temporal_` prefixed).

The SDK serves its own endpoint from its own thread; merging both into one response
would put a scrape of the SDK in the path of every scrape of Kama. The runtime with
the Prometheus exporter must be the process's default before the first client
connects, hence `install_temporal_metrics` runs before any `Client.connect`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

log = logging.getLogger("kama.telemetry")

SDK_METRIC_PREFIX: Final = "temporal_"


@dataclass(frozen=True)
class MetricsEndpoint:
    """A running `/metrics` server; `close()` stops it."""

    host: str
    port: int
    server: WSGIServer

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def install_temporal_metrics(*, host: str, port: int | None) -> Runtime | None:
    """Make a runtime exporting the SDK's metrics on `host:port` the default of this
    process (no-op without a port); every client connected afterwards reports into
    it. The runtime, or None."""
    if port is None:
        return None
    runtime = Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(
                bind_address=f"{_bracketed(host)}:{port}",
                counters_total_suffix=True,  # what Prometheus naming expects of counters
                durations_as_seconds=True,
            ),
            metric_prefix=SDK_METRIC_PREFIX,
        )
    )
    Runtime.set_default(runtime, error_if_already_set=True)
    log.info("Temporal SDK metrics on %s:%d/metrics", host, port)
    return runtime


def serve_metrics(
    *, registry: CollectorRegistry, host: str, port: int | None
) -> MetricsEndpoint | None:
    """Serve `registry` at `http://host:port/metrics` from a daemon thread (no-op
    without a port)."""
    if port is None:
        return None
    server, _thread = start_http_server(port, addr=host, registry=registry)
    log.info("Kama metrics on %s:%d/metrics", host, port)
    return MetricsEndpoint(host=host, port=port, server=server)


def _bracketed(host: str) -> str:
    """An IPv6 address in a socket address needs brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
