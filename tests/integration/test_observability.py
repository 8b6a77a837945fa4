"""What an operator sees of a running Kama on the local stack: the worker's and the
watcher's Prometheus endpoints (the Temporal SDK's metrics and Kama's own) after a
resource is created, `kama status` answering from the live workflows, and
`status.workflowID` naming a workflow that exists in Temporal."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import WorkflowExecutionStatus

from kama.config import Settings
from kamactl.clients import connect_temporal
from kamadev.binaries import REPO_ROOT
from kamadev.processes import ManagedProcess
from tests.conftest import KamaControl
from tests.integration.test_artifact_plane import (
    cache,
    hf_artifact,
    publish_model,
    wait_condition,
)
from tests.support import apply, eventually, get_json

COUNT_TIMEOUT_S = 90  # the worker counts visibility every 30 s


def scrape(process: ManagedProcess, port_env: str) -> str:
    assert process.env is not None
    port = process.env[port_env]
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    response.raise_for_status()
    return response.text


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one series (labels in any order), or None."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def kama_status(control: KamaControl, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kamactl", "status", *args],
        env={**os.environ, **control.env},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


async def describe(control: KamaControl, workflow_id: str) -> WorkflowExecutionStatus | None:
    client = await connect_temporal(Settings.from_env(control.env), env=control.env, check=False)
    return (await client.get_workflow_handle(workflow_id).describe()).status


def test_metrics_status_and_workflow_ids_of_a_live_resource(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    repo, _, _ = publish_model(control, tmp_path)
    apply(control.stack, cache(namespace), hf_artifact(namespace, "seen", repo, ["tiny.gguf"]))
    wait_condition(control, namespace, "seen", "Ready")

    # status.workflowID names the entity workflows, running in Temporal
    ids: dict[str, str] = {}
    for kind, name in (("modelartifact", "seen"), ("modelcache", "models")):
        obj: dict[str, Any] = get_json(control.stack, kind, name, "-n", namespace)
        workflow_id = obj["status"]["workflowID"]
        assert obj["metadata"]["uid"] in workflow_id and f"/{namespace}/{name}/" in workflow_id
        assert asyncio.run(describe(control, workflow_id)) == WorkflowExecutionStatus.RUNNING
        ids[kind] = workflow_id

    # the watcher: its own counters, and the SDK's client metrics on the other port
    watcher = scrape(control.watcher, "KAMA_METRICS_PORT")
    assert (sample(watcher, "kama_watcher_events_total", resource="modelartifacts") or 0) >= 1
    assert (
        sample(watcher, "kama_watcher_nudges_total", kind="ModelArtifact", outcome="ok") or 0
    ) >= 1
    assert sample(watcher, "kama_watcher_watch_ready", collection="modelartifacts") == 1.0
    assert "temporal_" not in watcher, "the SDK's metrics have their own port"
    watcher_sdk = scrape(control.watcher, "KAMA_TEMPORAL_METRICS_PORT")
    assert "temporal_request" in watcher_sdk, watcher_sdk[:2000]

    # the worker: the SDK's task metrics, and kama_workflows counted from visibility
    worker_sdk = scrape(control.worker, "KAMA_TEMPORAL_METRICS_PORT")
    assert "temporal_workflow_task" in worker_sdk and "temporal_activity" in worker_sdk

    def counted() -> float | None:
        control.worker.check_alive()
        text = scrape(control.worker, "KAMA_METRICS_PORT")
        running = sample(
            text, "kama_workflows", workflow_type="Keep model artifact", status="Running"
        )
        return running if running and running >= 1 else None

    eventually(counted, timeout=COUNT_TIMEOUT_S, what="kama_workflows to count the artifact")

    # kama status: the live workflows' own words, as JSON and as the table
    items = json.loads(kama_status(control, "-n", namespace, "-o", "json").stdout)["items"]
    rows = {(item["kind"], item["name"]): item for item in items}
    artifact = rows[("ModelArtifact", "seen")]
    assert artifact["workflowID"] == ids["modelartifact"] and artifact["state"] == "Running"
    assert artifact["doing"] and artifact["ready"] == "True" and artifact["since"]
    assert artifact["status"]["generation"] == 1
    assert rows[("ModelCache", "models")]["state"] == "Running"
    table = kama_status(control, "-n", namespace).stdout.splitlines()
    assert table[0].split()[:4] == ["KIND", "RESOURCE", "READY", "WORKFLOW"]
    line = next(line for line in table if f"{namespace}/seen" in line)
    assert line.split()[:4] == ["ModelArtifact", f"{namespace}/seen", "True", "Running"]
    assert artifact["doing"].split()[0] in line
