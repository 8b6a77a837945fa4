"""How workflows call activities on an importer's task queue: next to the volume,
where the source token, the cache and the source claim are readable. Each kind of
call has one named timeout/retry/heartbeat policy (`policy.schedule(activity,
argument, queue=importer_queue)`)."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

from workflows.calls import CallPolicy

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
    # each attempt resumes where the last heartbeat left off, so many transient network
    # failures are fine; a download failing this often will not succeed by itself
    maximum_attempts=50,
)
CACHE_TIMEOUT = timedelta(hours=1)
VOLUME_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    # ~8 minutes of a volume refusing the same work: not transient; the artifact says
    # so in a condition and waits for `retry`
    maximum_attempts=20,
)
"""Work on the volume itself (space, publication, hashing). The activities raise
their own final errors (InvalidGGUF, MissingShard, ChecksumMismatch, …) as
non-retryable; anything else is retried a bounded number of times."""
HASH_TIMEOUT = timedelta(hours=6)
HASH_HEARTBEAT_TIMEOUT = timedelta(seconds=10)

RESOLVE = CallPolicy(timeout=RESOLVE_TIMEOUT, retry=SOURCE_RETRY)
TRANSFER = CallPolicy(
    timeout=DOWNLOAD_TIMEOUT, retry=DOWNLOAD_RETRY, heartbeat=DOWNLOAD_HEARTBEAT_TIMEOUT
)
CACHE_CALL = CallPolicy(timeout=CACHE_TIMEOUT, retry=VOLUME_RETRY)
RESOLVE_ON_CLAIM = CallPolicy(timeout=RESOLVE_TIMEOUT, retry=VOLUME_RETRY)
HASH = CallPolicy(timeout=HASH_TIMEOUT, retry=VOLUME_RETRY, heartbeat=HASH_HEARTBEAT_TIMEOUT)
