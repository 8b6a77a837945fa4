"""Temporal's time-skipping test server, offline.

`WorkflowEnvironment.start_time_skipping()` downloads a native test server from
temporal.download, which this project's machines and CI cannot reach. The same server
is published on Maven Central as the Java artifact io.temporal:temporal-test-server;
deploy/local/build-test-server.sh fetches it (pinned jars, cached under
~/.cache/kama/temporal-test-server/<version>) and prints a launcher that the SDK runs
in place of its own download (`<launcher> <port>`).

It also works around one bug of that server that the entity workflows hit (a drain
outliving the rollout that started it stops virtual time): `release_orphaned_locks`."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from temporalio.api.testservice.v1 import SleepRequest, UnlockTimeSkippingRequest
from temporalio.api.workflow.v1 import WorkflowExecutionInfo as ExecutionInfo
from temporalio.api.workflowservice.v1 import (
    ListClosedWorkflowExecutionsRequest,
    ListClosedWorkflowExecutionsResponse,
    ListOpenWorkflowExecutionsRequest,
    ListOpenWorkflowExecutionsResponse,
)
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_SERVER_SCRIPT = REPO_ROOT / "deploy" / "local" / "build-test-server.sh"
TEST_SERVER_STARTUP = timedelta(seconds=60)  # a JVM on two busy cores
# While something holds virtual time (a workflow task, an activity, a child's start),
# the server's clock runs at wall-clock speed, so a sleep can take real seconds; on two
# cores shared with the stack tests that once took longer than the client's default
# deadline for a call (30 s). A sleep gets longer, and says what held time if it fails.
SLEEP_DEADLINE = timedelta(minutes=2)
STALL_NOTICE = timedelta(seconds=10)
"""A sleep still running after this much wall-clock time warns with what the open
workflows wait on (a sleep takes milliseconds to a few seconds; stalls that recovered,
like a 66 s one on 2026-12-05, said nothing before)."""


class StalledVirtualTime(UserWarning):
    """Virtual time took long to pass: the candidates for what held it."""


def install_test_server() -> str:
    """Install (once, cached) Temporal's Java test server from Maven Central; the
    launcher the SDK runs instead of downloading its own build."""
    built = subprocess.run(
        ["bash", str(TEST_SERVER_SCRIPT)], capture_output=True, text=True, check=False
    )
    if built.returncode != 0:
        raise RuntimeError(f"{TEST_SERVER_SCRIPT.name} failed: {built.stderr.strip()}")
    return built.stdout.strip().splitlines()[-1]


# A closed child's parent is told in a separate step that takes a time-skipping lock
# and releases it only once the parent has recorded the child's close; when the parent
# closed first (a drain abandoned by its finished rollout), the lock is never released
# and virtual time stops for the rest of that server's life (temporalio/sdk-java#2392, #1618).
LOCKING_CLOSES = frozenset(
    {
        WorkflowExecutionStatus.COMPLETED,
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.CANCELED,
        WorkflowExecutionStatus.TIMED_OUT,
    }
)
CHILD_CLOSED_EVENTS = frozenset(
    {
        "child_workflow_execution_completed_event_attributes",
        "child_workflow_execution_failed_event_attributes",
        "child_workflow_execution_canceled_event_attributes",
        "child_workflow_execution_timed_out_event_attributes",
        "child_workflow_execution_terminated_event_attributes",
    }
)


# the test server walks its executions unguarded while workflows close: the list call
# then fails (UNKNOWN: java.util.ConcurrentModificationException); asked again
LIST_ATTEMPTS = 5
SERVER_FAULTS = frozenset({RPCStatusCode.UNKNOWN, RPCStatusCode.INTERNAL})


async def closed_executions(client: Client) -> list[ExecutionInfo]:
    """The closed workflows on the server (it has only the old list call, and its
    answer carries no parent)."""
    for attempt in range(1, LIST_ATTEMPTS + 1):
        try:
            return await _executions(client, closed=True)
        except RPCError as exc:
            if exc.status not in SERVER_FAULTS or attempt == LIST_ATTEMPTS:
                raise
            await asyncio.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


async def _executions(client: Client, *, closed: bool) -> list[ExecutionInfo]:
    """The closed (or open) workflows on the server, every page."""
    service = client.workflow_service
    found: list[ExecutionInfo] = []
    token = b""
    while True:
        page: ListClosedWorkflowExecutionsResponse | ListOpenWorkflowExecutionsResponse
        if closed:
            page = await service.list_closed_workflow_executions(
                ListClosedWorkflowExecutionsRequest(
                    namespace=client.namespace, maximum_page_size=1000, next_page_token=token
                )
            )
        else:
            page = await service.list_open_workflow_executions(
                ListOpenWorkflowExecutionsRequest(
                    namespace=client.namespace, maximum_page_size=1000, next_page_token=token
                )
            )
        found += page.executions
        token = page.next_page_token
        if not token:
            return found


async def holding_time(client: Client) -> str:
    """What the open workflows are waiting on (their pending activities and children):
    the candidates for what holds virtual time, for a stalled sleep's failure."""
    lines = []
    for info in await _executions(client, closed=False):
        execution = info.execution
        described = await client.get_workflow_handle(
            execution.workflow_id, run_id=execution.run_id
        ).describe()
        raw = described.raw_description
        activities = [
            f"{a.activity_type.name} (attempt {a.attempt}, state {a.state})"
            for a in raw.pending_activities
        ]
        children = [c.workflow_id for c in raw.pending_children]
        lines.append(
            f"{execution.workflow_id}: activities {activities or 'none'}, "
            f"children {children or 'none'}"
        )
    return "; ".join(lines) or "no open workflow"


@dataclass
class TimeSkippingServer:
    """One test's own test server. Not shared: terminating a workflow that has a task
    or an activity outstanding leaks time-skipping locks too, so a test's workflows are
    never ended by force; they go with their server."""

    env: WorkflowEnvironment
    settled: set[str] = field(default_factory=set)  # closed runs already looked at

    async def sleep(self, duration: timedelta) -> None:
        """Let `duration` of virtual time pass (`WorkflowEnvironment.sleep`, with a
        deadline that allows for a loaded machine)."""
        request = SleepRequest()
        request.duration.FromTimedelta(duration)
        client = self.env.client
        sleeping = asyncio.ensure_future(
            client.test_service.unlock_time_skipping_with_sleep(request, timeout=SLEEP_DEADLINE)
        )
        try:
            done, _ = await asyncio.wait({sleeping}, timeout=STALL_NOTICE.total_seconds())
            if not done:
                warnings.warn(
                    StalledVirtualTime(
                        f"{duration} of virtual time had not passed after {STALL_NOTICE} of "
                        f"wall-clock time; open workflows: {await holding_time(client)}"
                    ),
                    stacklevel=2,
                )
            await sleeping
        except RPCError as exc:
            raise AssertionError(
                f"{duration} of virtual time did not pass within {SLEEP_DEADLINE} of wall-clock "
                f"time ({exc.message}); open workflows: {await holding_time(client)}"
            ) from exc
        finally:
            sleeping.cancel()  # done already, or left early: no sleep outlives the call

    async def release_orphaned_locks(self) -> None:
        """Give back the lock the test server leaked for each closed child of a
        closed parent that never recorded it (see above). Only the test server's
        bookkeeping changes: the workflows and their histories are what a real
        server would have."""
        client = self.env.client
        for info in await closed_executions(client):
            run_id = info.execution.run_id
            if run_id in self.settled:
                continue
            child = await client.get_workflow_handle(
                info.execution.workflow_id, run_id=run_id
            ).describe()
            if child.status not in LOCKING_CLOSES or not child.parent_id:
                self.settled.add(run_id)
                continue
            parent = client.get_workflow_handle(child.parent_id, run_id=child.parent_run_id)
            parent_open = (await parent.describe()).status == WorkflowExecutionStatus.RUNNING
            recorded = any(
                getattr(event, kind).workflow_execution.run_id == run_id
                for event in (await parent.fetch_history()).events
                if (kind := event.WhichOneof("attributes")) in CHILD_CLOSED_EVENTS
            )
            if recorded:
                self.settled.add(run_id)
            elif not parent_open:
                self.settled.add(run_id)
                await client.test_service.unlock_time_skipping(UnlockTimeSkippingRequest())


@contextlib.asynccontextmanager
async def time_skipping() -> AsyncIterator[TimeSkippingServer]:
    """Temporal's time-skipping test server: timers fire as soon as nothing else is
    running, so an idle timeout of ten minutes takes milliseconds."""
    launcher = await asyncio.to_thread(install_test_server)
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=launcher, test_server_startup_timeout=TEST_SERVER_STARTUP
    )
    try:
        yield TimeSkippingServer(env=env)
    finally:
        await env.shutdown()
