"""What a ModelDeployment's status tells the gateway: why it is not serving (for the
503 a held request gets), and whether it cannot start a replica at all, so that
requests for it are answered at once instead of at the end of `coldStartTimeout`.

A deployment cannot start when its conditions say so for the spec it has now:
`FitFailed=True`; `ArtifactReady=False` because the artifact failed (an import or
verification failure reason, an artifact that does not exist or is in phase
Failed, or one the planner cannot use); `RuntimeReady=False` because the rollout
gave up (its pods kept failing, its deadline passed, the API server refused it).
The workflows that write these reasons are being reworked, so reasons are matched
defensively: a known list, plus any reason ending in `Failed`; anything else
(`Starting`, `ScaledToZero`, an artifact still importing) means "wait". A condition
written for an older generation (`observedGeneration` below the object's) is no
verdict on the current spec and is ignored: its workflow is already on the new one.
Pure, so it can be tested (and reused) without a cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ARTIFACT_FAILURES = frozenset(
    {
        "ChecksumMismatch",
        "InvalidGGUF",
        "MissingShard",
        "SourceUnavailable",
        "InsufficientStorage",
        "StorageUnavailable",
        "NotFound",
        "ArtifactNotUsable",
    }
)
ARTIFACT_GONE = ("(phase Failed)", "does not exist")  # messages of ArtifactNotReady
RUNTIME_FAILURES = frozenset(
    {
        "CrashLoop",
        "CrashLoopBackOff",
        "Forbidden",
        "Invalid",
        "NotFound",
        "Refused",
        "Unschedulable",
        "ProgressDeadlineExceeded",
    }
)
IN_PROGRESS = ("ScaledToZero", "Starting")


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The status's conditions by type, those about an older generation left out."""
    generation = (obj.get("metadata") or {}).get("generation")
    current = {}
    for c in (obj.get("status") or {}).get("conditions") or []:
        observed = c.get("observedGeneration")
        if isinstance(generation, int) and isinstance(observed, int) and observed < generation:
            continue
        current[str(c.get("type"))] = c
    return current


def _say(condition: Mapping[str, Any]) -> str:
    return f"{condition.get('reason')}: {condition.get('message')}"


def cannot_start(obj: Mapping[str, Any]) -> str | None:
    """Why the ModelDeployment `obj` cannot start a replica for its current spec
    (`<reason>: <message>`), or None if it may yet."""
    conditions = _conditions(obj)
    fit = conditions.get("FitFailed")
    if fit is not None and fit.get("status") == "True":
        return _say(fit)
    artifact = conditions.get("ArtifactReady")
    if artifact is not None and artifact.get("status") == "False":
        reason, message = str(artifact.get("reason")), str(artifact.get("message"))
        if (
            reason in ARTIFACT_FAILURES
            or reason.endswith("Failed")
            or any(sign in message for sign in ARTIFACT_GONE)
        ):
            return _say(artifact)
    runtime = conditions.get("RuntimeReady")
    if runtime is not None and runtime.get("status") == "False":
        reason = str(runtime.get("reason"))
        if reason in RUNTIME_FAILURES or reason.endswith("Failed"):
            return _say(runtime)
    return None


def not_serving_reason(obj: Mapping[str, Any]) -> str:
    """What stands in the way of serving, for messages: the first blocking condition
    (`<reason>: <message>`), else the status's own reason, else ""."""
    status = obj.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    for kind in ("ArtifactReady", "FitFailed", "RuntimeReady"):
        c = conditions.get(kind)
        bad = c is not None and (c.get("status") == "True") == (kind == "FitFailed")
        if c is not None and bad and c.get("reason") not in IN_PROGRESS:
            return _say(c)
    return str(status.get("reason") or "")
