"""Keeping a deployment's pods on its serving template: the rollout step of a
DeploymentWorkflow pass.

Unless the pods are settled (exactly the desired ready replicas of the template), a
RolloutWorkflow child converges them, cancelled as soon as a newer spec asks for
something else. A rollout that gives up (pods crash, the deadline passes) is tried
again after RETRY_FAILED_ROLLOUT, a pause that pod events and echoes do not cut
short; one the API server refused (a missing permission) is not tried again before
a spec change or a `retry` signal. What this remembers (`RolloutMemory`) travels in
the workflow's memory across continue-as-new."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from kama.contracts import EntitySnapshot
    from kama.rollout import ObservedPod, pods_settled
    from kama.serving_pod import ServingTemplate
    from workflows.rollout import RolloutInput, RolloutResult, list_pods, roll_out

RESYNC = timedelta(minutes=5)
"""How long a settled deployment rests before it looks again on its own."""
RETRY_FAILED_ROLLOUT = timedelta(seconds=30)


@dataclass
class RolloutMemory:
    rollouts: int = 0  # started so far: numbers the children's IDs
    next_ordinal: int = 0  # of the next pod name
    failure: str | None = None  # "Reason: message" of the last rollout that gave up
    # "<generation>/<fingerprint>" of a rollout the API server refused
    refused: str | None = None


@dataclass(frozen=True)
class RolloutOutcome:
    wait: timedelta | None  # when to look again (None: only when woken)
    doing: str
    pausing: bool  # a rollout gave up: pod events must not start the next pass


async def keep_rollout(
    memory: RolloutMemory,
    *,
    snap: EntitySnapshot,
    template: ServingTemplate,
    desired: int,
    deadline: timedelta,
    retry: bool,
    report: Callable[[list[ObservedPod]], Awaitable[None]],
    moved: Callable[[], bool],
    doing: Callable[[str], None],
) -> RolloutOutcome:
    """Converge the pods of `snap` onto `desired` replicas of `template`; `report` is
    given the pods as found (when a rollout starts, and at the end), `moved()` says
    whether a newer spec asks for something else, `doing` what the step is doing."""
    rollout = f"{snap.generation}/{template.fingerprint()}"
    result: RolloutResult | None = None
    if retry or memory.refused != rollout:
        result = await _converge(
            memory,
            snap=snap,
            template=template,
            desired=desired,
            deadline=deadline,
            report=report,
            moved=moved,
            doing=doing,
        )
        memory.refused = rollout if result is not None and result.permanent else None
    if memory.refused == rollout:
        return RolloutOutcome(
            None,
            "stopped (the API server refused the rollout): waiting for a spec change or `retry`",
            pausing=False,
        )
    if result is None or result.converged:
        return RolloutOutcome(RESYNC, "steady", pausing=False)
    return RolloutOutcome(RETRY_FAILED_ROLLOUT, "waiting to retry the rollout", pausing=True)


async def _converge(
    memory: RolloutMemory,
    *,
    snap: EntitySnapshot,
    template: ServingTemplate,
    desired: int,
    deadline: timedelta,
    report: Callable[[list[ObservedPod]], Awaitable[None]],
    moved: Callable[[], bool],
    doing: Callable[[str], None],
) -> RolloutResult | None:
    """Roll out unless the pods are settled; the rollout's result (None: nothing to
    do, or a newer spec cancelled it)."""
    pods = await list_pods(snap.ref)
    if pods_settled(pods=pods, fingerprint=template.fingerprint(), desired=desired):
        memory.failure = None
        await report(pods)
        return None
    doing(f"rolling out {template.fingerprint()} to {desired} replica(s)")
    memory.rollouts += 1
    found = pods
    result = await roll_out(
        RolloutInput(
            ref=snap.ref,
            template=template,
            desired=desired,
            next_ordinal=memory.next_ordinal,
            deadline_s=deadline.total_seconds(),
            observed=pods,
        ),
        number=memory.rollouts,
        started=lambda: report(found),
        moved=moved,
    )
    if result is not None:
        memory.next_ordinal = max(memory.next_ordinal, result.next_ordinal)
        memory.failure = None if result.converged else f"{result.reason}: {result.message}"
    await report(await list_pods(snap.ref))
    return result
