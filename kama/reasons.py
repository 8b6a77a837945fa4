"""Every reason Kama writes on a resource's conditions, and every typed failure its
activities and workflows raise, as enums: the workflows write them, and the gateway
and `kama status` read them as values, never by matching message text.

A failure's type (`ApplicationError.type`) becomes the reason of the condition that
reports it, so the two vocabularies overlap on purpose: `Failure` names what can go
wrong, and `DeploymentReason` (`ArtifactReason`, `CacheReason`) adds what a healthy
or waiting deployment (artifact, cache) says.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Failure(StrEnum):
    """Typed failures (`ApplicationError.type`), each one a reason on a condition."""

    # the artifact's bytes or files
    CHECKSUM_MISMATCH = "ChecksumMismatch"
    INVALID_GGUF = "InvalidGGUF"
    MISSING_SHARD = "MissingShard"
    # where the bytes come from and go to
    SOURCE_UNAVAILABLE = "SourceUnavailable"
    INSUFFICIENT_STORAGE = "InsufficientStorage"
    STORAGE_UNAVAILABLE = "StorageUnavailable"
    CLAIM_NOT_BOUND = "ClaimNotBound"
    TRANSFER_INTERRUPTED = "TransferInterrupted"
    IMPORTER_UNAVAILABLE = "ImporterUnavailable"  # the importer pod did not answer
    IMPORTER_ANSWER_INVALID = "ImporterAnswerInvalid"  # it answered out of protocol
    IMPORT_FAILED = "ImportFailed"  # an import failure that names no type of its own
    VERIFY_FAILED = "VerifyFailed"  # a requested re-hash could not run (bytes not blamed)
    EXPANSION_FAILED = "ExpansionFailed"  # sizing a cache's claim failed with no type of its own
    # the API server's answers (`activities.kube_errors`)
    FORBIDDEN = "Forbidden"
    INVALID = "Invalid"
    NOT_FOUND = "NotFound"
    OBJECT_CHANGED = "ObjectChanged"
    # the spec, the runtime, the rest of the cluster
    SPEC_INVALID = "SpecInvalid"
    COLD_START_TIMEOUT = "ColdStartTimeout"
    KEDA_UNAVAILABLE = "KedaUnavailable"
    FORGED_REQUEST = "ForgedRequest"
    OWNER_GONE = "OwnerGone"  # the Kama resource an activity acts for is deleted
    PLACEMENT_NOT_ALLOWED = "PlacementNotAllowed"  # a serving pod's placement, refused


class DeploymentReason(StrEnum):
    """Reasons on a ModelDeployment's conditions (`kama.api.deployment`)."""

    # ArtifactReady
    ARTIFACT_READY = "Ready"
    ARTIFACT_NOT_READY = "ArtifactNotReady"  # still importing or verifying: wait
    ARTIFACT_MISSING = "ArtifactMissing"  # no such ModelArtifact
    ARTIFACT_FAILED = "ArtifactFailed"  # the artifact is in phase Failed
    ARTIFACT_NOT_USABLE = "ArtifactNotUsable"  # Ready, but nothing Kama can serve
    # Placed / FitFailed
    FIT_FAILED = "FitFailed"
    FITS = "Fits"
    ESTIMATED = "Estimated"
    PROFILED = "Profiled"
    NOT_PLACED = "NotPlaced"
    # Degraded
    FULL_GPU = "FullGPU"
    AS_REQUESTED = "AsRequested"
    CPU_PLACEMENT = "CPUPlacement"
    HYBRID_PLACEMENT = "HybridPlacement"
    # RuntimeReady (also the reasons of a rollout that gave up or was refused)
    ALL_REPLICAS_READY = "AllReplicasReady"
    STARTING = "Starting"
    SCALED_TO_ZERO = "ScaledToZero"
    RUNTIME_FAILED = "RuntimeFailed"
    CRASH_LOOP = "CrashLoop"
    CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    UNSCHEDULABLE = "Unschedulable"
    REFUSED = "Refused"
    FORBIDDEN = "Forbidden"
    INVALID = "Invalid"
    NOT_FOUND = "NotFound"
    SPEC_INVALID = "SpecInvalid"
    # Serving
    ENDPOINTS = "Endpoints"
    NO_ENDPOINTS = "NoEndpoints"
    # ScaledToZero
    SCALED = "Scaled"


class ArtifactReason(StrEnum):
    """Reasons on a ModelArtifact's conditions and Events besides its failures."""

    IMPORTING = "Importing"  # Ready=False while an import runs
    DOWNLOADING = "Downloading"  # Importing: copying from the source
    VERIFYING = "Verifying"  # Importing: a Direct source hashed in place
    RESOLVED = "Resolved"  # SourceResolved
    IMPORTED = "Imported"  # Importing=False, and the failure conditions cleared
    CHECKSUMS_MATCH = "ChecksumsMatch"  # Verified at import
    REHASHED = "Rehashed"  # Verified by a requested re-hash
    PUBLISHED = "Published"  # Ready
    # Events
    READY = "Ready"
    VERIFIED = "Verified"
    DELETION_BLOCKED = "DeletionBlocked"


class CacheReason(StrEnum):
    """Reasons on a ModelCache's conditions and Events besides its failures."""

    CLAIM_BOUND = "ClaimBound"  # Ready
    IMPORT_DOES_NOT_FIT = "ImportDoesNotFit"  # InsufficientCapacity: an import's report
    ENOUGH = "Enough"  # InsufficientCapacity=False
    DELETION_BLOCKED = "DeletionBlocked"  # Event


ARTIFACT_FAILURES: Final = frozenset(
    {
        Failure.CHECKSUM_MISMATCH,
        Failure.INVALID_GGUF,
        Failure.MISSING_SHARD,
        Failure.SOURCE_UNAVAILABLE,
        Failure.INSUFFICIENT_STORAGE,
        Failure.STORAGE_UNAVAILABLE,
        Failure.NOT_FOUND,
        Failure.IMPORT_FAILED,
        Failure.SPEC_INVALID,
    }
)
"""Reasons of an artifact that will not become Ready without a person."""

ARTIFACT_BLOCKS: Final = frozenset(
    {
        DeploymentReason.ARTIFACT_MISSING,
        DeploymentReason.ARTIFACT_FAILED,
        DeploymentReason.ARTIFACT_NOT_USABLE,
    }
)
"""`ArtifactReady=False` reasons of the deployment's own (beside the artifact's
failures, carried over) after which no replica can start for this spec."""

RUNTIME_BLOCKS: Final = frozenset(
    {
        DeploymentReason.RUNTIME_FAILED,
        DeploymentReason.CRASH_LOOP,
        DeploymentReason.CRASH_LOOP_BACK_OFF,
        DeploymentReason.PROGRESS_DEADLINE_EXCEEDED,
        DeploymentReason.UNSCHEDULABLE,
        DeploymentReason.REFUSED,
        DeploymentReason.FORBIDDEN,
        DeploymentReason.INVALID,
        DeploymentReason.NOT_FOUND,
        DeploymentReason.SPEC_INVALID,
    }
)
"""`RuntimeReady=False` reasons of a rollout that gave up or was refused: no replica
starts before a spec change or a `retry`."""


def blocks_artifact(reason: str) -> bool:
    """Whether an `ArtifactReady=False` reason means the artifact will not be served
    without a person (a failed import, a missing or unusable artifact)."""
    return reason in ARTIFACT_BLOCKS or reason in ARTIFACT_FAILURES


def blocks_runtime(reason: str) -> bool:
    """Whether a `RuntimeReady=False` reason means the last rollout gave up or was
    refused (an unknown failure type of a rollout is reported as `RuntimeFailed`)."""
    return reason in RUNTIME_BLOCKS
