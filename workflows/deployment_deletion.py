"""A ModelDeployment's deletion: drain every serving pod (no request or stream is
cut), then release the finalizer. The artifact is left alone.

Drains end in seconds, but a pod stuck terminating can take hours: the pods are
listed every DELETE_POLL for the first DELETE_POLLS_AT_FIRST_PACE rounds, then less
often up to DELETE_POLL_MAX, and the run continues as new once its history is long
(`carry_over`, which finalizes again, at once)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow

from workflows.entity import HISTORY_LIMIT
from workflows.kube_calls import call_kube
from workflows.polling import poll_interval

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities.kube import FinalizerRequest, KubeActivities
    from kama.api.deployment import ModelDeploymentSpec, Scaling
    from kama.contracts import DEPLOYMENTS, EntitySnapshot
    from kama.durations import parse_duration
    from workflows.rollout import list_pods, start_drain

DELETE_POLL = timedelta(seconds=2)
DELETE_POLL_MAX = timedelta(seconds=60)
DELETE_POLLS_AT_FIRST_PACE = 30


async def delete_deployment(
    snap: EntitySnapshot, *, doing: Callable[[str], None], carry_over: Callable[[], object]
) -> None:
    """Drain every pod of the deployment `snap`, then release its finalizer; `doing`
    is told what the deletion waits for."""
    try:
        drain_timeout = ModelDeploymentSpec.model_validate(snap.spec).scaling.drain_timeout
    except ValidationError:  # a spec that no longer validates must not hold the deletion
        drain_timeout = Scaling().drain_timeout
    timeout_s = parse_duration(drain_timeout).total_seconds()
    polls = 0
    while pods := await list_pods(snap.ref):
        doing(f"deleting: draining {len(pods)} pod(s)")
        for pod in (p for p in pods if not p.deleting):
            await start_drain(
                cluster=snap.ref.cluster,
                namespace=snap.ref.namespace,
                pod=pod.name,
                timeout_s=timeout_s,
            )
        polls += 1
        await workflow.sleep(
            poll_interval(
                polls=polls,
                first=DELETE_POLL,
                maximum=DELETE_POLL_MAX,
                at_first_pace=DELETE_POLLS_AT_FIRST_PACE,
            )
        )
        if workflow.info().get_current_history_length() > HISTORY_LIMIT:
            workflow.continue_as_new(carry_over())
    await call_kube(
        KubeActivities.release_finalizer, FinalizerRequest(plural=DEPLOYMENTS, ref=snap.ref)
    )
    doing("deleted (the artifact is kept)")
