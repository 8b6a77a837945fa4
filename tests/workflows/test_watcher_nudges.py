"""The watcher's nudges on the real Temporal dev server: a status-only update of a
Kama resource (most often its workflow's own status write) is not signalled back to
the workflow, so its history does not grow with its writes; a new generation and a
deletion are; and a quiet object is nudged again after RENUDGE_AFTER_S."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.client import Client

from kama.api import FINALIZER
from kama.config import Settings
from watcher.nudge import ARTIFACT, RENUDGE_AFTER_S, Nudger


def artifact(*, uid: str, generation: int, phase: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "namespace": "ns",
        "name": "model",
        "uid": uid,
        "generation": generation,
        "finalizers": [FINALIZER],  # present: the nudger never needs the API server
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    spec = {"source": {"huggingFace": {"repo": "acme/m", "files": ["m.gguf"]}}}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


async def signals(client: Client, workflow_id: str) -> int:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return sum(e.HasField("workflow_execution_signaled_event_attributes") for e in history.events)


async def test_status_updates_are_not_signalled_back(temporal_client: Client) -> None:
    now = [0.0]
    queue = f"nudge-{uuid.uuid4().hex[:6]}"  # no worker: the starts and signals are what count
    nudger = Nudger(
        client=temporal_client,
        custom=None,  # never called: the finalizer is present
        settings=Settings(control_queue=queue),
        entity=ARTIFACT,
        clock=lambda: now[0],
    )
    uid = str(uuid.uuid4())
    workflow_id = f"artifact/ns/model/{uid}"
    await nudger.nudge("ADDED", artifact(uid=uid, generation=1, phase="Resolving"))
    for phase in ("Importing", "Importing", "Verifying", "Ready"):  # the workflow's writes
        now[0] += 5
        await nudger.nudge("MODIFIED", artifact(uid=uid, generation=1, phase=phase))
    assert await signals(temporal_client, workflow_id) == 1, "status writes came back"

    await nudger.nudge("MODIFIED", artifact(uid=uid, generation=2, phase="Ready"))
    assert await signals(temporal_client, workflow_id) == 2, "a spec change is signalled"
    await nudger.nudge("MODIFIED", artifact(uid=uid, generation=2, phase="Ready", deleting=True))
    assert await signals(temporal_client, workflow_id) == 3, "a deletion is signalled"

    now[0] += RENUDGE_AFTER_S
    await nudger.nudge("MODIFIED", artifact(uid=uid, generation=2, phase="Ready", deleting=True))
    assert await signals(temporal_client, workflow_id) == 4, "a quiet object is nudged again"
