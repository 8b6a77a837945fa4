"""Who sets a ModelDeployment's `spec.replicas` from demand: Kama's built-in rule, or
KEDA through the ScaledObject Kama writes (`spec.scaling.autoscaler: KEDA`).

The DeploymentWorkflow calls `keep_handoff` on every pass: in KEDA mode it applies the
ScaledObject when what it is made of changes (the scaling settings and the slots per
replica, not the replica count KEDA itself writes) and again on a `retry`; KEDA owns
the replica count from the moment the API server accepted it; back in Kama mode it
deletes the ScaledObject it wrote. Where KEDA cannot be used (`KedaUnavailable`), the
handoff does not happen and the answer says why, once per such change: the workflow
keeps scaling the model itself rather than leave it with no autoscaler at all."""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.kube_calls import call_kube, permanent_failure

with workflow.unsafe.imports_passed_through():
    from activities.keda import KedaActivities, ScaledObjectRequest
    from kama.api.deployment import Autoscaler, ModelDeploymentSpec
    from kama.contracts import EntitySnapshot


@dataclass
class KedaHandoff:
    """What the workflow remembers of the handoff (across continue-as-new)."""

    applied: str | None = None  # what the ScaledObject was last made of (applied or refused)
    in_effect: bool = False  # a ScaledObject Kama wrote exists: KEDA owns spec.replicas


@dataclass(frozen=True)
class HandoffNews:
    """An Event worth recording about the handoff."""

    type: str  # Normal | Warning
    reason: str
    message: str


async def keep_handoff(
    handoff: KedaHandoff, *, snap: EntitySnapshot, spec: ModelDeploymentSpec, retry: bool
) -> HandoffNews | None:
    """Bring the ScaledObject in line with the spec; what changed, if anything worth
    an Event. `handoff.in_effect` afterwards says whether KEDA owns the replicas."""
    if spec.scaling.autoscaler == Autoscaler.KEDA:
        made_of = f"{spec.scaling.model_dump_json()}/{spec.runtime.concurrency}"
        if handoff.applied == made_of and not retry:
            return None
        handoff.applied = made_of
        was = handoff.in_effect
        try:
            await call_kube(
                KedaActivities.apply_scaled_object,
                ScaledObjectRequest(ref=snap.ref, spec=snap.spec),
            )
        except ActivityError as error:
            refused = permanent_failure(error)
            if refused is None:
                raise
            handoff.in_effect = False
            return HandoffNews(
                "Warning",
                "KEDAUnavailable",
                f"{refused.message}; Kama keeps scaling this deployment itself",
            )
        handoff.in_effect = True
        if was:
            return None
        return HandoffNews(
            "Normal",
            "ScalingByKEDA",
            f"ScaledObject {snap.ref.name} written: KEDA sets spec.replicas from demand",
        )
    handoff.applied = None
    if not handoff.in_effect:
        return None
    await call_kube(KedaActivities.delete_scaled_object, snap.ref)
    handoff.in_effect = False
    return HandoffNews(
        "Normal",
        "ScalingByKama",
        f"ScaledObject {snap.ref.name} deleted: Kama sets spec.replicas from demand",
    )
