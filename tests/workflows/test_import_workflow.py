"""ImportWorkflow on the real Temporal dev server: a model on the local Hub is
resolved, downloaded on the importer's queue (relayed by the worker to the importer's server), verified and published once; broken
transfers resume, bad sources and bad bytes fail with typed errors."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer, Worker

from activities.import_payloads import HubSource
from activities.importer_relay import ImporterPodAddress, ImporterRelay, result_types
from kama.cache_layout import READY_NAME, Manifest
from kamactl.importer_server import serve_importer
from kamactl.worker import importer_activities
from kamadev.gguf_factory import ModelShape, write_bad_magic, write_model, write_shards
from kamadev.hub import Fault, HubFixture
from workflows.import_model import ImportInput, ImportResult, ImportWorkflow
from workflows.verify_model import VerifyInput, VerifyWorkflow

TOKEN = "importer-token"


@dataclass
class Workers:
    control_queue: str
    importer_queue: str


@pytest.fixture
async def workers(temporal_client: Client, hub: HubFixture) -> AsyncIterator[Workers]:
    """The control worker, and the importer as in a cluster: `kama importer`'s server
    (on loopback here, on its pod IP there) with the worker relaying the operation's
    task queue to it."""
    queues = Workers(
        control_queue=f"control-{uuid.uuid4().hex[:8]}",
        importer_queue=f"importer-{uuid.uuid4().hex[:8]}",
    )
    with httpx.Client(timeout=30) as http:
        functions = importer_activities(http=http, hf_endpoint=hub.url)
        server = serve_importer(host="127.0.0.1", port=0, functions=functions, token=TOKEN)
        pod = ImporterPodAddress(
            namespace="models",
            name="importer",
            url=f"http://127.0.0.1:{server.server_address[1]}",
            token=TOKEN,
        )
        try:
            async with httpx.AsyncClient() as relay_http:
                relay = ImporterRelay(http=relay_http, pod=pod, results=result_types(functions))
                control = Worker(
                    temporal_client,
                    task_queue=queues.control_queue,
                    workflows=[ImportWorkflow, VerifyWorkflow],
                )
                importer = Worker(
                    temporal_client, task_queue=queues.importer_queue, activities=[relay.relay]
                )
                async with control, importer:
                    yield queues
        finally:
            server.shutdown()


async def run_import(
    client: Client,
    queues: Workers,
    hub: HubFixture,
    cache: Path,
    repo: str,
    files: list[str],
    **extra: str | int,
) -> ImportResult:
    request = ImportInput(
        operation_id=f"op-{uuid.uuid4().hex[:8]}",
        source=HubSource(repo=repo, revision="main", files=files),
        cache_root=str(cache),
        importer_task_queue=queues.importer_queue,
        **extra,  # type: ignore[arg-type]
    )
    return await client.execute_workflow(
        ImportWorkflow.run,
        request,
        id=f"import/{request.operation_id}",
        task_queue=queues.control_queue,
    )


def application_error(failure: WorkflowFailureError) -> ApplicationError:
    """The typed error behind a workflow failure, raised by an activity or the workflow."""
    error: BaseException | None = failure.cause
    while error is not None and not isinstance(error, ApplicationError):
        error = error.cause if hasattr(error, "cause") else None
    assert isinstance(error, ApplicationError), f"no ApplicationError in {failure!r}"
    return error


def blobs(cache: Path) -> list[Path]:
    root = cache / "blobs" / "sha256"
    return sorted(root.iterdir()) if root.exists() else []


async def test_import_verifies_publishes_and_reuses(
    temporal_client: Client, workers: Workers, hub: HubFixture, tmp_path: Path
) -> None:
    model = write_model(tmp_path / "tiny.gguf", shape=ModelShape(n_layer=3, n_head_kv=2))
    commit = hub.add_repo("acme/tiny", {"tiny.gguf": model, "README.md": tmp_path / "tiny.gguf"})
    cache = tmp_path / "cache"
    hub.inject(
        "acme/tiny", "tiny.gguf", Fault(truncate_at=100_000)
    )  # first attempt breaks mid-file

    first = await run_import(temporal_client, workers, hub, cache, "acme/tiny", ["tiny.gguf"])
    assert first.commit == commit and not first.reused
    (published,) = blobs(cache)
    assert published.name == first.artifact.manifest_digest
    assert (published / READY_NAME).exists()
    manifest = Manifest.parse((published / "manifest.json").read_bytes())
    assert manifest.entrypoint == "tiny.gguf" and manifest.files[0].size == model.stat().st_size
    assert (published / "tiny.gguf").read_bytes() == model.read_bytes()
    assert first.artifact.facts["layers"] == 3 and first.artifact.facts["headCountKV"] == 2
    assert first.artifact.facts["architecture"] == "llama"
    ranges = [(r.start, r.end) for r in hub.served_ranges("acme/tiny", "tiny.gguf")]
    assert ranges == [(0, 100_000), (100_000, model.stat().st_size)], (
        "the retry resumed, nothing fetched twice"
    )

    second = await run_import(temporal_client, workers, hub, cache, "acme/tiny", ["tiny.gguf"])
    assert second.reused and second.artifact.manifest_digest == first.artifact.manifest_digest
    assert len(hub.served_ranges("acme/tiny", "tiny.gguf")) == 2, (
        "the second import downloaded nothing"
    )
    assert len(blobs(cache)) == 1


async def test_shard_pattern_expands_to_complete_set(
    temporal_client: Client, workers: Workers, hub: HubFixture, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    shards = write_shards(tmp_path / "src", stem="big", shape=ModelShape(n_layer=4), n_shards=3)
    hub.add_repo("acme/big", {p.name: p for p in shards})
    result = await run_import(
        temporal_client, workers, hub, tmp_path / "cache", "acme/big", ["big-*-of-00003.gguf"]
    )
    assert [f.path for f in result.files] == [p.name for p in shards]
    assert result.artifact.facts["layers"] == 4

    hub.add_repo("acme/holey", {p.name: p for p in (shards[0], shards[2])})
    with pytest.raises(WorkflowFailureError) as failure:
        await run_import(
            temporal_client, workers, hub, tmp_path / "cache2", "acme/holey", ["big-*.gguf"]
        )
    cause = application_error(failure.value)
    assert cause.type == "MissingShard"
    assert "00002-of-00003" in str(cause)


async def test_wrong_bytes_fail_with_checksum_mismatch_and_publish_nothing(
    temporal_client: Client, workers: Workers, hub: HubFixture, tmp_path: Path
) -> None:
    model = write_model(tmp_path / "m.gguf", shape=ModelShape())
    hub.add_repo("acme/m", {"m.gguf": model})
    hub.inject("acme/m", "m.gguf", Fault(corrupt=True))
    cache = tmp_path / "cache"
    with pytest.raises(WorkflowFailureError) as failure:
        await run_import(temporal_client, workers, hub, cache, "acme/m", ["m.gguf"])
    cause = application_error(failure.value)
    assert cause.type == "ChecksumMismatch"
    assert blobs(cache) == []
    assert not any((cache / ".kama" / "staging").iterdir())


async def test_missing_repo_and_broken_gguf_are_not_retried(
    temporal_client: Client, workers: Workers, hub: HubFixture, tmp_path: Path
) -> None:
    with pytest.raises(WorkflowFailureError) as failure:
        await run_import(
            temporal_client, workers, hub, tmp_path / "cache", "acme/nothing", ["m.gguf"]
        )
    cause = application_error(failure.value)
    assert cause.type == "SourceUnavailable"
    info_calls = [r for r in hub.log.requests if r[1].startswith("/api/models/acme/nothing")]
    assert len(info_calls) == 1, "a 404 is not retried"

    private = write_model(tmp_path / "private.gguf", shape=ModelShape(seed=2))
    hub.add_repo("acme/private", {"p.gguf": private}, token="hf_right")
    with pytest.raises(WorkflowFailureError) as failure:
        await run_import(
            temporal_client, workers, hub, tmp_path / "cache", "acme/private", ["p.gguf"]
        )
    cause = application_error(failure.value)
    assert cause.type == "SourceUnavailable" and "401" in str(cause)
    assert len([r for r in hub.log.requests if r[1].startswith("/api/models/acme/private")]) == 1, (
        "a 401 is not retried"
    )

    broken = write_bad_magic(tmp_path / "bad.gguf", shape=ModelShape())
    hub.add_repo("acme/bad", {"bad.gguf": broken})
    with pytest.raises(WorkflowFailureError) as failure:
        await run_import(
            temporal_client, workers, hub, tmp_path / "cache", "acme/bad", ["bad.gguf"]
        )
    cause = application_error(failure.value)
    assert cause.type == "InvalidGGUF"
    assert blobs(tmp_path / "cache") == []


async def test_server_errors_are_retried_then_succeed(
    temporal_client: Client, workers: Workers, hub: HubFixture, tmp_path: Path
) -> None:
    model = write_model(tmp_path / "m.gguf", shape=ModelShape(seed=7))
    hub.add_repo("acme/flaky", {"m.gguf": model})
    hub.inject("acme/flaky", "m.gguf", Fault(status=503, times=2))
    result = await run_import(
        temporal_client, workers, hub, tmp_path / "cache", "acme/flaky", ["m.gguf"]
    )
    assert result.files[0].size == model.stat().st_size
    gets = [
        r
        for r in hub.log.requests
        if r[0] == "GET" and r[1].endswith("/m.gguf") and "acme/flaky" in r[1]
    ]
    assert len(gets) == 3


async def test_verify_rehashes_published_blob_and_catches_corruption(
    temporal_client: Client, workers: Workers, hub: HubFixture, tmp_path: Path
) -> None:
    model = write_model(tmp_path / "v.gguf", shape=ModelShape(seed=4))
    hub.add_repo("acme/verify", {"v.gguf": model})
    cache = tmp_path / "cache"
    imported = await run_import(temporal_client, workers, hub, cache, "acme/verify", ["v.gguf"])
    digest = imported.artifact.manifest_digest
    request = VerifyInput(
        importer_task_queue=workers.importer_queue, cache_root=str(cache), manifest_digest=digest
    )
    ok = await temporal_client.execute_workflow(
        VerifyWorkflow.run,
        request,
        id=f"verify/{uuid.uuid4().hex[:8]}",
        task_queue=workers.control_queue,
    )
    assert ok.bytes_checked == model.stat().st_size

    published = cache / "blobs" / "sha256" / digest / "v.gguf"
    data = bytearray(published.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit, same size: only a re-hash notices
    published.write_bytes(bytes(data))
    with pytest.raises(WorkflowFailureError) as failure:
        await temporal_client.execute_workflow(
            VerifyWorkflow.run,
            request,
            id=f"verify/{uuid.uuid4().hex[:8]}",
            task_queue=workers.control_queue,
        )
    cause = application_error(failure.value)
    assert cause.type == "ChecksumMismatch" and "v.gguf" in str(cause)


async def test_recorded_histories_replay_deterministically(
    temporal_client: Client, workers: Workers, hub: HubFixture, tmp_path: Path
) -> None:
    model = write_model(tmp_path / "r.gguf", shape=ModelShape(seed=8))
    hub.add_repo("acme/replay", {"r.gguf": model})
    hub.inject("acme/replay", "r.gguf", Fault(truncate_at=50_000))  # include a retried activity
    cache = tmp_path / "cache"
    result = await run_import(temporal_client, workers, hub, cache, "acme/replay", ["r.gguf"])
    verify_id = f"verify/{uuid.uuid4().hex[:8]}"
    await temporal_client.execute_workflow(
        VerifyWorkflow.run,
        VerifyInput(
            importer_task_queue=workers.importer_queue,
            cache_root=str(cache),
            manifest_digest=result.artifact.manifest_digest,
        ),
        id=verify_id,
        task_queue=workers.control_queue,
    )
    import_ids = [
        w.id
        async for w in temporal_client.list_workflows("WorkflowType='Import model'")
        if "import/op-" in w.id
    ]
    histories = [
        await temporal_client.get_workflow_handle(i).fetch_history() for i in import_ids[:3]
    ]
    histories.append(await temporal_client.get_workflow_handle(verify_id).fetch_history())
    replayer = Replayer(workflows=[ImportWorkflow, VerifyWorkflow])
    for history in histories:
        replay = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replay.replay_failure is None, f"{history.workflow_id}: {replay.replay_failure}"
