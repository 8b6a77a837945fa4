"""How workflows call activities on their own (control) task queue: the Kubernetes
activities, and the Temporal one that reads an import's progress. One timeout and
one retry policy, named here, so every workflow treats the API server the same way:
answers that may change (404, 409, 429, 5xx, a claim not bound yet) are retried
without limit; answers that will not (403, 422, other 4xx: `kube_errors`) and
programming errors (ValueError, KeyError, TypeError, AttributeError) end the call at
once, and the workflow reports them and waits for a person."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from workflows.calls import CallPolicy

with workflow.unsafe.imports_passed_through():
    from activities.kube_errors import PERMANENT_ERROR_TYPES
    from kama.reasons import Failure

KUBE_TIMEOUT = timedelta(seconds=30)
PROGRAMMING_ERROR_TYPES = ("ValueError", "KeyError", "TypeError", "AttributeError")
"""Exceptions of Kama's own code (or of a client handed an answer it cannot read): the
same input fails the same way every time, so they end the call after one attempt and
the workflow reports them, instead of retrying without limit."""
KUBE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=20),
    non_retryable_error_types=[*PERMANENT_ERROR_TYPES, *PROGRAMMING_ERROR_TYPES],
)
KUBE = CallPolicy(timeout=KUBE_TIMEOUT, retry=KUBE_RETRY)

CLAIM_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=60,
    non_retryable_error_types=[
        Failure.STORAGE_UNAVAILABLE,
        *PERMANENT_ERROR_TYPES,
        *PROGRAMMING_ERROR_TYPES,
    ],
)
"""Finding a cache or source claim: a missing one is reported at once (it will not
appear by waiting); one not bound yet is waited for, about ten minutes, then reported
(ClaimNotBound; `retry` or a spec change tries again). A claim whose StorageClass binds
WaitForFirstConsumer is not waited for: the pod that mounts it binds it."""
CLAIM = CallPolicy(timeout=KUBE_TIMEOUT, retry=CLAIM_RETRY)

call_kube = KUBE.schedule
"""Schedule one activity on the control queue; `await` the handle for its result."""


def causes(error: BaseException) -> Iterator[BaseException]:
    """`error`, then each error behind it: a Temporal failure's `cause` (a child
    workflow's or an activity's), else Python's `__cause__`."""
    current: BaseException | None = error
    while current is not None:
        yield current
        current = getattr(current, "cause", None) or current.__cause__


def failure_type(error: BaseException, *, default: str) -> tuple[str, str]:
    """The typed reason and message behind a failed child workflow or activity (the
    first `ApplicationError` with a type in its chain of causes)."""
    for found in causes(error):
        if isinstance(found, ApplicationError) and found.type:
            return found.type, found.message
    return default, str(error)


def permanent_failure(error: BaseException) -> ApplicationError | None:
    """The non-retryable `ApplicationError` (a 403, a 422, a missing claim...) behind
    a failed activity or child workflow, if that is why it failed."""
    return next(
        (
            found
            for found in causes(error)
            if isinstance(found, ApplicationError) and found.non_retryable
        ),
        None,
    )
