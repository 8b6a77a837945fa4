"""Operations tooling without a cluster: the JSON log format, `kama version`, the
`kama status` table and JSON, the watcher's and the worker's own metrics, the
visibility query behind `kama_workflows`, and the settings that turn the metrics
ports on."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from informer.watch import WatchHealth
from kama.config import Settings
from kamactl.cli import build_parser
from kamactl.logs import JsonFormatter, configure_logging, log_format
from kamactl.status_cmd import KINDS, collect_statuses, state_name, workflow_id_for
from kamactl.status_report import age, render_json, render_table, row_for
from kamactl.version import render_version, version_info
from kamactl.workflow_counts import WorkflowCounts, count_query, workflow_type_names
from watcher.metrics import WatcherMetrics
from workflows.artifact import ArtifactWorkflow
from workflows.deployment import DeploymentWorkflow

NOW = datetime(2025, 1, 2, 12, 0, tzinfo=UTC)


# logs --------------------------------------------------------------------------


def _record(message: str, *, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("kama.watcher", logging.WARNING, __file__, 1, message, (), exc_info)


def test_json_log_lines_are_one_object_each_with_the_exception() -> None:
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError as caught:
        error = caught
    line = JsonFormatter().format(_record('nudged "a"\nb', exc=error))
    assert "\n" not in line, "one record, one line"
    entry = json.loads(line)
    assert entry["level"] == "WARNING" and entry["logger"] == "kama.watcher"
    assert entry["message"] == 'nudged "a"\nb'
    assert "RuntimeError: boom" in entry["exception"] and "Traceback" in entry["exception"]
    assert datetime.fromisoformat(entry["time"]).tzinfo is not None


def test_configure_logging_switches_every_logger_to_json() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        assert configure_logging(env={"KAMA_LOG_FORMAT": "json"}) == "json"
        root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
        logging.getLogger("temporalio.worker").info("polling")
        logging.getLogger("kama").debug("hidden at INFO")
        (line,) = stream.getvalue().splitlines()
        assert json.loads(line)["logger"] == "temporalio.worker"
    finally:
        root.handlers, root.level = saved[0], saved[1]


def test_log_format_rejects_a_typo() -> None:
    assert log_format(env={}) == "text" and log_format(env={"KAMA_LOG_FORMAT": "JSON"}) == "json"
    with pytest.raises(ValueError, match="KAMA_LOG_FORMAT"):
        log_format(env={"KAMA_LOG_FORMAT": "jsonl"})


def test_a_process_logs_json_lines_from_the_first_line() -> None:
    """The `kama` command applies the format before any subcommand runs."""
    code = (
        "import logging, sys; from kamactl.cli import main; "
        "sys.argv = ['kama', 'version']; main(); logging.getLogger('kama').warning('hi')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"KAMA_LOG_FORMAT": "json", "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stderr.strip())["message"] == "hi"
    assert done.stdout.startswith("kama ")


# version -------------------------------------------------------------------------


def test_version_names_kama_commit_python_and_the_sdk() -> None:
    info = version_info(env={"KAMA_GIT_COMMIT": "abc1234"})
    assert info["commit"] == "abc1234" and info["kama"] != "unknown"
    running = f"{sys.version_info.major}.{sys.version_info.minor}."
    assert info["temporalio"].count(".") >= 2 and info["python"].startswith(running)
    text = render_version(info)
    assert text.splitlines()[0] == f"kama {info['kama']} (commit abc1234)"
    assert json.loads(render_version(info, output="json")) == info


def test_cli_parses_status_scopes() -> None:
    parser = build_parser()
    assert parser.parse_args(["status", "-A", "-o", "json"]).all_namespaces
    assert parser.parse_args(["status", "-n", "team-a"]).namespace == "team-a"
    with pytest.raises(SystemExit):
        parser.parse_args(["status", "-n", "a", "-A"])


# status --------------------------------------------------------------------------


def _artifact(*, workflow_id: str | None = None, ready: str = "True") -> dict[str, Any]:
    status: dict[str, Any] = {
        "observedGeneration": 2,
        "conditions": [
            {"type": "Ready", "status": ready, "lastTransitionTime": "2025-01-02T11:55:00Z"},
            {"type": "Verified", "status": "True", "lastTransitionTime": "2025-01-02T09:00:00Z"},
        ],
    }
    if workflow_id:
        status["workflowID"] = workflow_id
    return {
        "metadata": {"namespace": "team-a", "name": "llama", "uid": "u-1"},
        "status": status,
    }


def test_a_row_takes_the_answer_and_the_latest_transition() -> None:
    row = row_for(
        kind="ModelArtifact",
        obj=_artifact(),
        workflow_id="artifact/team-a/llama/u-1",
        state="Running",
        answer={"doing": "ready; rehash in 24h", "generation": 2, "last_error": None},
    )
    assert row.since == datetime(2025, 1, 2, 11, 55, tzinfo=UTC)
    assert row.ready == "True" and row.generation == 2 and row.observed_generation == 2
    table = render_table([row], now=NOW)
    header, line = table.splitlines()
    assert header.split() == ["KIND", "RESOURCE", "READY", "WORKFLOW", "DOING", "SINCE"]
    assert line.split()[:4] == ["ModelArtifact", "team-a/llama", "True", "Running"]
    assert "ready; rehash in 24h" in line and line.endswith("5m")
    assert header.index("DOING") == line.index("ready;"), "columns line up"


def test_a_row_without_an_answer_says_why() -> None:
    row = row_for(
        kind="ModelDeployment",
        obj={"metadata": {"namespace": "a", "name": "d"}},
        workflow_id="deployment/a/d/u",
        state="NotFound",
        answer=None,
        note="no workflow (the watcher starts one on the next event)",
    )
    line = render_table([row], now=NOW).splitlines()[1]
    assert "NotFound" in line and "no workflow" in line and line.split()[2] == "-"
    (item,) = json.loads(render_json([row]))["items"]
    assert item["state"] == "NotFound" and item["doing"] is None and item["since"] is None


def test_blocked_work_shows_its_last_error_and_long_text_is_cut() -> None:
    row = row_for(
        kind="ModelCache",
        obj={"metadata": {"namespace": "a", "name": "c"}},
        workflow_id="cache/a/c/u",
        state="Running",
        answer={"doing": "waiting " + "x" * 200, "last_error": "Forbidden: pvc"},
    )
    line = render_table([row], now=NOW).splitlines()[1]
    assert "…" in line and len(line) < 200
    (item,) = json.loads(render_json([row]))["items"]
    assert item["lastError"] == "Forbidden: pvc" and item["doing"].endswith("x" * 200)


def test_empty_status_and_ages() -> None:
    assert render_table([], now=NOW) == "No Kama resources found."
    assert render_json([]) == json.dumps({"items": []}, indent=2)
    assert age(NOW - timedelta(seconds=30), now=NOW) == "30s"
    assert age(NOW - timedelta(minutes=90), now=NOW) == "90m"
    assert age(NOW - timedelta(hours=5, minutes=3), now=NOW) == "5h3m"
    assert age(NOW - timedelta(days=3), now=NOW) == "3d"
    assert age(None, now=NOW) == "-"


def test_the_workflow_is_the_one_the_status_names_else_the_contracts() -> None:
    artifact = next(k for k in KINDS if k.kind == "ModelArtifact")
    named = _artifact(workflow_id="prod:artifact/team-a/llama/u-1")
    assert workflow_id_for(kind=artifact, obj=named, cluster="") == (
        "prod:artifact/team-a/llama/u-1"
    )
    assert workflow_id_for(kind=artifact, obj=_artifact(), cluster="") == (
        "artifact/team-a/llama/u-1"
    )
    assert workflow_id_for(kind=artifact, obj=_artifact(), cluster="eu").startswith("eu:")


def test_state_names_are_the_temporal_uis() -> None:
    assert state_name(WorkflowExecutionStatus.CONTINUED_AS_NEW) == "ContinuedAsNew"
    assert state_name(WorkflowExecutionStatus.RUNNING) == "Running"
    assert state_name(None) == "Unknown"


# metrics -------------------------------------------------------------------------


def _scrape(metrics: Any) -> str:
    return generate_latest(metrics.registry).decode()


def test_watcher_metrics_count_events_nudges_signals_and_restarts() -> None:
    health = WatchHealth()
    collection = health.track("modelartifacts")
    metrics = WatcherMetrics(health=health)
    metrics.event(resource="modelartifacts", type="ADDED")
    metrics.event(resource="modelartifacts", type="ADDED")
    metrics.nudged(kind="ModelArtifact", outcome="ok")
    metrics.signalled(signal="pods changed", outcome="not_found")
    collection.restarted(reason="gone")
    text = _scrape(metrics)
    assert 'kama_watcher_events_total{resource="modelartifacts",type="ADDED"} 2.0' in text
    assert 'kama_watcher_nudges_total{kind="ModelArtifact",outcome="ok"} 1.0' in text
    assert 'kama_watcher_signals_total{outcome="not_found",signal="pods changed"} 1.0' in text
    assert (
        'kama_watcher_watch_restarts_total{collection="modelartifacts",reason="gone"} 1.0' in text
    )
    assert 'kama_watcher_watch_ready{collection="modelartifacts"} 0.0' in text
    collection.synced = True
    assert 'kama_watcher_watch_ready{collection="modelartifacts"} 1.0' in _scrape(metrics)


def test_workflow_counts_export_by_type_and_status() -> None:
    counts = WorkflowCounts()
    registry = CollectorRegistry()
    registry.register(counts)
    assert "kama_workflows_refreshed" not in generate_latest(registry).decode()
    counts.replace({("Keep model artifact", "Running"): 3, ("Import model", "Failed"): 1})
    text = generate_latest(registry).decode()
    assert 'kama_workflows{status="Running",workflow_type="Keep model artifact"} 3.0' in text
    assert 'kama_workflows{status="Failed",workflow_type="Import model"} 1.0' in text
    assert "kama_workflows_refreshed_timestamp_seconds" in text


def test_the_count_query_is_per_type_grouped_by_status_on_the_queue() -> None:
    assert workflow_type_names([ArtifactWorkflow, DeploymentWorkflow]) == [
        "Keep model artifact",
        "Keep model deployment",
    ]
    query = count_query(task_queue="eu:kama-control", workflow_type="Keep model artifact")
    assert query == (
        "TaskQueue = 'eu:kama-control' AND WorkflowType = 'Keep model artifact' "
        "GROUP BY ExecutionStatus"
    )
    assert "\\'" in count_query(task_queue="q", workflow_type="it's")


def test_metrics_ports_are_off_unless_set() -> None:
    assert Settings.from_env({}).metrics_port is None
    settings = Settings.from_env({"KAMA_METRICS_PORT": "9090", "KAMA_TEMPORAL_METRICS_PORT": "0"})
    assert settings.metrics_port == 9090 and settings.temporal_metrics_port is None


# status against workflows that answer, are gone, or cannot be reached ------------


class _Handle:
    def __init__(self, state: WorkflowExecutionStatus | None, answer: Any = None) -> None:
        self.state, self.answer = state, answer

    async def describe(self, **_: Any) -> Any:
        if self.state is None:
            raise RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")
        return type("Described", (), {"status": self.state})()

    async def query(self, name: str, **_: Any) -> Any:
        assert name == "status"
        if self.answer is None:
            raise RPCError("deadline", RPCStatusCode.DEADLINE_EXCEEDED, b"")
        return self.answer


class _Client:
    def __init__(self, handles: dict[str, _Handle]) -> None:
        self.handles = handles

    def get_workflow_handle(self, workflow_id: str) -> _Handle:
        return self.handles[workflow_id]


def _resource(name: str, *, uid: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "a", "name": name, "uid": uid}}


def test_status_rows_degrade_when_a_workflow_is_missing_closed_or_silent() -> None:
    artifact = next(k for k in KINDS if k.kind == "ModelArtifact")
    client = _Client(
        {
            "artifact/a/live/1": _Handle(WorkflowExecutionStatus.RUNNING, {"doing": "importing"}),
            "artifact/a/gone/2": _Handle(None),
            "artifact/a/done/3": _Handle(WorkflowExecutionStatus.TERMINATED),
            "artifact/a/mute/4": _Handle(WorkflowExecutionStatus.RUNNING),
        }
    )
    resources = [
        (artifact, _resource(name, uid=uid))
        for name, uid in (("live", "1"), ("gone", "2"), ("done", "3"), ("mute", "4"))
    ]
    rows = asyncio.run(
        collect_statuses(client=cast(Client, client), resources=resources, cluster="")
    )
    by_name = {row.name: row for row in rows}
    assert (by_name["live"].state, by_name["live"].doing) == ("Running", "importing")
    assert by_name["gone"].state == "NotFound" and "no workflow" in (by_name["gone"].note or "")
    assert by_name["done"].state == "Terminated" and by_name["done"].doing is None
    assert by_name["mute"].state == "Running" and "timed out" in (by_name["mute"].note or "")
    offline = asyncio.run(collect_statuses(client=None, resources=resources, cluster=""))
    assert {row.state for row in offline} == {"Unknown"}
    assert all(row.note == "Temporal unreachable" for row in offline)
