"""The planning step of a DeploymentWorkflow: read the artifact and the nodes through
an activity, decide the placement and the serving template (`kama.deployment_plan`,
pure), and say what the status should report about it (`kama.deployment_status`).

Kept apart from the workflow's loop so the loop only orchestrates: this step has no
state of its own and writes nothing; the workflow records its outcome and writes the
status."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import ValidationError
from temporalio import workflow

from workflows.kube_calls import call_kube

with workflow.unsafe.imports_passed_through():
    from activities.serving_pods import InputsRequest, ServingPodActivities
    from kama.api import ModelArtifactStatus
    from kama.api.deployment import DeploymentCondition, ModelDeploymentSpec
    from kama.conditions import ConditionUpdate
    from kama.contracts import EntitySnapshot
    from kama.deployment_plan import (
        ArtifactNotUsable,
        decide_deployment,
        degraded_condition,
        describe_profile,
    )
    from kama.deployment_status import (
        artifact_is_ready,
        artifact_served,
        artifact_unusable,
        artifact_waiting,
        fit_failed,
    )
    from kama.reasons import DeploymentReason
    from kama.serving_pod import ServingTemplate, serving_selector
    from kama.validation_problems import describe_problems


class PlanVerdict(StrEnum):
    WAITING = "waiting"  # the artifact is missing, failed, or not Ready yet
    UNUSABLE = "unusable"  # Ready, but nothing Kama can serve
    FIT_FAILED = "fit-failed"  # no candidate fits the nodes
    PLACED = "placed"


@dataclass(frozen=True)
class PlanOutcome:
    verdict: PlanVerdict
    conditions: list[ConditionUpdate]
    fields: dict[str, Any] = field(default_factory=dict)  # status fields, Python names
    template: ServingTemplate | None = None  # when PLACED


async def plan_deployment(
    *, snap: EntitySnapshot, spec: ModelDeploymentSpec, image: str
) -> PlanOutcome:
    """Plan `spec` for the artifact and nodes as they are now."""
    adapter_refs = [a.artifact_ref for a in spec.adapters]
    inputs = await call_kube(
        ServingPodActivities.read_inputs,
        InputsRequest(
            namespace=snap.ref.namespace,
            artifact=spec.model_ref.name,
            draft=spec.runtime.draft_model_ref,
            adapters=adapter_refs,
        ),
    )
    needed = {spec.model_ref.name: inputs.artifact_status}
    if spec.runtime.draft_model_ref is not None:
        needed[spec.runtime.draft_model_ref] = inputs.draft_status
    needed |= {ref: inputs.adapter_statuses.get(ref) for ref in adapter_refs}
    ready: dict[str, ModelArtifactStatus] = {}
    for name, raw in needed.items():  # the model first, then its draft and adapters
        try:
            found = None if raw is None else ModelArtifactStatus.model_validate(raw)
        except ValidationError as exc:  # forged or corrupt: bounds the importer never writes
            problems = describe_problems(exc, prefix="status.")
            why = f"ModelArtifact {name} has a status Kama cannot use: {problems}"
            return PlanOutcome(PlanVerdict.UNUSABLE, [artifact_unusable(why)])
        if found is None or not artifact_is_ready(found):
            waiting = artifact_waiting(name=name, artifact=found)
            return PlanOutcome(PlanVerdict.WAITING, [waiting])
        ready[name] = found
    artifact = ready[spec.model_ref.name]
    draft_ref = spec.runtime.draft_model_ref
    try:
        decision = decide_deployment(
            spec=spec,
            artifact=artifact,
            nodes=inputs.nodes,
            image=image,
            claim_nodes=inputs.claim_nodes,
            draft=None if draft_ref is None else ready[draft_ref],
            adapters={ref: ready[ref] for ref in adapter_refs},
        )
    except ArtifactNotUsable as exc:
        return PlanOutcome(PlanVerdict.UNUSABLE, [artifact_unusable(str(exc))])
    served = artifact_served(artifact.manifest_digest)
    selected, template = decision.plan.selected, decision.template
    if selected is None or template is None:
        message = decision.plan.fit_failed_message or "no candidate fits"
        return PlanOutcome(
            PlanVerdict.FIT_FAILED,
            [served, *fit_failed(message)],
            {"profile": None, "rejected_candidates": decision.rejected},
        )
    said = describe_profile(selected)
    return PlanOutcome(
        PlanVerdict.PLACED,
        [
            served,
            (DeploymentCondition.PLACED, True, selected.decision, said),
            (DeploymentCondition.FIT_FAILED, False, DeploymentReason.FITS, said),
            degraded_condition(profile=selected, asked=spec.placement.mode),
        ],
        {
            "profile": decision.profile,
            "rejected_candidates": decision.rejected,
            "artifact_digest": artifact.manifest_digest,
            "runtime_image": template.image,
            "fingerprint": template.fingerprint(),
            "selector": serving_selector(snap.ref.name),
        },
        template,
    )
