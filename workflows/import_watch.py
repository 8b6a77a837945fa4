"""ImportWatchWorkflow (`<import or verify workflow id>/watch`): what an artifact's
workflow does while its import (or in-place verification) runs, moved into a child
of its own so that neither grows with the import's length.

An import of a 400 GB file takes hours. Its parent only starts this child next to the
import and awaits the import: a handful of events whatever the duration. This child
reads the download's progress every 2 s at first, then backing off to every 30 s,
writes `status.progress` when it moved by 1 % of the total, recreates the importer
pod only while nothing moves (it may have been deleted), and continues as new every
`HISTORY_LIMIT` events. The parent cancels it when the import ends."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta

from temporalio import workflow

from workflows.entity import HISTORY_LIMIT
from workflows.kube_calls import call_kube
from workflows.polling import poll_interval
from workflows.status import TaskStatus

with workflow.unsafe.imports_passed_through():
    from activities.importer_pods import ImporterPod
    from activities.kama_objects import StatusPatch
    from activities.kube import KubeActivities
    from activities.progress import ImportProgress, ProgressActivities, ProgressRequest
    from kama.api import ImportProgress as ProgressStatus
    from kama.api import ModelArtifactStatus
    from kama.conditions import status_json
    from kama.contracts import ARTIFACTS, ObjectRef

PROGRESS_EVERY = timedelta(seconds=2)
PROGRESS_EVERY_MAX = timedelta(seconds=30)
PROGRESS_POLLS_AT_FIRST_PACE = 15
PROGRESS_STEP = 100
"""Progress is written when it moved by 1/PROGRESS_STEP of the total."""


@dataclass(frozen=True)
class WatchInput:
    artifact: ObjectRef
    pod: ImporterPod
    progress_of: str | None  # the import workflow whose downloads report progress
    # carried over when the watch continues as new
    polls: int = 0
    written: int = -1  # bytes last written to status.progress
    last_done: int = -1  # bytes seen at the last poll


def watch_workflow_id(child_id: str) -> str:
    return f"{child_id}/watch"


@workflow.defn(name="Watch import")
class ImportWatchWorkflow(TaskStatus):
    @workflow.run
    async def run(self, request: WatchInput) -> None:
        polls, written, last_done = request.polls, request.written, request.last_done
        while True:
            if workflow.info().get_current_history_length() > HISTORY_LIMIT:
                workflow.continue_as_new(
                    replace(request, polls=polls, written=written, last_done=last_done)
                )
            polls += 1
            self._status.doing = "waiting for the import to move"
            await workflow.sleep(
                poll_interval(
                    polls=polls,
                    first=PROGRESS_EVERY,
                    maximum=PROGRESS_EVERY_MAX,
                    at_first_pace=PROGRESS_POLLS_AT_FIRST_PACE,
                )
            )
            advanced = False
            if request.progress_of is not None:
                progress: ImportProgress = await call_kube(
                    ProgressActivities.import_progress,
                    ProgressRequest(workflow_id=request.progress_of),
                )
                total, done = progress.bytes_total, progress.bytes_done
                advanced = done != last_done and last_done >= 0
                last_done = done
                if total and (written < 0 or done - written >= max(1, total // PROGRESS_STEP)):
                    self._status.doing = "writing the progress"
                    moved = ModelArtifactStatus(  # the progress only: the phase is the parent's
                        progress=ProgressStatus(bytes_done=done, bytes_total=total)
                    )
                    await call_kube(
                        KubeActivities.patch_status,
                        StatusPatch(
                            kind_plural=ARTIFACTS, ref=request.artifact, status=status_json(moved)
                        ),
                    )
                    written = done
            if not advanced:  # nothing moved: the importer pod may be gone
                self._status.doing = "checking the importer pod"
                await call_kube(KubeActivities.ensure_importer_pod, request.pod)
