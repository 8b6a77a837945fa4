"""Every committed history in `histories/` replays on the current workflow code.

The histories were recorded by earlier code (`record_histories.py`, and one by the
code from before the `wake-critical-path-1` patch, see
`record_prepatch_history.py`), so a change that would break workflows already running
in a cluster (a command added, removed or reordered without `workflow.patched`, a
renamed activity, workflow type or signal, an input that no longer decodes, a pure
function the workflow calls that now decides differently) fails here, not in
production. No server is needed: replay runs in-process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from tests.workflows.record_histories import HISTORIES, PREFIXES, workflow_type
from tests.workflows.scenarios import WORKFLOWS

WAKE_PATCH = "wake-critical-path-1"  # workflows/deployment.py WAKE_CRITICAL_PATH
PREPATCH = HISTORIES / f"deployment-wake-before-{WAKE_PATCH}.json"
RECORDED = sorted(HISTORIES.glob("*.json"))

# Histories the current code is known not to replay: each one a bug to fix in the
# workflows (or to guard with workflow.patched), never by re-recording. strict: the
# day it replays again, the test says so and the entry goes.
KNOWN_BREAKS: dict[str, str] = {}


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


@pytest.fixture(scope="module")
def replayer() -> Replayer:
    return Replayer(workflows=WORKFLOWS)


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            path,
            id=path.stem,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_BREAKS[path.stem])]
            if path.stem in KNOWN_BREAKS
            else [],
        )
        for path in RECORDED
    ],
)
async def test_history_replays_on_current_code(replayer: Replayer, path: Path) -> None:
    result = await replayer.replay_workflow(load(path), raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure!r}"


def test_every_workflow_type_has_a_history() -> None:
    recorded = {workflow_type(load(path)) for path in RECORDED}
    assert recorded == set(PREFIXES), f"no history for {set(PREFIXES) - recorded}"
    registered = {getattr(w, "__temporal_workflow_definition").name for w in WORKFLOWS}
    assert registered == set(PREFIXES), "a workflow type was renamed: running ones break"


def patches(history: WorkflowHistory) -> set[str]:
    """The `workflow.patched` IDs recorded in a history."""
    found: set[str] = set()
    for event in history.events:
        if event.HasField("marker_recorded_event_attributes"):
            for payloads in event.marker_recorded_event_attributes.details.values():
                found |= {json.loads(p.data).get("id") for p in payloads.payloads}
    return found


def activity_input(event: HistoryEvent) -> Any:
    (payload,) = event.activity_task_scheduled_event_attributes.input.payloads
    return json.loads(payload.data)


def last_wake_written_before_rollout(history: WorkflowHistory) -> bool:
    """Whether `lastWake` went to the API server before the wake's rollout started:
    the command order from before the patch (after it, the rollout starts first and
    lastWake rides with the next status write)."""
    for event in history.events:
        if event.HasField("start_child_workflow_execution_initiated_event_attributes"):
            initiated = event.start_child_workflow_execution_initiated_event_attributes
            if initiated.workflow_type.name == "Roll out model deployment":
                return False
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled = event.activity_task_scheduled_event_attributes
            if scheduled.activity_type.name == "Write status" and "lastWake" in (
                activity_input(event).get("status", {})
            ):
                return True
    return False


def wakes(history: WorkflowHistory) -> int:
    return sum(
        1
        for e in history.events
        if e.HasField("workflow_execution_signaled_event_attributes")
        and e.workflow_execution_signaled_event_attributes.signal_name == "wake"
    )


def through_first_child_start(history: WorkflowHistory) -> WorkflowHistory:
    """The history as a worker finds it once the first child workflow has started
    (a deployment caught mid-wake by an upgrade)."""
    events = list(history.events)
    started = next(
        i
        for i, e in enumerate(events)
        if e.HasField("child_workflow_execution_started_event_attributes")
    )
    end = next(
        i
        for i in range(started, len(events))
        if events[i].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    return WorkflowHistory(history.workflow_id, events[: end + 1])


async def test_the_old_branch_of_the_wake_patch_replays(replayer: Replayer) -> None:
    """The pre-patch history has no marker, so replaying it runs the old branch of
    `workflow.patched(WAKE_PATCH)`: it is a wake (the path the patch changed) in the
    old order, replayed here through the wake's rollout start. (Its full replay is a
    known break, above.) The current recording takes the new branch, so both branches
    are replayed."""
    before = load(PREPATCH)
    assert workflow_type(before) == "Keep model deployment"
    assert WAKE_PATCH not in patches(before)
    assert wakes(before) >= 1 and last_wake_written_before_rollout(before)
    result = await replayer.replay_workflow(
        through_first_child_start(before), raise_on_replay_failure=False
    )
    assert result.replay_failure is None, repr(result.replay_failure)

    now = load(HISTORIES / "deployment-wake.json")
    assert WAKE_PATCH in patches(now)
    assert wakes(now) >= 1 and not last_wake_written_before_rollout(now)
