"""What an import or a requested re-hash leaves in a ModelArtifact's status
(workflows/artifact_outcomes.py): where serving pods mount it, the conditions a user
reads with `kubectl describe`, and the room an import that did not fit reports."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError, ChildWorkflowError, RetryState

from activities.claims import CacheClaim
from activities.import_payloads import DownloadedFile, InPlaceArtifact, PublishedArtifact
from kama.api import ArtifactCondition, ArtifactPhase
from kama.conditions import ConditionUpdate
from kama.reasons import Failure
from workflows.artifact_outcomes import (
    failure_conditions,
    in_place_result,
    published_status,
    shortage,
)
from workflows.import_model import ImportResult
from workflows.verify_model import VerifyResult

DIGEST = "ab" * 32
COMMIT = "c0ffee" * 6 + "c0ff"
CLAIM = CacheClaim(claim_name="models", access_modes=["ReadWriteOnce"])


def imported(*, in_place: bool = False, reused: bool = False) -> ImportResult:
    return ImportResult(
        commit="" if in_place else COMMIT,
        files=[
            DownloadedFile(path="b.gguf", size=2, sha256="22" * 32),
            DownloadedFile(path="a.gguf", size=1, sha256="11" * 32),
        ],
        artifact=PublishedArtifact(
            manifest_digest=DIGEST,
            artifact_digest="cd" * 32,
            total_size=3,
            directory="models/tiny",
            entrypoint="a.gguf",
        ),
        reused=reused,
        in_place=in_place,
    )


def conditions_by_type(updates: list[ConditionUpdate]) -> dict[str, tuple[bool | None, str]]:
    return {kind: (value, reason) for kind, value, reason, _ in updates}


def test_a_published_artifact_is_ready_with_its_files_sorted_and_mounted_from_its_blob() -> None:
    status, conditions = published_status(imported(), CLAIM)
    assert status.phase is ArtifactPhase.READY
    assert [f.path for f in status.files or []] == ["a.gguf", "b.gguf"]
    assert status.manifest_digest == f"sha256:{DIGEST}"
    assert status.short_digest == "cd" * 6
    assert status.serving_location is not None
    assert status.serving_location.sub_path == f"blobs/sha256/{DIGEST}"
    assert status.resolved_commit == COMMIT
    found = conditions_by_type(conditions)
    assert found[ArtifactCondition.READY] == (True, "Published")
    assert found[ArtifactCondition.VERIFIED][0] is True


def test_a_direct_source_is_mounted_where_it_lies() -> None:
    status, _ = published_status(imported(in_place=True), CLAIM)
    assert status.serving_location is not None
    assert status.serving_location.sub_path == "models/tiny"
    assert status.resolved_commit is None


def test_publishing_clears_every_failure_condition_of_an_earlier_attempt() -> None:
    found = conditions_by_type(published_status(imported(), CLAIM)[1])
    for condition in (
        ArtifactCondition.CHECKSUM_MISMATCH,
        ArtifactCondition.INVALID_GGUF,
        ArtifactCondition.MISSING_SHARD,
        ArtifactCondition.INSUFFICIENT_STORAGE,
        ArtifactCondition.SOURCE_UNAVAILABLE,
        ArtifactCondition.STORAGE_UNAVAILABLE,
    ):
        assert found[condition][0] is False, condition


def test_a_checksum_mismatch_is_not_ready_not_verified_and_says_so() -> None:
    found = conditions_by_type(failure_conditions(Failure.CHECKSUM_MISMATCH, "bytes differ"))
    assert found[ArtifactCondition.READY] == (False, Failure.CHECKSUM_MISMATCH)
    assert found[ArtifactCondition.VERIFIED] == (False, Failure.CHECKSUM_MISMATCH)
    assert found[ArtifactCondition.CHECKSUM_MISMATCH] == (True, Failure.CHECKSUM_MISMATCH)


def test_an_unbound_claim_reads_as_storage_unavailable() -> None:
    found = conditions_by_type(failure_conditions(Failure.CLAIM_NOT_BOUND, "pending"))
    assert found[ArtifactCondition.STORAGE_UNAVAILABLE] == (True, Failure.CLAIM_NOT_BOUND)
    assert ArtifactCondition.VERIFIED not in found


def test_a_failure_without_a_condition_of_its_own_only_unsets_ready() -> None:
    found = conditions_by_type(failure_conditions(Failure.IMPORT_FAILED, "boom"))
    assert set(found) == {ArtifactCondition.IMPORTING, ArtifactCondition.READY}


def test_an_in_place_verification_names_its_files_relative_to_their_directory() -> None:
    verified = VerifyResult(
        bytes_checked=3,
        artifact=InPlaceArtifact(
            files=[DownloadedFile(path="models/tiny/a.gguf", size=3, sha256="11" * 32)],
            manifest_digest=DIGEST,
            artifact_digest="cd" * 32,
            total_size=3,
            base_path="models/tiny",
            entrypoint="a.gguf",
        ),
    )
    result = in_place_result(verified)
    assert result.in_place and not result.reused
    assert [f.path for f in result.files] == ["a.gguf"]
    assert result.artifact.directory == "models/tiny"


def test_the_room_an_import_did_not_fit_in_is_read_from_behind_its_child() -> None:
    cause = ApplicationError(
        "no room",
        {"freeBytes": 10, "neededBytes": 30},
        type=Failure.INSUFFICIENT_STORAGE,
        non_retryable=True,
    )
    failed = ChildWorkflowError(
        "child failed",
        namespace="default",
        workflow_id="import/x",
        run_id="r",
        workflow_type="Import model",
        initiated_event_id=1,
        started_event_id=2,
        retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )
    failed.__cause__ = cause
    assert shortage(failed) == (10, 30)
    assert shortage(ApplicationError("other", type=Failure.SOURCE_UNAVAILABLE)) is None
