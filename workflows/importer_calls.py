"""How workflows call activities on an importer's task queue: next to the volume,
where the source token, the cache and the source claim are readable. Each kind of
call has one named timeout/retry/heartbeat policy."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

RESOLVE_TIMEOUT = timedelta(minutes=2)
SOURCE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=10,
)
DOWNLOAD_TIMEOUT = timedelta(hours=6)
DOWNLOAD_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
DOWNLOAD_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(minutes=1),
    backoff_coefficient=2.0,
)
CACHE_TIMEOUT = timedelta(hours=1)
CACHE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
)


@dataclass(frozen=True)
class CallPolicy:
    """Timeout, retry and heartbeat of one kind of importer activity."""

    timeout: timedelta
    retry: RetryPolicy
    heartbeat: timedelta | None = None


RESOLVE = CallPolicy(timeout=RESOLVE_TIMEOUT, retry=SOURCE_RETRY)
TRANSFER = CallPolicy(
    timeout=DOWNLOAD_TIMEOUT, retry=DOWNLOAD_RETRY, heartbeat=DOWNLOAD_HEARTBEAT_TIMEOUT
)
CACHE_CALL = CallPolicy(timeout=CACHE_TIMEOUT, retry=CACHE_RETRY)


async def on_importer(method: Any, argument: Any, *, queue: str, policy: CallPolicy) -> Any:
    """Run one activity on the importer's task queue."""
    return await workflow.execute_activity_method(
        method,
        argument,
        task_queue=queue,
        start_to_close_timeout=policy.timeout,
        heartbeat_timeout=policy.heartbeat,
        retry_policy=policy.retry,
    )
