"""How entity workflows call Kubernetes activities: one timeout and retry policy,
named here, so every workflow treats the API server the same way."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

KUBE_TIMEOUT = timedelta(seconds=30)
KUBE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=20)
)


async def call_kube(method: Any, argument: Any) -> Any:
    """Run one Kubernetes activity on the workflow's own (control) task queue."""
    return await workflow.execute_activity_method(
        method, argument, start_to_close_timeout=KUBE_TIMEOUT, retry_policy=KUBE_RETRY
    )


def start_kube(method: Any, argument: Any) -> Any:
    """Start one Kubernetes activity without waiting for it (the caller awaits the
    returned handle later)."""
    return workflow.start_activity_method(
        method, argument, start_to_close_timeout=KUBE_TIMEOUT, retry_policy=KUBE_RETRY
    )
