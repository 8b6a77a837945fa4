"""What Kama's processes share: object identity, the snapshot the watcher hands an
entity workflow, workflow IDs, search-attribute keys, the names and payloads of
signals and queries, the type names of the workflows one process starts and another
runs, the input of the wake, and the shape of every workflow's `status` answer.

The watcher, the gateway, the worker's workflows and the importer all agree on these
values; keeping them in one pure module means a workflow ID or a signal payload is
defined once, and no process imports another one's I/O code to learn it. The names
here are what the workflows register their methods and types under (and what
`temporal workflow signal --name` takes); a process that does not import the
workflows (the gateway) signals, queries and starts them by these names."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Final

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

# plural resource names of Kama's CRDs (group kama.dev)
ARTIFACTS: Final = "modelartifacts"
CACHES: Final = "modelcaches"
DEPLOYMENTS: Final = "modeldeployments"

# search attributes on every entity and wake workflow (registered by the dev server and
# the chart: `temporal operator search-attribute create --name KamaKind --type Keyword`)
KAMA_KIND = SearchAttributeKey.for_keyword("KamaKind")
KAMA_NAMESPACE = SearchAttributeKey.for_keyword("KamaNamespace")
KAMA_NAME = SearchAttributeKey.for_keyword("KamaName")


def entity_search_attributes(*, kind: str, namespace: str, name: str) -> TypedSearchAttributes:
    """The search attributes of a workflow about one Kama object (its entity workflow,
    or its wake): `temporal workflow list --query 'KamaName="chat"'` finds them all."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(KAMA_KIND, kind),
            SearchAttributePair(KAMA_NAMESPACE, namespace),
            SearchAttributePair(KAMA_NAME, name),
        ]
    )


# workflow type names (`@workflow.defn(name=...)`) of the workflows started by name
WAKE_WORKFLOW: Final = "Wake model deployment"

# signal and query names (the workflows register their methods under these)
SPEC_CHANGED: Final = "spec changed"
RETRY: Final = "retry"
PODS_CHANGED: Final = "pods changed"
ARTIFACT_CHANGED: Final = "artifact changed"
WAKE: Final = "wake"
DEMAND: Final = "demand"
REPLICA_READY: Final = "replica ready"
GATEWAY_IN_FLIGHT: Final = "gateway in flight"  # to a drain workflow
VERIFY: Final = "verify"  # re-hash a Ready artifact now (`temporal workflow signal --name verify`)
CAPACITY_REPORT: Final = "capacity report"  # an import tells its cache how much room it found
STATUS_QUERY: Final = "status"


@dataclass(frozen=True)
class ObjectRef:
    """One Kubernetes object, by namespace, name and uid (a recreated object with the
    same name is another object, with its own workflow), and the Kama cluster it lives
    in (`KAMA_CLUSTER`): "" where the Temporal namespace serves one cluster, and in
    every ref recorded before clusters had names, so old histories replay unchanged.
    Every workflow ID built from a ref carries its cluster."""

    namespace: str
    name: str
    uid: str
    cluster: str = ""


@dataclass(frozen=True)
class EntitySnapshot:
    """What the watcher saw of a Kama resource: identity, generation, spec, and
    whether it is being deleted. The payload of `spec changed` for every entity."""

    ref: ObjectRef
    generation: int
    spec: dict[str, Any]
    deleting: bool = False

    def supersedes(self, current: EntitySnapshot | None) -> bool:
        """Whether a workflow holding `current` should take this snapshot (watch events
        can arrive out of order; a deletion always wins)."""
        return current is None or self.generation >= current.generation or self.deleting


@dataclass(frozen=True)
class LiveObject:
    """A Kama resource as the API server has it now (what `Read Kama object` answers):
    an entity workflow takes its spec from here, never from a signal's snapshot alone.
    `gone`: no object with the snapshot's name has its uid any more."""

    generation: int = 0
    spec: dict[str, Any] = field(default_factory=dict)
    deleting: bool = False
    gone: bool = False

    def confirm(self, snapshot: EntitySnapshot) -> EntitySnapshot:
        """`snapshot` with what the API server says in place of what it claimed."""
        if self.gone:
            return replace(snapshot, deleting=True)
        return replace(snapshot, generation=self.generation, spec=self.spec, deleting=self.deleting)


@dataclass
class WorkflowStatus:
    """What every Kama workflow answers to its `status` query (`temporal workflow query
    --type status`): what it is doing now, which generation of its object it works on
    (None for workflows that serve no one object), and the last error it met. Each
    workflow extends it with the few facts of its own (fields with defaults, so the
    answer stays one flat JSON object)."""

    doing: str = "starting"
    generation: int | None = None
    last_error: str | None = None


@dataclass
class DeploymentWorkflowStatus(WorkflowStatus):
    """The `status` answer of a DeploymentWorkflow (the gateway reads its `demand`)."""

    fingerprint: str | None = None
    profile: dict[str, Any] | None = None
    replicas: int = 0
    ready_replicas: int = 0
    last_demand: str | None = None
    demand: int = 0  # requests in flight or queued, over every gateway
    autoscaler: str = "Kama"  # who sets spec.replicas from demand now: Kama or KEDA


@dataclass(frozen=True)
class WakeInput:
    """The input of a WakeWorkflow, which the gateway starts by name: the deployment to
    bring back to one ready replica, and how long to wait for it."""

    ref: ObjectRef  # the ModelDeployment
    timeout_s: float


@dataclass(frozen=True)
class DemandReport:
    """One gateway's demand for a model: the payload of the deployment's `demand`
    signal, sent when it changes and repeated while it is not zero
    (`kama.autoscaling.report_period`). Reports from gateways before autoscaling carry
    `in_flight` alone."""

    gateway: str
    in_flight: int
    queued: int = 0  # held for a replica (at zero) or for a free slot
    pods: dict[str, int] = field(default_factory=dict)  # in flight per serving pod
    # a rise: seconds from the arrival that raised the demand to this report's sending
    # (the burst's coalescing, the report's own way), so the workflow dates the rise
    # from the arrival and the scale-up window starts when the load did; 0 otherwise
    risen_for_s: float = 0.0

    @property
    def demand(self) -> int:
        return self.in_flight + self.queued


@dataclass(frozen=True)
class DrainReport:
    """A gateway's requests still in flight to a draining pod: the payload of the
    drain workflow's `gateway in flight` signal, sent when the gateway sees the pod's
    draining label and again when its last request there ends."""

    gateway: str
    in_flight: int


@dataclass(frozen=True)
class CapacityReport:
    """What an import found on its cache volume: the payload of the cache's `capacity
    report` signal. `free_bytes` is the room before the import (its own staged bytes
    counted as free); `needed_bytes` what it had to store."""

    artifact: str  # the ModelArtifact's name (same namespace as the cache)
    needed_bytes: int
    free_bytes: int

    @property
    def short(self) -> bool:
        return self.needed_bytes > self.free_bytes


# Workflow IDs and task queues. A named cluster prefixes them (`prod-eu:artifact/...`,
# `prod-eu:kama-control`): ':' appears in no Kubernetes name, so two clusters sharing
# one Temporal namespace can never build each other's IDs or poll each other's queues.
# The unnamed cluster ("") keeps the IDs Kama always had.


def scoped(*, cluster: str, name: str) -> str:
    """A workflow ID or task queue of one cluster."""
    return f"{cluster}:{name}" if cluster else name


def control_task_queue(*, cluster: str, queue: str) -> str:
    """The task queue of a cluster's workflows and control activities."""
    return scoped(cluster=cluster, name=queue)


def artifact_workflow_id(ref: ObjectRef) -> str:
    return scoped(cluster=ref.cluster, name=f"artifact/{ref.namespace}/{ref.name}/{ref.uid}")


def cache_workflow_id(ref: ObjectRef) -> str:
    return scoped(cluster=ref.cluster, name=f"cache/{ref.namespace}/{ref.name}/{ref.uid}")


def deployment_workflow_id(ref: ObjectRef) -> str:
    return scoped(cluster=ref.cluster, name=f"deployment/{ref.namespace}/{ref.name}/{ref.uid}")


def wake_workflow_id(*, cluster: str, namespace: str, name: str) -> str:
    """One per model, whatever its uid: concurrent first requests share it."""
    return scoped(cluster=cluster, name=f"wake/{namespace}/{name}")


def drain_workflow_id(*, cluster: str, namespace: str, pod: str) -> str:
    return scoped(cluster=cluster, name=f"drain/{namespace}/{pod}")


def rollout_workflow_id(ref: ObjectRef, *, number: int) -> str:
    return scoped(cluster=ref.cluster, name=f"rollout/{ref.namespace}/{ref.name}/{number}")


def import_workflow_id(ref: ObjectRef, *, operation: str) -> str:
    return scoped(cluster=ref.cluster, name=f"import/{ref.namespace}/{ref.name}/{operation}")


def verify_workflow_id(ref: ObjectRef, *, operation: str) -> str:
    return scoped(cluster=ref.cluster, name=f"verify/{ref.namespace}/{ref.name}/{operation}")


def importer_task_queue(ref: ObjectRef, *, operation: str) -> str:
    """The task queue of one importer pod's relay (one per import or verify
    operation): the artifact's namespace and whole uid in it, so no two artifacts'
    operations can share one, in any namespace."""
    return scoped(cluster=ref.cluster, name=f"kama-importer-{ref.namespace}-{ref.uid}-{operation}")
