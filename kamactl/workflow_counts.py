"""`kama_workflows{workflow_type,status}`: how many of Kama's workflows Temporal's
visibility store holds, by type and execution status, as the worker's own metric.

The SDK's metrics say what one worker did (tasks, latencies, failures); they cannot
say how many deployments are being kept or how many imports failed, because those
are facts of the namespace, not of a process. The worker asks visibility for them:
one count per workflow type, grouped by ExecutionStatus, every `REFRESH_S`, filtered
to the worker's task queue (the queue carries the cluster identity, so two clusters
sharing a Temporal namespace count only their own). Closed workflows count until the
namespace's retention removes them. Every worker replica reports the same numbers:
aggregate with `max`, not `sum`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from temporalio import workflow
from temporalio.client import Client

from kama.config import Settings
from kamactl.telemetry import serve_metrics

log = logging.getLogger("kama.metrics")

REFRESH_S: Final = 30.0
QUERY_TIMEOUT: Final = timedelta(seconds=10)


def workflow_type_names(classes: Iterable[type]) -> list[str]:
    """The registered names of workflow classes (`@workflow.defn(name=...)`)."""
    # the SDK keeps the definition on the class; `_Definition` is how it reads it too
    return [workflow._Definition.must_from_class(cls).name or cls.__name__ for cls in classes]


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def count_query(*, task_queue: str, workflow_type: str) -> str:
    """The visibility query counting one type's workflows on one queue, by status."""
    return (
        f"TaskQueue = {_quoted(task_queue)} AND WorkflowType = {_quoted(workflow_type)} "
        "GROUP BY ExecutionStatus"
    )


@dataclass(eq=False)  # registered with prometheus_client, which hashes collectors
class WorkflowCounts(Collector):
    """The last counts, exported at scrape time; `refreshed_at` is a Unix time."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    refreshed_at: float | None = None

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "kama_workflows",
            "Kama's workflows in Temporal visibility, by type and execution status",
            labels=["workflow_type", "status"],
        )
        for (workflow_type, status), count in sorted(self.counts.items()):
            gauge.add_metric([workflow_type, status], count)
        yield gauge
        if self.refreshed_at is not None:
            yield GaugeMetricFamily(
                "kama_workflows_refreshed_timestamp_seconds",
                "When kama_workflows was last counted",
                value=self.refreshed_at,
            )

    def replace(self, counts: dict[tuple[str, str], int]) -> None:
        self.counts = counts
        self.refreshed_at = time.time()


async def count_once(
    *, client: Client, task_queue: str, workflow_types: Sequence[str]
) -> dict[tuple[str, str], int]:
    """Count every type's workflows by status (types with none are absent)."""
    counts: dict[tuple[str, str], int] = {}
    for workflow_type in workflow_types:
        result = await client.count_workflows(
            count_query(task_queue=task_queue, workflow_type=workflow_type),
            rpc_timeout=QUERY_TIMEOUT,
        )
        for group in result.groups:
            status = str(group.group_values[0]) if group.group_values else "Unknown"
            counts[(workflow_type, status)] = group.count
    return counts


async def keep_counting(
    *,
    client: Client,
    task_queue: str,
    workflow_types: Sequence[str],
    into: WorkflowCounts,
    every_s: float = REFRESH_S,
) -> None:
    """Refresh `into` every `every_s` until cancelled; a failed count keeps the last
    numbers (their timestamp shows how old they are) and is logged once per failure
    streak."""
    failing = False
    while True:
        try:
            into.replace(
                await count_once(
                    client=client, task_queue=task_queue, workflow_types=workflow_types
                )
            )
            failing = False
        except Exception as exc:
            if not failing:
                log.warning(
                    "counting workflows in visibility failed (%s); keeping last counts", exc
                )
            failing = True
        await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def worker_metrics(
    *, client: Client, settings: Settings, task_queue: str, workflows: Iterable[type]
) -> AsyncIterator[WorkflowCounts]:
    """Serve the worker's own metrics (`KAMA_METRICS_PORT`) and keep `kama_workflows`
    counted while the block runs; nothing without a metrics port."""
    counts = WorkflowCounts()
    registry = CollectorRegistry(auto_describe=True)
    registry.register(counts)
    endpoint = serve_metrics(
        registry=registry, host=settings.health_host, port=settings.metrics_port
    )
    if endpoint is None:
        yield counts
        return
    task = asyncio.create_task(
        keep_counting(
            client=client,
            task_queue=task_queue,
            workflow_types=workflow_type_names(workflows),
            into=counts,
        ),
        name="kama-workflow-counts",
    )
    try:
        yield counts
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        endpoint.close()
