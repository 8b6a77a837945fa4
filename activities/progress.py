"""Temporal as an external system: how far a running import has come, read from the
child workflow's status query and its download activity's last heartbeat, so the
artifact's status can show bytes done without the importer touching Kubernetes."""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError

from activities.import_payloads import ImportStatus
from kama.contracts import STATUS_QUERY


@dataclass(frozen=True)
class ProgressRequest:
    workflow_id: str


@dataclass(frozen=True)
class ImportProgress:
    bytes_done: int
    bytes_total: int
    running: bool


class ProgressActivities:
    def __init__(self, *, client: Client) -> None:
        self.client = client

    @activity.defn(name="Read import progress")
    async def import_progress(self, request: ProgressRequest) -> ImportProgress:
        handle = self.client.get_workflow_handle(request.workflow_id)
        try:
            description = await handle.describe()
            status = await handle.query(STATUS_QUERY, result_type=ImportStatus)
        except RPCError:
            return ImportProgress(bytes_done=0, bytes_total=0, running=False)
        completed, total = status.bytes_completed, status.bytes_total
        current = 0
        for pending in description.raw_description.pending_activities:
            if pending.activity_type.name != "Download file into cache staging":
                continue
            if pending.heartbeat_details.payloads:
                values = await self.client.data_converter.decode(pending.heartbeat_details.payloads)
                if values and isinstance(values[0], int):
                    current = max(current, values[0])
        running = description.status is not None and description.status.name == "RUNNING"
        return ImportProgress(
            bytes_done=min(completed + current, total or completed + current),
            bytes_total=total,
            running=running,
        )
