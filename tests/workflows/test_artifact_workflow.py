"""ArtifactWorkflow (with its ImportWorkflow and VerifyWorkflow children) and
CacheWorkflow on Temporal's time-skipping test server, with faked Kubernetes and a
faked importer pod (`fakes.py`): a failed import waits for `retry`, a Direct claim is
verified in place, deletions wait for their users."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError

from activities.import_payloads import ResolvedFile
from kama.cache_layout import ManifestFile, artifact_digest
from kama.contracts import (
    ARTIFACTS,
    CACHES,
    RETRY,
    VERIFY,
    EntitySnapshot,
    ObjectRef,
    cache_workflow_id,
)
from tests.workflows import scenarios
from tests.workflows.fakes import MANIFEST_DIGEST, MODEL_FILE, MODEL_SIZE, NAMESPACE, condition
from tests.workflows.scenarios import Stage, hf_artifact_spec, staged, start_artifact
from tests.workflows.time_skipping import TimeSkippingServer
from workflows.cache import CacheInput, CacheWorkflow


async def test_failed_import_waits_for_retry_then_succeeds(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.artifact_retry(stage)


async def test_direct_claim_is_verified_in_place(time_skipping: TimeSkippingServer) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.artifact_in_place(stage)


async def test_cache_deletion_waits_for_artifacts_then_deletes_its_claim(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.cache_lifecycle(stage)


# hardening (issue 12, item 13): expectedSHA256 for shard sets, retry resumes its
# staging, StorageUnavailable, the cache's InsufficientCapacity and claim expansion,
# the `verify` signal; (item 14) a Direct artifact's files as the serving pod sees them

SHARDS = [
    ResolvedFile(path=f"big-0000{i}-of-00002.gguf", size=1000 * i, sha256=f"{i}" * 64)
    for i in (1, 2)
]
WRONG_SHA256 = "0" * 64


def pvc_spec(path: str, mode: str, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "source": {"persistentVolumeClaim": {"claimName": "weights", "path": path, "mode": mode}},
        **extra,
    }
    if mode == "Copy":
        spec["cacheRef"] = {"name": "models"}
    return spec


def condition_of(stage: Stage, plural: str, name: str, kind: str) -> dict[str, Any]:
    return condition(stage.cluster.status(plural, name), kind) or {}


async def until_condition(
    stage: Stage, plural: str, name: str, kind: str, *, status: str = "True", reason: str = ""
) -> dict[str, Any]:
    def check() -> dict[str, Any]:
        found = condition_of(stage, plural, name, kind)
        ok = found.get("status") == status and (not reason or found.get("reason") == reason)
        return found if ok else {}

    found: dict[str, Any] = await stage.until(
        check, within=timedelta(minutes=2), what=f"{name} {kind}={status} {reason}"
    )
    return found


async def test_expected_sha256_is_the_artifact_digest_of_a_shard_set(
    time_skipping: TimeSkippingServer,
) -> None:
    """A shard set is refused when spec.expectedSHA256 is not its artifact digest:
    before downloading when the source gives every file's sha256, after copying
    when it does not, and in place for a Direct claim."""
    async with staged(time_skipping) as stage:
        stage.importer.files = list(SHARDS)
        digest = artifact_digest([ManifestFile(f.path, f.size, f.sha256 or "") for f in SHARDS])
        await start_artifact(
            stage, "hf", {**hf_artifact_spec("acme/big"), "expectedSHA256": digest}
        )
        await until_condition(stage, ARTIFACTS, "hf", "Ready")

        wrong = {"expectedSHA256": WRONG_SHA256}
        await start_artifact(stage, "hf-wrong", {**hf_artifact_spec("acme/big"), **wrong})
        found = await until_condition(stage, ARTIFACTS, "hf-wrong", "ChecksumMismatch")
        assert "artifact digest of 2 files" in found["message"] and digest in found["message"]
        assert len(stage.importer.called("Download file into cache staging")) == 2, (
            "only the right artifact was downloaded"
        )

        stage.importer.files = [replace(f, sha256=None) for f in SHARDS]  # a claim: no sha256
        await start_artifact(stage, "copied", pvc_spec("big", "Copy", **wrong))
        await until_condition(stage, ARTIFACTS, "copied", "ChecksumMismatch")
        assert len(stage.importer.called("Copy file into cache staging")) == 2
        assert stage.importer.called("Discard staged files"), "the copied bytes are dropped"
        assert len(stage.importer.called("Inspect GGUF and publish artifact")) == 1, (
            "only the right artifact was published"
        )

        await start_artifact(stage, "direct", pvc_spec("big", "Direct", **wrong))
        await until_condition(stage, ARTIFACTS, "direct", "ChecksumMismatch")
        assert condition_of(stage, ARTIFACTS, "direct", "Ready")["status"] == "False"


async def test_a_retried_import_resumes_in_the_same_staging(
    time_skipping: TimeSkippingServer,
) -> None:
    """Every attempt of one artifact downloads into the same staging directory, so the
    `retry` after a failed download resumes its partial file instead of starting a
    new one; room is made (stale staging removed) for that staging."""
    async with staged(time_skipping) as stage:
        stage.importer.download_failures.append(
            ApplicationError("acme/tiny: HTTP 403", type="SourceUnavailable", non_retryable=True)
        )
        snapshot, handle = await start_artifact(stage, "resumed", hf_artifact_spec("acme/tiny"))
        await until_condition(
            stage, ARTIFACTS, "resumed", "Ready", status="False", reason="SourceUnavailable"
        )
        await handle.signal(RETRY)
        await until_condition(stage, ARTIFACTS, "resumed", "Ready")
        first, second = stage.importer.called("Download file into cache staging")
        staging = f"artifact-{snapshot.ref.uid}"
        assert first.operation_id == second.operation_id == staging
        prepared = stage.importer.called("Prepare cache staging")
        assert [p["staging_id"] for p in prepared] == [staging, staging]
        (published,) = stage.importer.called("Inspect GGUF and publish artifact")
        assert published.operation_id == staging
        pods = {p.operation_id for p in stage.cluster.called("Start importer pod")}
        assert len(pods) == 2, "each attempt still has its own importer pod and queue"


async def test_a_missing_cache_is_storage_unavailable(time_skipping: TimeSkippingServer) -> None:
    async with staged(time_skipping) as stage:
        stage.cluster.claim_failures.append(
            ApplicationError(
                "ModelCache models/models does not exist",
                type="StorageUnavailable",
                non_retryable=True,
            )
        )
        await start_artifact(stage, "homeless", hf_artifact_spec("acme/tiny"))
        found = await until_condition(stage, ARTIFACTS, "homeless", "StorageUnavailable")
        assert "does not exist" in found["message"]
        assert (
            condition_of(stage, ARTIFACTS, "homeless", "InsufficientStorage").get("status")
            != "True"
        ), "a missing cache is not a full one"


async def start_cache(
    stage: Stage, spec: dict[str, Any], *, uid: str
) -> tuple[EntitySnapshot, WorkflowHandle[Any, Any]]:
    ref = ObjectRef(namespace=NAMESPACE, name="models", uid=uid)
    snapshot = EntitySnapshot(ref=ref, generation=1, spec=spec)
    stage.cluster.watch(cache_workflow_id(ref), snapshot)
    handle = await stage.client.start_workflow(
        CacheWorkflow.run,
        CacheInput(snapshot=snapshot),
        id=cache_workflow_id(ref),
        task_queue=stage.task_queue,
    )
    await until_condition(stage, CACHES, "models", "Ready")
    return snapshot, handle


async def test_an_import_that_does_not_fit_sets_the_caches_insufficient_capacity(
    time_skipping: TimeSkippingServer,
) -> None:
    """The import tells the cache what it found: too little room makes the artifact
    InsufficientStorage and the cache InsufficientCapacity (naming the artifact and
    the numbers); the retry that fits clears it and reports the free bytes left."""
    uid = str(uuid.uuid4())
    async with staged(time_skipping, cache_uid=uid) as stage:
        await start_cache(stage, {"claimTemplate": {"size": "10Gi"}}, uid=uid)
        stage.importer.free_bytes = 1000
        _, handle = await start_artifact(stage, "huge", hf_artifact_spec("acme/tiny"))
        await until_condition(stage, ARTIFACTS, "huge", "InsufficientStorage")
        found = await until_condition(
            stage, CACHES, "models", "InsufficientCapacity", reason="ImportDoesNotFit"
        )
        assert "huge" in found["message"] and f"needs {MODEL_SIZE} bytes" in found["message"]
        assert stage.cluster.status(CACHES, "models")["freeBytes"] == 1000
        assert condition_of(stage, CACHES, "models", "Ready")["status"] == "True"

        stage.importer.free_bytes = 10 << 30
        await handle.signal(RETRY)
        await until_condition(stage, ARTIFACTS, "huge", "Ready")
        await until_condition(stage, CACHES, "models", "InsufficientCapacity", status="False")
        assert stage.cluster.status(CACHES, "models")["freeBytes"] == (10 << 30) - MODEL_SIZE


async def test_a_grown_claim_template_is_expanded_or_says_why_not(
    time_skipping: TimeSkippingServer,
) -> None:
    """Each pass sizes the claim Kama created; a claim that cannot grow, or is still
    growing, is InsufficientCapacity with the reason, re-checked until it has grown."""
    async with staged(time_skipping) as stage:
        stage.cluster.claim_expansion = {
            "state": "ExpansionNotSupported",
            "message": "StorageClass local does not allow volume expansion",
        }
        snapshot, handle = await start_cache(
            stage, {"claimTemplate": {"size": "20Gi"}}, uid=str(uuid.uuid4())
        )
        found = await until_condition(
            stage, CACHES, "models", "InsufficientCapacity", reason="ExpansionNotSupported"
        )
        assert "allowVolumeExpansion" in found["message"] or "expansion" in found["message"]

        stage.cluster.claim_expansion = {"state": "Expanding", "message": "10Gi to 30Gi"}
        grown = replace(snapshot, generation=2, spec={"claimTemplate": {"size": "30Gi"}})
        await stage.cluster.change(handle.id, grown)
        await until_condition(stage, CACHES, "models", "InsufficientCapacity", reason="Expanding")
        stage.cluster.claim_expansion = {"state": "Sized", "message": "claim has 30Gi"}
        await until_condition(stage, CACHES, "models", "InsufficientCapacity", status="False")
        sized = stage.cluster.called("Expand cache claim")
        assert len(sized) >= 3 and all(r.name == "models" for r in sized)


async def test_the_verify_signal_rehashes_and_a_mismatch_waits_for_retry(
    time_skipping: TimeSkippingServer,
) -> None:
    """`temporal workflow signal --name verify` on a Ready artifact re-hashes its
    published blob in a VerifyWorkflow child; other bytes make it Failed with
    ChecksumMismatch, and `retry` imports it again."""
    async with staged(time_skipping) as stage:
        _, handle = await start_artifact(stage, "checked", hf_artifact_spec("acme/tiny"))
        await until_condition(stage, ARTIFACTS, "checked", "Ready")
        await handle.signal(VERIFY)
        await until_condition(stage, ARTIFACTS, "checked", "Verified", reason="Rehashed")
        (rehash,) = stage.importer.called("Re-hash published artifact")
        assert rehash.manifest_digest == MANIFEST_DIGEST
        assert any(e.reason == "Verified" for e in stage.cluster.events("checked"))
        assert condition_of(stage, ARTIFACTS, "checked", "Ready")["status"] == "True"
        assert len(stage.cluster.called("Delete pod")) == 2, "the verify's importer is removed"

        stage.importer.verify_failures.append(
            ApplicationError(
                "tiny.gguf: sha256 00 != expected ef",
                type="ChecksumMismatch",
                non_retryable=True,
            )
        )
        await handle.signal(VERIFY)
        await until_condition(
            stage, ARTIFACTS, "checked", "Ready", status="False", reason="ChecksumMismatch"
        )
        assert condition_of(stage, ARTIFACTS, "checked", "Verified")["status"] == "False"
        await handle.signal(RETRY)
        await until_condition(stage, ARTIFACTS, "checked", "Ready")
        assert len(stage.importer.called("Download file into cache staging")) == 2


async def test_a_direct_artifacts_files_are_named_as_the_serving_pod_sees_them(
    time_skipping: TimeSkippingServer,
) -> None:
    """A Direct file in a sub-directory of its claim: servingLocation.subPath is that
    directory, mounted at /models, so the files are named relative to it (the
    entrypoint is /models/tiny.gguf, not /models/models/tiny.gguf)."""
    async with staged(time_skipping) as stage:
        stage.importer.files = [
            ResolvedFile(path=f"models/{MODEL_FILE}", size=MODEL_SIZE, sha256=None)
        ]
        await start_artifact(stage, "direct", pvc_spec(f"models/{MODEL_FILE}", "Direct"))
        await until_condition(stage, ARTIFACTS, "direct", "Ready")
        status = stage.cluster.status(ARTIFACTS, "direct")
        assert status["servingLocation"]["subPath"] == "models"
        assert [f["path"] for f in status["files"]] == [MODEL_FILE]


async def test_every_status_write_names_the_entity_workflow(
    time_skipping: TimeSkippingServer,
) -> None:
    """`status.workflowID` is the entity's own workflow (what `kubectl get -o wide` and
    `kama status` lead to), on every status write of the resource."""
    uid = str(uuid.uuid4())
    async with staged(time_skipping, cache_uid=uid) as stage:
        _, cache = await start_cache(stage, {"claimTemplate": {"size": "10Gi"}}, uid=uid)
        _, artifact = await start_artifact(stage, "named", hf_artifact_spec("acme/tiny"))
        await until_condition(stage, ARTIFACTS, "named", "Ready")
        assert stage.cluster.status(ARTIFACTS, "named")["workflowID"] == artifact.id
        assert stage.cluster.status(CACHES, "models")["workflowID"] == cache.id
        own = [
            patch.status
            for patch in stage.cluster.called("Write status")
            if patch.ref.name == "named"
        ]
        assert own and all(status["workflowID"] == artifact.id for status in own)
