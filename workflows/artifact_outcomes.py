"""What an ArtifactWorkflow's import or verification ends in, as the ModelArtifact's
status: the fields and conditions of a published artifact, the conditions of a typed
failure, a Direct source's verification in the shape of an import, and the shortage
behind an import that did not fit. Pure functions of the results, apart from the
workflow (which only decides when to write them), so they read, and are tested, on
their own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import PurePosixPath

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from workflows.kube_calls import causes

with workflow.unsafe.imports_passed_through():
    from activities.claims import CacheClaim
    from activities.import_payloads import PublishedArtifact
    from kama.api import (
        ArtifactCondition,
        ArtifactFile,
        ArtifactPhase,
        GGUFInfo,
        ImportProgress,
        ModelArtifactSpec,
        ModelArtifactStatus,
        PVCSourceMode,
        ServingLocation,
    )
    from kama.cache_layout import blob_dir
    from kama.conditions import ConditionUpdate
    from kama.reasons import ArtifactReason, Failure
    from workflows.import_model import ImportResult
    from workflows.verify_model import VerifyResult

FAILURE_CONDITIONS: Mapping[str, ArtifactCondition] = {
    Failure.CHECKSUM_MISMATCH: ArtifactCondition.CHECKSUM_MISMATCH,
    Failure.INVALID_GGUF: ArtifactCondition.INVALID_GGUF,
    Failure.MISSING_SHARD: ArtifactCondition.MISSING_SHARD,
    Failure.INSUFFICIENT_STORAGE: ArtifactCondition.INSUFFICIENT_STORAGE,
    Failure.SOURCE_UNAVAILABLE: ArtifactCondition.SOURCE_UNAVAILABLE,
    Failure.STORAGE_UNAVAILABLE: ArtifactCondition.STORAGE_UNAVAILABLE,
    Failure.CLAIM_NOT_BOUND: ArtifactCondition.STORAGE_UNAVAILABLE,
}
"""The condition each typed failure sets True (the others only set Ready=False)."""


def is_direct(spec: ModelArtifactSpec) -> bool:
    """The artifact is served in place from its source claim (no cache copy)."""
    pvc = spec.source.persistent_volume_claim
    return pvc is not None and pvc.mode is PVCSourceMode.DIRECT


def in_place_result(verified: VerifyResult) -> ImportResult:
    """A Direct source's verification, in the shape of an import result. Its files are
    named relative to the artifact's directory (`servingLocation.subPath`), as every
    artifact's files are, and as its manifest and the serving pod's `/models` see them
    (a Direct source's files are the children of one directory)."""
    found = verified.artifact
    assert found is not None
    files = [replace(f, path=PurePosixPath(f.path).name) for f in found.files]
    artifact = PublishedArtifact(
        manifest_digest=found.manifest_digest,
        artifact_digest=found.artifact_digest,
        total_size=found.total_size,
        directory=found.base_path,
        facts=found.facts,
        entrypoint=found.entrypoint,
        projector=found.projector,
    )
    return ImportResult(commit="", files=files, artifact=artifact, reused=False, in_place=True)


def shortage(error: BaseException) -> tuple[int, int] | None:
    """(free, needed) bytes of an import that did not fit in its cache, from the
    `InsufficientStorage` error behind a failed child workflow."""
    for found in causes(error):
        if isinstance(found, ApplicationError) and found.type == Failure.INSUFFICIENT_STORAGE:
            details = found.details[0] if found.details else None
            if isinstance(details, dict):
                return int(details.get("freeBytes", 0)), int(details.get("neededBytes", 0))
            return None
    return None


def how_imported(result: ImportResult) -> str:
    """What the import did, for the conditions and the Ready event."""
    if result.reused:
        return "reused the published blob"
    return f"downloaded {len(result.files)} file(s)"


def published_status(
    result: ImportResult, claim: CacheClaim
) -> tuple[ModelArtifactStatus, list[ConditionUpdate]]:
    """The status fields and conditions of an artifact `result` published on `claim`:
    Ready, every file's sha256, the digests and GGUF facts, where pods mount it, and
    every failure condition of an earlier attempt cleared."""
    art = result.artifact
    digest = f"sha256:{art.manifest_digest}"
    published = ModelArtifactStatus(
        phase=ArtifactPhase.READY,
        files=[
            ArtifactFile(path=f.path, size=f.size, sha256=f.sha256)
            for f in sorted(result.files, key=lambda f: f.path)
        ],
        manifest_digest=digest,
        artifact_digest=f"sha256:{art.artifact_digest}",
        short_digest=art.artifact_digest[:12],
        total_size=art.total_size,
        gguf=GGUFInfo.model_validate(art.facts),
        serving_location=ServingLocation(
            claim_name=claim.claim_name,
            sub_path=art.directory if result.in_place else str(blob_dir(art.manifest_digest)),
            access_modes=claim.access_modes,
            node_affinity=claim.node_affinity or None,
        ),
        progress=ImportProgress(bytes_done=art.total_size, bytes_total=art.total_size),
        resolved_commit=result.commit or None,
        entrypoint=art.entrypoint or None,
        projector=art.projector or None,
    )
    conditions: list[ConditionUpdate] = [
        (
            ArtifactCondition.SOURCE_RESOLVED,
            True,
            ArtifactReason.RESOLVED,
            f"revision resolved to commit {result.commit}"
            if result.commit
            else "files found on the source claim",
        ),
        (ArtifactCondition.IMPORTING, False, ArtifactReason.IMPORTED, how_imported(result)),
        (
            ArtifactCondition.VERIFIED,
            True,
            ArtifactReason.CHECKSUMS_MATCH,
            "sha256 of every file matches the source",
        ),
        *[
            (c, False, ArtifactReason.IMPORTED, "")
            for c in dict.fromkeys(FAILURE_CONDITIONS.values())
        ],
        (ArtifactCondition.READY, True, ArtifactReason.PUBLISHED, f"published as {digest}"),
    ]
    return published, conditions


def failure_conditions(kind: str, message: str) -> list[ConditionUpdate]:
    """The conditions of an import (or a requested re-hash) that failed with `kind`:
    not Importing, not Ready, not Verified on a checksum mismatch, and the failure's
    own condition where it has one."""
    conditions: list[ConditionUpdate] = [
        (ArtifactCondition.IMPORTING, False, kind, message),
        (ArtifactCondition.READY, False, kind, message),
    ]
    if kind == Failure.CHECKSUM_MISMATCH:
        conditions.append((ArtifactCondition.VERIFIED, False, kind, message))
    condition = FAILURE_CONDITIONS.get(kind)
    if condition is not None:
        conditions.append((condition, True, kind, message))
    return conditions
