"""How a workflow schedules an activity: through a named `CallPolicy` (timeout, retry,
heartbeat), so each kind of call is configured once and type-checked where it is
made. `await KUBE.schedule(KubeActivities.patch_status, StatusPatch(...))` checks the
argument against the activity's parameter and gives the activity's return type."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar, cast, overload

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.types import MethodAsyncSingleParam, MethodSyncSingleParam

Owner = TypeVar("Owner")  # the class whose bound methods the worker registers
Argument = TypeVar("Argument")
Result = TypeVar("Result")


@dataclass(frozen=True)
class CallPolicy:
    """Timeout, retry and heartbeat of one kind of activity call."""

    timeout: timedelta
    retry: RetryPolicy
    heartbeat: timedelta | None = None

    @overload
    def schedule(
        self,
        activity: MethodAsyncSingleParam[Owner, Argument, Result],
        argument: Argument,
        *,
        queue: str | None = None,
    ) -> workflow.ActivityHandle[Result]: ...

    @overload
    def schedule(
        self,
        activity: MethodSyncSingleParam[Owner, Argument, Result],
        argument: Argument,
        *,
        queue: str | None = None,
    ) -> workflow.ActivityHandle[Result]: ...

    def schedule(
        self,
        activity: Callable[[Owner, Argument], object],
        argument: Argument,
        *,
        queue: str | None = None,
    ) -> workflow.ActivityHandle[Result]:
        """Schedule one activity (a method of an activities class) on `queue`, the
        workflow's own task queue by default; await the handle for its result."""
        handle = workflow.start_activity_method(
            activity,
            argument,
            task_queue=queue,
            start_to_close_timeout=self.timeout,
            heartbeat_timeout=self.heartbeat,
            retry_policy=self.retry,
        )
        return cast("workflow.ActivityHandle[Result]", handle)  # the overloads say which
