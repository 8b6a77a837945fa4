"""The typed status helpers of `kama.conditions`: a workflow decides its status on the
pydantic status models and serialises it once, for the patch, in the shape the CRD
and `kubectl get` read (camelCase, only what was set, times to the second)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kama.api import ImportProgress, ModelArtifactStatus, ModelCacheStatus
from kama.api.meta import ConditionStatus
from kama.conditions import set_condition_models, status_json, updated_status_model
from kama.reasons import CacheReason, Failure

NOW = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = set_condition_models(
        [], [("Ready", False, Failure.IMPORT_FAILED, "no")], now=NOW, generation=1
    )
    later = NOW + timedelta(minutes=5)
    same = set_condition_models(
        first, [("Ready", False, Failure.SOURCE_UNAVAILABLE, "still no")], now=later, generation=2
    )
    flipped = set_condition_models(
        same, [("Ready", True, "Published", "yes")], now=later, generation=2
    )
    assert first[0].last_transition_time == NOW.replace(microsecond=0)
    assert same[0].last_transition_time == first[0].last_transition_time
    assert (same[0].reason, same[0].observed_generation) == ("SourceUnavailable", 2)
    assert flipped[0].last_transition_time == later.replace(microsecond=0)
    assert flipped[0].status is ConditionStatus.TRUE


def test_conditions_are_sorted_by_type_and_none_is_unknown() -> None:
    found = set_condition_models(
        [],
        [("Verified", None, "Checking", ""), ("Importing", True, "Downloading", "")],
        now=NOW,
        generation=None,
    )
    assert [c.type for c in found] == ["Importing", "Verified"]
    assert found[1].status is ConditionStatus.UNKNOWN


def test_fields_apply_in_order_and_only_those_set() -> None:
    before = ModelCacheStatus(claim_name="kama-cache-models", free_bytes=7)
    after = updated_status_model(
        before,
        [("Ready", True, CacheReason.CLAIM_BOUND, "bound")],
        fields=[ModelCacheStatus(capacity="1Gi"), ModelCacheStatus(capacity="2Gi")],
        now=NOW,
        generation=3,
    )
    assert status_json(after) == {
        "claimName": "kama-cache-models",
        "capacity": "2Gi",
        "freeBytes": 7,
        "observedGeneration": 3,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "ClaimBound",
                "message": "bound",
                "lastTransitionTime": "2026-01-02T03:04:05Z",
                "observedGeneration": 3,
            }
        ],
    }


def test_the_json_round_trips_through_the_model() -> None:
    """What a workflow carries across continue-as-new is the JSON it last wrote."""
    status = updated_status_model(
        ModelArtifactStatus(),
        [("Ready", False, "Importing", "")],
        fields=[ModelArtifactStatus(progress=ImportProgress(bytes_done=0, bytes_total=9))],
        now=NOW,
        generation=1,
    )
    written = status_json(status)
    assert written["progress"] == {"bytesDone": 0, "bytesTotal": 9}
    assert status_json(ModelArtifactStatus.model_validate(written)) == written
