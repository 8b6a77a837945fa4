"""A ModelDeployment's status, typed and decided without I/O.

The DeploymentWorkflow gathers facts (the artifact, the placement decision, the pods)
and asks this module for the conditions and fields they mean; `next_status` applies
them to the last written `ModelDeploymentStatus`, derives `Ready` (the rule is in
`kama.api.deployment`) and the REASON column, and `wire` serialises the model only at
the edge, for the status patch. Reasons are `kama.reasons` values, so the gateway and
`kama status` read them as such, never by message text. `condition_events` says
which transitions deserve an Event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from kama.api import ModelArtifactStatus
from kama.api.deployment import DeploymentCondition, ModelDeploymentStatus
from kama.conditions import ConditionUpdate, condition_status, set_conditions, updated_status
from kama.reasons import DeploymentReason
from kama.rollout import ObservedPod

C = DeploymentCondition
R = DeploymentReason

WARNING_WHEN_TRUE: Final = frozenset({C.FIT_FAILED, C.DEGRADED})
EVENT_CONDITIONS: Final = (
    C.ARTIFACT_READY,
    C.PLACED,
    C.FIT_FAILED,
    C.DEGRADED,
    C.RUNTIME_READY,
    C.SERVING,
)


@dataclass(frozen=True)
class ConditionEvent:
    """An Event a condition's transition deserves."""

    type: str  # Normal | Warning
    reason: str
    message: str


# the artifact ----------------------------------------------------------------------


def artifact_waiting(*, name: str, artifact: ModelArtifactStatus | None) -> ConditionUpdate:
    """`ArtifactReady=False` for an artifact that is missing, failed, or not Ready yet
    (only the last is worth waiting for)."""
    if artifact is None:
        return (C.ARTIFACT_READY, False, R.ARTIFACT_MISSING, f"ModelArtifact {name} does not exist")
    if artifact.phase == "Failed":
        return (C.ARTIFACT_READY, False, R.ARTIFACT_FAILED, f"ModelArtifact {name} failed")
    return (
        C.ARTIFACT_READY,
        False,
        R.ARTIFACT_NOT_READY,
        f"ModelArtifact {name} is not Ready (phase {artifact.phase or 'unknown'})",
    )


def artifact_unusable(message: str) -> ConditionUpdate:
    return (C.ARTIFACT_READY, False, R.ARTIFACT_NOT_USABLE, message)


def artifact_served(digest: str | None) -> ConditionUpdate:
    return (C.ARTIFACT_READY, True, R.ARTIFACT_READY, f"serving {digest}")


def artifact_is_ready(artifact: ModelArtifactStatus | None) -> bool:
    return artifact is not None and any(
        c.type == "Ready" and c.status == "True" for c in artifact.conditions
    )


def fit_failed(message: str) -> list[ConditionUpdate]:
    return [(C.PLACED, False, R.FIT_FAILED, message), (C.FIT_FAILED, True, R.FIT_FAILED, message)]


# the replicas ----------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaCounts:
    """The serving pods as the workflow found them."""

    desired: int
    current: int  # of the current template, serving
    ready: int  # of those, ready
    routable: int  # any template, ready and serving


def replica_counts(*, pods: Sequence[ObservedPod], fingerprint: str, desired: int) -> ReplicaCounts:
    """How many of `pods` serve, of the template `fingerprint` and of any."""
    current = [p for p in pods if p.fingerprint == fingerprint and p.serving]
    return ReplicaCounts(
        desired=desired,
        current=len(current),
        ready=sum(1 for p in current if p.ready),
        routable=sum(1 for p in pods if p.ready and p.serving),
    )


def replica_fields(counts: ReplicaCounts) -> dict[str, Any]:
    """The status fields that count replicas (`kubectl get md` DESIRED and READY)."""
    return {
        "replicas": counts.current,
        "ready_replicas": counts.ready,
        "desired_replicas": counts.desired,
        "ready": f"{counts.ready}/{counts.desired}",
        "endpoints": counts.routable,
    }


def replica_conditions(counts: ReplicaCounts, *, failure: str | None) -> list[ConditionUpdate]:
    """`RuntimeReady`, `Serving` and `ScaledToZero` for `counts`; `failure` is the last
    rollout's `<Reason>: <message>` when it gave up or was refused."""
    if failure:
        reason, _, message = failure.partition(": ")
        runtime: ConditionUpdate = (C.RUNTIME_READY, False, reason, message)
    elif counts.desired == 0:
        runtime = (C.RUNTIME_READY, False, R.SCALED_TO_ZERO, "no replica is wanted")
    elif counts.ready >= counts.desired:
        runtime = (
            C.RUNTIME_READY,
            True,
            R.ALL_REPLICAS_READY,
            f"{counts.ready}/{counts.desired} ready",
        )
    else:
        runtime = (C.RUNTIME_READY, False, R.STARTING, f"{counts.ready}/{counts.desired} ready")
    routable, zero = counts.routable > 0, counts.desired == 0
    return [
        runtime,
        (
            C.SERVING,
            routable,
            R.ENDPOINTS if routable else R.NO_ENDPOINTS,
            f"{counts.routable} pod(s) accept requests",
        ),
        (
            C.SCALED_TO_ZERO,
            zero,
            R.SCALED_TO_ZERO if zero else R.SCALED,
            f"{counts.desired} replica(s) desired",
        ),
    ]


# the summary -----------------------------------------------------------------------


def ready_condition(conditions: Sequence[Mapping[str, Any]]) -> ConditionUpdate:
    """`Ready` from the other conditions, by the rule in `kama.api.deployment`: False
    with the first thing in the way; True when every desired replica is ready, or at
    zero on purpose while the artifact is Ready and a placement fits."""
    by_type = {c.get("type"): c for c in conditions}

    def ready(status: bool, reason: str, message: str) -> ConditionUpdate:
        return (C.READY, status, reason, message)

    for kind, reason, message in (
        (C.ARTIFACT_READY, R.ARTIFACT_NOT_READY, "the artifact is not Ready"),
        (C.PLACED, R.NOT_PLACED, "no placement decided yet"),
    ):
        found = by_type.get(kind) or {}
        if found.get("status") != "True":
            return ready(False, found.get("reason") or reason, found.get("message") or message)
    runtime = by_type.get(C.RUNTIME_READY) or {}
    if runtime.get("status") == "True":
        return ready(True, runtime["reason"], runtime.get("message", ""))
    if runtime.get("reason") == R.SCALED_TO_ZERO:
        return ready(
            True,
            R.SCALED_TO_ZERO,
            "no replica is wanted; the first request wakes one (the artifact is Ready and "
            "a placement fits)",
        )
    return ready(
        False, runtime.get("reason") or R.STARTING, runtime.get("message") or "no replica yet"
    )


def headline_reason(conditions: Sequence[Mapping[str, Any]]) -> str | None:
    """The REASON column: the first thing in the way, else what the runtime is doing."""
    by_type = {c.get("type"): c for c in conditions}
    artifact, fit = by_type.get(C.ARTIFACT_READY), by_type.get(C.FIT_FAILED)
    if artifact is not None and artifact.get("status") == "False":
        return str(artifact.get("reason"))
    if fit is not None and fit.get("status") == "True":
        return R.FIT_FAILED
    runtime = by_type.get(C.RUNTIME_READY)
    return None if runtime is None else str(runtime.get("reason"))


def next_status(
    previous: ModelDeploymentStatus,
    *,
    conditions: list[ConditionUpdate],
    fields: Mapping[str, Any],
    now: datetime,
    generation: int,
) -> ModelDeploymentStatus:
    """`previous` with `fields` (by their Python names) and `conditions` set, about
    `generation`, with `Ready` and the REASON column derived from the result."""
    data = updated_status(wire(previous), conditions, fields={}, now=now, generation=generation)
    found = data["conditions"]
    data["conditions"] = set_conditions(
        found, [ready_condition(found)], now=now, generation=generation
    )
    data["reason"] = headline_reason(data["conditions"])
    named = ModelDeploymentStatus.model_fields
    return ModelDeploymentStatus.model_validate(
        {**data, **{named[name].alias or name: value for name, value in fields.items()}}
    )


def wire(status: ModelDeploymentStatus) -> dict[str, Any]:
    """The status as the API server stores it (camelCase JSON; only the fields ever
    set, so a field set to None is written as null and removed by the merge patch)."""
    return status.model_dump(mode="json", by_alias=True, exclude_unset=True)


def condition_events(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[ConditionEvent]:
    """An Event for each condition of EVENT_CONDITIONS whose status changed: Warning
    when it turned bad (FitFailed or Degraded True, the others False), except a first
    False, which is where everything starts."""
    events: list[ConditionEvent] = []
    old_list, new_list = [dict(c) for c in before], [dict(c) for c in after]
    for kind in EVENT_CONDITIONS:
        old, new = condition_status(old_list, kind), condition_status(new_list, kind)
        if new is None or old == new:
            continue
        entry = next(c for c in after if c.get("type") == kind)
        bad = (new == "True") == (kind in WARNING_WHEN_TRUE)
        events.append(
            ConditionEvent(
                type="Warning" if bad and not (old is None and new == "False") else "Normal",
                reason=str(entry.get("reason")),
                message=f"{kind}={new}: {entry.get('message')}",
            )
        )
    return events
