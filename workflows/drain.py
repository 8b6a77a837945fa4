"""DrainWorkflow (`drain/<ns>/<pod>`): take one serving pod out of service without
dropping a request. Mark it draining (routers stop choosing it), give routers a
moment to see that, wait until llama-server reports no busy slot and no gateway has a
request in flight there (each gateway that has one says so by the `gateway in flight`
signal when it sees the pod leave, and again at zero: a request on its way in or
queued behind llama-server's HTTP threads holds no slot yet) or the drain timeout
passes, then delete the pod (its supervisor drains once more on SIGTERM).

A drain may wait as long as its deployment's drainTimeout (up to a day), so its
history must not grow with the wait: llama-server is asked every second at first,
then less and less often (at most every `SLOTS_POLL_MAX`), and the run continues as
new, carrying what it knows, once its history is `HISTORY_LIMIT` events long."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from workflows.calls import CallPolicy
from workflows.entity import HISTORY_LIMIT
from workflows.kube_calls import call_kube
from workflows.polling import poll_interval
from workflows.status import TaskStatus

with workflow.unsafe.imports_passed_through():
    from activities.llama_server import LlamaServerActivities, SlotsRequest
    from activities.serving_pods import PodName, ServingPodActivities
    from kama.contracts import GATEWAY_IN_FLIGHT, DrainReport
    from kama.rollout import ObservedPod

ROUTERS_SETTLE = timedelta(seconds=1)
SLOTS_POLL = timedelta(seconds=1)
"""How often llama-server is asked about busy slots during the first `SLOTS_POLLS_AT_FIRST_PACE`."""
SLOTS_POLLS_AT_FIRST_PACE = 30
SLOTS_POLL_MAX = timedelta(seconds=30)
"""After those, the pause doubles up to this: a day-long drain asks about 3,000 times."""
SLOTS_TIMEOUT = timedelta(seconds=5)
SLOTS_RETRY = RetryPolicy(maximum_attempts=2)
SLOTS = CallPolicy(timeout=SLOTS_TIMEOUT, retry=SLOTS_RETRY)
"""Asking llama-server how busy it is: a pod that does not answer is gone or going."""


@dataclass(frozen=True)
class DrainInput:
    namespace: str
    pod: str
    timeout_s: float
    # carried over when the drain continues as new (a fresh drain leaves them unset)
    started_s: float | None = None  # epoch seconds at which the drain began
    pod_ip: str | None = None  # the pod was marked draining; its IP
    polls: int = 0
    gateways: dict[str, int] = field(default_factory=dict)


def slots_poll(polls: int) -> timedelta:
    """The pause after the `polls`-th question about busy slots."""
    return poll_interval(
        polls=polls,
        first=SLOTS_POLL,
        maximum=SLOTS_POLL_MAX,
        at_first_pace=SLOTS_POLLS_AT_FIRST_PACE,
    )


@dataclass(frozen=True)
class DrainResult:
    pod: str
    waited_s: float
    busy_at_deletion: int
    gateway_in_flight_at_deletion: int = 0


@workflow.defn(name="Drain serving pod")
class DrainWorkflow(TaskStatus):
    def __init__(self) -> None:
        super().__init__()
        self._gateways: dict[str, int] = {}  # gateway -> its requests in flight there

    @workflow.signal(name=GATEWAY_IN_FLIGHT)
    def gateway_in_flight(self, report: DrainReport) -> None:
        self._gateways[report.gateway] = report.in_flight

    def _gateway_in_flight(self) -> int:
        return sum(self._gateways.values())

    @workflow.run
    async def run(self, request: DrainInput) -> DrainResult:
        pod = PodName(namespace=request.namespace, name=request.pod)
        self._gateways = {**request.gateways, **self._gateways}
        if request.started_s is None:
            started = workflow.now()
            self._status.doing = "marking the pod draining"
            ip = await call_kube(ServingPodActivities.mark_draining, pod)
            if ip:
                await workflow.sleep(ROUTERS_SETTLE)
        else:  # continued as new: the pod is marked already
            started = datetime.fromtimestamp(request.started_s, tz=UTC)
            ip = request.pod_ip
        busy = 0
        polls = request.polls
        if ip:
            deadline = started + timedelta(seconds=request.timeout_s)
            while True:
                if workflow.info().get_current_history_length() > HISTORY_LIMIT:
                    workflow.continue_as_new(
                        replace(
                            request,
                            started_s=started.timestamp(),
                            pod_ip=ip,
                            polls=polls,
                            gateways=dict(self._gateways),
                        )
                    )
                self._status.doing = f"waiting for busy slots on {ip} to finish"
                found = await SLOTS.schedule(
                    LlamaServerActivities.busy_slots,
                    SlotsRequest(namespace=request.namespace, pod=request.pod),
                )
                busy = found or 0
                polls += 1
                if workflow.now() >= deadline:
                    break
                if busy == 0 and self._gateway_in_flight() == 0:
                    break
                if busy == 0:  # nothing to poll llama-server for until the gateways say so
                    self._status.doing = (
                        f"waiting for {self._gateway_in_flight()} gateway request(s) to {ip}"
                    )
                    with contextlib.suppress(TimeoutError):  # the deadline: checked above
                        await workflow.wait_condition(
                            lambda: self._gateway_in_flight() == 0,
                            timeout=max(deadline - workflow.now(), SLOTS_POLL),
                        )
                    continue
                await workflow.sleep(
                    min(slots_poll(polls), max(deadline - workflow.now(), SLOTS_POLL))
                )
        self._status.doing = "deleting the pod"
        await call_kube(ServingPodActivities.delete_pod, pod)
        self._status.doing = "done"
        return DrainResult(
            pod=request.pod,
            waited_s=(workflow.now() - started).total_seconds(),
            busy_at_deletion=busy,
            gateway_in_flight_at_deletion=self._gateway_in_flight(),
        )


async def replica_busy(*, namespace: str, pods: Sequence[ObservedPod]) -> bool:
    """Whether any of `pods` may be serving a request: a busy slot, or a ready replica
    that did not answer in time (a busy llama-server on a loaded node is not known to
    be idle). Readiness is not required: a replica too busy to answer its probe is
    exactly the one that must not be scaled away under its streams; a dead one turns
    unready and no longer holds the model up."""
    for pod in pods:
        if pod.pod_ip and not pod.deleting:
            busy = await SLOTS.schedule(
                LlamaServerActivities.busy_slots, SlotsRequest(namespace=namespace, pod=pod.name)
            )
            if busy or (busy is None and pod.ready):
                return True
    return False
