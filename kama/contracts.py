"""What Kama's processes share: object identity, the snapshot the watcher hands an
entity workflow, workflow IDs, search-attribute keys, the names and payloads of
signals and queries, and the shape of every workflow's `status` answer.

The watcher, the gateway, the worker's workflows and the importer all agree on these
values; keeping them in one pure module means a workflow ID or a signal payload is
defined once, and no process imports another one's I/O code to learn it. Signals are
sent by reference to the workflow's method (`handle.signal(DeploymentWorkflow.demand,
...)`); the names here are what those methods are registered under (and what
`temporal workflow signal --name` takes), and what `start_signal=` needs, since
signal-with-start takes a name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from temporalio.common import SearchAttributeKey

# plural resource names of Kama's CRDs (group kama.dev)
ARTIFACTS: Final = "modelartifacts"
CACHES: Final = "modelcaches"
DEPLOYMENTS: Final = "modeldeployments"

# search attributes on every entity and wake workflow (registered by the dev server and
# the chart: `temporal operator search-attribute create --name KamaKind --type Keyword`)
KAMA_KIND = SearchAttributeKey.for_keyword("KamaKind")
KAMA_NAMESPACE = SearchAttributeKey.for_keyword("KamaNamespace")
KAMA_NAME = SearchAttributeKey.for_keyword("KamaName")

# signal and query names (the workflows register their methods under these)
SPEC_CHANGED: Final = "spec changed"
RETRY: Final = "retry"
PODS_CHANGED: Final = "pods changed"
ARTIFACT_CHANGED: Final = "artifact changed"
WAKE: Final = "wake"
DEMAND: Final = "demand"
REPLICA_READY: Final = "replica ready"
STATUS_QUERY: Final = "status"


@dataclass(frozen=True)
class ObjectRef:
    """One Kubernetes object, by namespace, name and uid (a recreated object with the
    same name is another object, with its own workflow)."""

    namespace: str
    name: str
    uid: str


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


@dataclass(frozen=True)
class DemandReport:
    """A gateway saw requests for this model (rate-limited by the gateway): the
    payload of the deployment's `demand` signal."""

    gateway: str
    in_flight: int


def artifact_workflow_id(ref: ObjectRef) -> str:
    return f"artifact/{ref.namespace}/{ref.name}/{ref.uid}"


def cache_workflow_id(ref: ObjectRef) -> str:
    return f"cache/{ref.namespace}/{ref.name}/{ref.uid}"


def deployment_workflow_id(ref: ObjectRef) -> str:
    return f"deployment/{ref.namespace}/{ref.name}/{ref.uid}"


def wake_workflow_id(*, namespace: str, name: str) -> str:
    """One per model, whatever its uid: concurrent first requests share it."""
    return f"wake/{namespace}/{name}"


def drain_workflow_id(*, namespace: str, pod: str) -> str:
    return f"drain/{namespace}/{pod}"


def rollout_workflow_id(ref: ObjectRef, *, number: int) -> str:
    return f"rollout/{ref.namespace}/{ref.name}/{number}"


def import_workflow_id(ref: ObjectRef, *, operation: str) -> str:
    return f"import/{ref.namespace}/{ref.name}/{operation}"


def verify_workflow_id(ref: ObjectRef, *, operation: str) -> str:
    return f"verify/{ref.namespace}/{ref.name}/{operation}"
