"""Record the histories that `test_replay.py` replays: run every case of
`scenarios.CASES` on the time-skipping test server and write the history of every
workflow it started (children found through their parents' histories) to
`histories/<workflow>-<case>[-<n>].json`.

Why committed histories: a replay test of a history recorded moments earlier by the
same code cannot notice a change that breaks the workflows already running in a
cluster. Histories recorded by an earlier version and kept in the repository can.
Re-record after a change that is *meant* to alter histories: before Kama's first
release, by re-recording the cases it touches; from then on, guarded by
`workflow.patched`, keeping the old history next to the new one (README, "Changing
a workflow"). Never to make `test_replay.py` pass.

    .venv/bin/python -m tests.workflows.record_histories [CASE ...]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from temporalio.client import Client, WorkflowHistory

from tests.workflows.scenarios import CASES, Case, staged
from tests.workflows.time_skipping import time_skipping

HISTORIES = Path(__file__).resolve().parent / "histories"

# workflow type → file name prefix
PREFIXES = {
    "Keep model artifact": "artifact",
    "Keep model cache": "cache",
    "Keep model deployment": "deployment",
    "Import model": "import",
    "Watch import": "watch",
    "Verify model": "verify",
    "Roll out model deployment": "rollout",
    "Drain serving pod": "drain",
    "Wake model deployment": "wake",
}
MAX_PER_TYPE = 2  # of one type in one case (the first ones): more add bytes, not paths


async def workflow_tree(client: Client, workflow_ids: list[str]) -> list[WorkflowHistory]:
    """The histories of `workflow_ids` and of all their descendants, parents first."""
    histories: list[WorkflowHistory] = []
    pending: list[tuple[str, str | None]] = [(i, None) for i in workflow_ids]
    while pending:
        workflow_id, run_id = pending.pop(0)
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        histories.append(history)
        for event in history.events:
            if event.HasField("child_workflow_execution_started_event_attributes"):
                child = event.child_workflow_execution_started_event_attributes
                pending.append(
                    (child.workflow_execution.workflow_id, child.workflow_execution.run_id)
                )
    return histories


def workflow_type(history: WorkflowHistory) -> str:
    started = history.events[0].workflow_execution_started_event_attributes
    return started.workflow_type.name


async def record(name: str, case: Case) -> list[Path]:
    """Run one case and write its histories; the paths written."""
    async with time_skipping() as server, staged(server, **case.cluster) as stage:
        started = await case.run(stage)
        histories = await workflow_tree(stage.client, started)
    by_type: dict[str, list[WorkflowHistory]] = {}
    for history in histories:
        by_type.setdefault(PREFIXES[workflow_type(history)], []).append(history)
    written: list[Path] = []
    for prefix, found in sorted(by_type.items()):
        kept = found[:MAX_PER_TYPE]
        for number, history in enumerate(kept, start=1):
            suffix = f"-{number}" if len(kept) > 1 else ""
            path = HISTORIES / f"{prefix}-{name}{suffix}.json"
            path.write_text(history.to_json() + "\n")
            written.append(path)
    return written


def case_files(name: str) -> list[Path]:
    """The files recorded for case `name` (never one recorded by older code, such as
    `deployment-wake-before-wake-critical-path-1.json`)."""
    found: list[Path] = []
    for prefix in PREFIXES.values():
        found += HISTORIES.glob(f"{prefix}-{name}.json")
        found += HISTORIES.glob(f"{prefix}-{name}-[0-9].json")
    return sorted(found)


async def main(names: list[str]) -> None:
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {sorted(CASES)}")
    HISTORIES.mkdir(exist_ok=True)
    for name in names or sorted(CASES):
        for stale in case_files(name):
            stale.unlink()
        for path in await record(name, CASES[name]):
            print(path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
