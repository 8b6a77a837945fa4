"""What a ModelDeployment's status tells the gateway: why it is not serving (for the
503 a held request gets), and whether it cannot start a replica at all, so that
requests for it are answered at once instead of at the end of `coldStartTimeout`.

A deployment cannot start when its conditions say so for the spec it has now:
`FitFailed=True`; `ArtifactReady=False` with a reason `kama.reasons.blocks_artifact`
names (the artifact's import or verification failed, there is no such artifact, it
is in phase Failed, or the planner cannot use it); `RuntimeReady=False` with a reason
`kama.reasons.blocks_runtime` names (the rollout gave up or was refused). Reasons are
read as the values the workflows write, never from message text; any other reason
(`ArtifactNotReady` while the artifact imports, `Starting`, `ScaledToZero`) means
"wait". A condition written for an older generation (`observedGeneration` below the
object's) is no verdict on the current spec and is ignored: its workflow is already
on the new one. Pure, so it can be tested (and reused) without a cluster."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from kama.api.deployment import DeploymentCondition
from kama.reasons import DeploymentReason, blocks_artifact, blocks_runtime

IN_PROGRESS: Final = frozenset({DeploymentReason.SCALED_TO_ZERO, DeploymentReason.STARTING})
"""Reasons of a `RuntimeReady=False` that is no obstacle: the deployment is on its way."""


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


def _always(reason: str) -> bool:
    return True


CANNOT_START: tuple[tuple[DeploymentCondition, str, Callable[[str], bool]], ...] = (
    (DeploymentCondition.FIT_FAILED, "True", _always),
    (DeploymentCondition.ARTIFACT_READY, "False", blocks_artifact),
    (DeploymentCondition.RUNTIME_READY, "False", blocks_runtime),
)
"""The conditions that can say a replica cannot start: the status that is against
it, and which of its reasons mean it will not start without a person."""


def cannot_start(obj: Mapping[str, Any]) -> str | None:
    """Why the ModelDeployment `obj` cannot start a replica for its current spec
    (`<reason>: <message>`), or None if it may yet."""
    conditions = _conditions(obj)
    for kind, against, blocks in CANNOT_START:
        found = conditions.get(kind)
        if (
            found is not None
            and found.get("status") == against
            and blocks(str(found.get("reason")))
        ):
            return _say(found)
    return None


def not_serving_reason(obj: Mapping[str, Any]) -> str:
    """What stands in the way of serving, for messages: the first condition against it
    (`<reason>: <message>`) that is not just progress, else the status's own reason,
    else ""."""
    status = obj.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    against = (
        (DeploymentCondition.ARTIFACT_READY, "False"),
        (DeploymentCondition.FIT_FAILED, "True"),
        (DeploymentCondition.RUNTIME_READY, "False"),
    )
    for kind, bad in against:
        c = conditions.get(kind)
        if c is not None and c.get("status") == bad and c.get("reason") not in IN_PROGRESS:
            return _say(c)
    return str(status.get("reason") or "")
