"""A workflow that makes one call with Kama's Kubernetes call policy, for checking
which failures that policy retries; in its own module so the workflow sandbox
imports nothing but what the policy needs."""

from __future__ import annotations

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from workflows.kube_calls import call_kube


class ProbeActivities:
    def __init__(self, *, fail_with: BaseException) -> None:
        self.fail_with = fail_with
        self.attempts = 0

    @activity.defn(name="Probe Kubernetes call")
    async def probe(self, name: str) -> str:
        self.attempts += 1
        raise self.fail_with


@workflow.defn(name="Probe Kubernetes call policy")
class ProbeWorkflow:
    @workflow.run
    async def run(self, name: str) -> str:
        return await call_kube(ProbeActivities.probe, name)
