"""Stand-ins for what Kama's workflows talk to: Kubernetes (with a kubelet that makes
pods ready or crash, and a watcher that signals `pods changed` on every pod event and
echoes `/scale` writes back as `spec changed`), llama-server's `/slots`, and the
importer pod's activities on its own task queue.

Each stand-in is an activity registered under the real activity name and takes and
returns the real dataclasses, so the workflows run unchanged on a worker (as in
temporalio/samples-python `tests/hello/hello_activity_test.py`); the workflows'
behaviour is then read from what they asked the cluster to do: status written,
Events, replicas set, pods created and deleted, finalizers released.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.claims import CacheClaim, CacheRequest
from activities.import_payloads import (
    CopyRequest,
    DiscardRequest,
    DownloadedFile,
    DownloadRequest,
    HubSource,
    InPlaceArtifact,
    InPlaceRequest,
    LookupRequest,
    PublishedArtifact,
    PublishRequest,
    PvcSource,
    ResolvedFile,
    ResolvedSource,
    SpaceRequest,
    VerifyPublishedRequest,
)
from activities.importer_pods import ImporterPod, PodRef
from activities.kama_objects import EventRequest, FinalizerRequest, ObjectRead, StatusPatch
from activities.keda import KedaUnavailable, ScaledObjectRequest
from activities.llama_server import SlotsRequest
from activities.progress import ImportProgress, ProgressRequest
from activities.serving_pods import (
    CreatePod,
    DeploymentInputs,
    InputsRequest,
    PodName,
    PodsRequest,
    ScaleRequest,
)
from kama.api.deployment import ModelDeploymentSpec
from kama.contracts import (
    PODS_CHANGED,
    SPEC_CHANGED,
    EntitySnapshot,
    LiveObject,
    ObjectRef,
    importer_task_queue,
)
from kama.rollout import ObservedPod
from kama.scaled_object import scaled_object
from kama.serving_pod import (
    DEPLOYMENT_LABEL,
    FINGERPRINT_LABEL,
    ORDINAL_ANNOTATION,
)

NAMESPACE = "models"

# GGUF facts of a 2-layer llama model as the importer reports them (the output of
# gguf_info(inspect_file(write_model(shape=ModelShape(n_layer=2,
# n_head_kv=2, n_ctx=2048, seed=7))))): small enough to fit any node.
TINY_GGUF: dict[str, Any] = {
    "architecture": "llama",
    "fileType": "F32",
    "parameterCount": 120000,
    "layers": 2,
    "contextLength": 2048,
    "embeddingLength": 64,
    "headCount": 4,
    "headCountKV": 2,
    "headDimK": 16,
    "headDimV": 16,
    "feedForwardLength": 128,
    "vocabSize": 359,
    "weights": {
        "layers": [147968, 147968],
        "output": 92160,
        "outputTied": False,
        "tokenEmbedding": 91904,
        "other": 0,
    },
}
MODEL_FILE = "tiny.gguf"
MODEL_SIZE = 490080
MODEL_SHA256 = "ef" * 32
MANIFEST_DIGEST = "cd" * 32
ARTIFACT_DIGEST = "ab" * 32
COMMIT = "0123456789abcdef0123456789abcdef01234567"

# one CPU node with room for the tiny model (the shape `Read artifact and nodes` returns)
NODES: list[dict[str, Any]] = [
    {
        "metadata": {"name": "node-a", "labels": {"kubernetes.io/hostname": "node-a"}},
        "spec": {},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}},
    }
]


def ready_artifact_status() -> dict[str, Any]:
    """`.status` of a ModelArtifact the ArtifactWorkflow has published."""
    return {
        "phase": "Ready",
        "observedGeneration": 1,
        "manifestDigest": f"sha256:{MANIFEST_DIGEST}",
        "artifactDigest": f"sha256:{ARTIFACT_DIGEST}",
        "files": [{"path": MODEL_FILE, "size": MODEL_SIZE, "sha256": MODEL_SHA256}],
        "totalSize": MODEL_SIZE,
        "gguf": TINY_GGUF,
        "servingLocation": {
            "claimName": "kama-cache-models",
            "subPath": f"blobs/sha256/{MANIFEST_DIGEST}",
            "accessModes": ["ReadWriteOnce"],
        },
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Published",
                "message": f"published as sha256:{MANIFEST_DIGEST}",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": 1,
            }
        ],
    }


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch, as the API server applies a status write."""
    merged = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_patch(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The condition `kind` of a written status, as `kubectl get -o json` shows it."""
    return next((c for c in status.get("conditions", []) if c["type"] == kind), None)


@dataclass(frozen=True)
class Call:
    """One activity call: its name, its argument and when (workflow time) the
    workflow scheduled it."""

    name: str
    argument: Any
    at: datetime


@dataclass
class FakePod:
    """A serving pod as the kubelet runs it."""

    name: str
    deployment: str
    fingerprint: str
    ordinal: int
    pod_ip: str
    phase: str = "Pending"
    ready: bool = False
    draining: bool = False
    exit_reason: str | None = None

    def observed(self) -> ObservedPod:
        return ObservedPod(
            name=self.name,
            fingerprint=self.fingerprint,
            ordinal=self.ordinal,
            phase=self.phase,
            ready=self.ready,
            draining=self.draining,
            pod_ip=self.pod_ip,
            node="node-a",
            exit_reason=self.exit_reason,
        )


# what the kubelet makes of a new serving pod by the next time the pods are listed
STARTS_READY = "ready"  # llama-server loads the model and passes its readiness probe
CRASHES = "crash"  # the runtime exits (restartPolicy Never: the pod fails)
STAYS_PENDING = "pending"  # never scheduled / never ready


@dataclass
class FakeCluster:
    """Kubernetes, the kubelet, the watcher and llama-server, as Kama's control-queue
    activities see them. Every call is recorded in `calls`."""

    client: Client
    pod_fate: str = STARTS_READY
    artifact_status: dict[str, Any] | None = field(default_factory=ready_artifact_status)
    nodes: list[dict[str, Any]] = field(default_factory=lambda: list(NODES))
    # the `spec.nodeAffinity` of the volumes bound to the claims (a local volume's node)
    claim_node_affinity: dict[str, Any] | None = None
    source_access_modes: list[str] = field(default_factory=lambda: ["ReadOnlyMany"])
    busy_slots: deque[int] = field(default_factory=deque)  # answers of /slots, then 0
    artifact_users: deque[list[str]] = field(default_factory=deque)  # answers, then []
    cache_users: deque[list[str]] = field(default_factory=deque)  # answers, then []
    importer: FakeImporter | None = None
    cache_uid: str = ""  # the ModelCache's uid `Find cache claim` reports, when set
    claim_failures: deque[ApplicationError] = field(default_factory=deque)  # next finds
    claim_expansion: dict[str, str] = field(
        default_factory=lambda: {"state": "Sized", "message": "claim has 10Gi"}
    )  # what `Expand cache claim` answers (a ClaimExpansion as JSON)
    keda_installed: bool = True  # whether ScaledObjects can be written
    scaled_objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # by name
    calls: list[Call] = field(default_factory=list)
    statuses: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, FakePod] = field(default_factory=dict)
    specs: dict[str, EntitySnapshot] = field(default_factory=dict)  # the watcher's view
    importer_workers: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    # what a test reads ---------------------------------------------------------

    def called(self, name: str) -> list[Any]:
        """Arguments of every call of activity `name`, in order."""
        return [call.argument for call in self.calls if call.name == name]

    def status(self, plural: str, name: str) -> dict[str, Any]:
        return self.statuses.get((plural, name), {})

    def events(self, name: str) -> list[EventRequest]:
        return [e for e in self.called("Record event") if e.ref.name == name]

    def watch(self, workflow_id: str, snapshot: EntitySnapshot) -> None:
        """The resource of the entity workflow `workflow_id` as the API server has it
        (what `Read Kama object` answers, and what the watcher last sent); a `/scale`
        write by that workflow comes back to it as `spec changed`, as it would
        through the watch."""
        self.specs[workflow_id] = snapshot

    async def change(self, workflow_id: str, snapshot: EntitySnapshot) -> None:
        """A user changed (or deleted) the resource: the API server has `snapshot`,
        and the watcher signals it."""
        self.watch(workflow_id, snapshot)
        await self.client.get_workflow_handle(workflow_id).signal(SPEC_CHANGED, snapshot)

    def activities(self) -> list[Callable[..., Any]]:
        return [
            self.patch_status,
            self.read_object,
            self.record_event,
            self.cache_claim,
            self.expand_cache_claim,
            self.source_claim,
            self.ensure_importer_pod,
            self.delete_importer_pod,
            self.list_artifact_users,
            self.list_cache_users,
            self.delete_cache_claim,
            self.release_finalizer,
            self.import_progress,
            self.read_inputs,
            self.list_pods,
            self.create_pod,
            self.mark_draining,
            self.delete_pod,
            self.set_replicas,
            self.apply_scaled_object,
            self.delete_scaled_object,
            self.count_busy_slots,
        ]

    async def stop(self) -> None:
        """Stop the importer pods' workers."""
        for task in self.importer_workers.values():
            task.cancel()
        for task in self.importer_workers.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.importer_workers.clear()

    def _record(self, name: str, argument: Any) -> None:
        self.calls.append(Call(name, argument, activity.info().current_attempt_scheduled_time))

    # Kubernetes: status, Events, finalizers, claims, importer pods -----------------

    @activity.defn(name="Write status")
    async def patch_status(self, patch: StatusPatch) -> None:
        self._record("Write status", patch)
        key = (patch.kind_plural, patch.ref.name)
        self.statuses[key] = merge_patch(self.statuses.get(key, {}), patch.status)

    @activity.defn(name="Read Kama object")
    async def read_object(self, request: ObjectRead) -> LiveObject:
        self._record("Read Kama object", request)
        workflow_id = activity.info().workflow_id or ""
        if workflow_id not in self.specs:
            raise ApplicationError(
                f"the test never put the resource of {workflow_id!r} in the fake cluster "
                "(FakeCluster.watch)",
                non_retryable=True,
            )
        seen = self.specs[workflow_id]
        if seen.ref.uid != request.ref.uid:
            return LiveObject(gone=True)
        return LiveObject(generation=seen.generation, spec=seen.spec, deleting=seen.deleting)

    @activity.defn(name="Record event")
    async def record_event(self, request: EventRequest) -> None:
        self._record("Record event", request)

    @activity.defn(name="Find cache claim")
    async def cache_claim(self, request: CacheRequest) -> CacheClaim:
        self._record("Find cache claim", request)
        if self.claim_failures:
            raise self.claim_failures.popleft()
        return CacheClaim(
            claim_name=f"kama-cache-{request.name}",
            access_modes=["ReadWriteOnce"],
            capacity="10Gi",
            created_by_kama=True,
            node_affinity=self.claim_node_affinity,
            owner_uid=self.cache_uid,
        )

    @activity.defn(name="Expand cache claim")
    async def expand_cache_claim(self, request: CacheRequest) -> dict[str, str]:
        self._record("Expand cache claim", request)
        return dict(self.claim_expansion)

    @activity.defn(name="Find source claim")
    async def source_claim(self, request: CacheRequest) -> CacheClaim:
        self._record("Find source claim", request)
        return CacheClaim(
            claim_name=request.name,
            access_modes=list(self.source_access_modes),
            capacity="5Gi",
            node_affinity=self.claim_node_affinity,
        )

    @activity.defn(name="Start importer pod")
    async def ensure_importer_pod(self, request: ImporterPod) -> PodRef:
        """The importer pod's process is a worker on the operation's task queue."""
        self._record("Start importer pod", request)
        assert self.importer is not None, "this test has no importer"
        task_queue = importer_task_queue(request.ref, operation=request.operation_id)
        if task_queue not in self.importer_workers:
            worker = Worker(
                self.client,
                task_queue=task_queue,
                activities=self.importer.activities(),
            )
            self.importer_workers[task_queue] = asyncio.create_task(worker.run())
        return PodRef(
            namespace=request.ref.namespace,
            name=f"{request.ref.name}-import-{request.operation_id[-12:]}".lower(),
        )

    @activity.defn(name="Delete pod")
    async def delete_importer_pod(self, pod: PodRef) -> None:
        self._record("Delete pod", pod)

    @activity.defn(name="List deployments using artifact")
    async def list_artifact_users(self, ref: ObjectRef) -> list[str]:
        self._record("List deployments using artifact", ref)
        return self.artifact_users.popleft() if self.artifact_users else []

    @activity.defn(name="List artifacts using cache")
    async def list_cache_users(self, ref: ObjectRef) -> list[str]:
        self._record("List artifacts using cache", ref)
        return self.cache_users.popleft() if self.cache_users else []

    @activity.defn(name="Delete cache claim")
    async def delete_cache_claim(self, request: CacheRequest) -> bool:
        self._record("Delete cache claim", request)
        return True

    @activity.defn(name="Release finalizer")
    async def release_finalizer(self, request: FinalizerRequest) -> None:
        self._record("Release finalizer", request)

    @activity.defn(name="Read import progress")
    async def import_progress(self, request: ProgressRequest) -> ImportProgress:
        self._record("Read import progress", request)
        return ImportProgress(bytes_done=MODEL_SIZE // 2, bytes_total=MODEL_SIZE, running=True)

    # Kubernetes: the serving plane ----------------------------------------------------

    @activity.defn(name="Read artifact and nodes")
    async def read_inputs(self, request: InputsRequest) -> DeploymentInputs:
        self._record("Read artifact and nodes", request)
        return DeploymentInputs(artifact_status=self.artifact_status, nodes=self.nodes)

    @activity.defn(name="List serving pods")
    async def list_pods(self, request: PodsRequest) -> list[ObservedPod]:
        """The kubelet has started every pod by the time the pods are listed again."""
        self._record("List serving pods", request)
        observed = [self.pods[name].observed() for name in sorted(self.pods)]
        for pod in list(self.pods.values()):
            if pod.phase != "Pending" or self.pod_fate == STAYS_PENDING:
                continue
            if self.pod_fate == CRASHES:
                pod.phase, pod.exit_reason = "Failed", "runtime exited 1 (Error)"
            else:
                pod.phase, pod.ready = "Running", True
            await self._pod_event(pod, namespace=request.namespace)
        return observed

    @activity.defn(name="Create serving pod")
    async def create_pod(self, request: CreatePod) -> None:
        self._record("Create serving pod", request)
        meta = request.manifest()["metadata"]
        if meta["name"] in self.pods:
            return  # 409: already created
        pod = self.pods[meta["name"]] = FakePod(
            name=meta["name"],
            deployment=meta["labels"][DEPLOYMENT_LABEL],
            fingerprint=meta["labels"][FINGERPRINT_LABEL],
            ordinal=int(meta["annotations"][ORDINAL_ANNOTATION]),
            pod_ip=f"10.0.0.{len(self.called('Create serving pod'))}",
        )
        await self._pod_event(pod, namespace=meta["namespace"])

    @activity.defn(name="Mark pod draining")
    async def mark_draining(self, pod: PodName) -> str | None:
        self._record("Mark pod draining", pod)
        found = self.pods.get(pod.name)
        if found is None:
            return None
        found.draining = True
        await self._pod_event(found, namespace=pod.namespace)
        return found.pod_ip

    @activity.defn(name="Delete serving pod")
    async def delete_pod(self, pod: PodName) -> None:
        """The pod goes at once (its grace period is not modelled)."""
        self._record("Delete serving pod", pod)
        gone = self.pods.pop(pod.name, None)
        if gone is not None:  # else 404: already gone
            await self._pod_event(gone, namespace=pod.namespace)

    async def _pod_event(self, pod: FakePod, *, namespace: str) -> None:
        """What the watcher does on every event of a serving pod (added, changed,
        deleted): signal `pods changed` to its deployment's workflow."""
        for workflow_id, seen in self.specs.items():
            if seen.ref.name == pod.deployment and seen.ref.namespace == namespace:
                with contextlib.suppress(RPCError):  # no such workflow (any more)
                    await self.client.get_workflow_handle(workflow_id).signal(PODS_CHANGED)

    @activity.defn(name="Set deployment replicas")
    async def set_replicas(self, request: ScaleRequest) -> None:
        self._record("Set deployment replicas", request)
        workflow_id = activity.info().workflow_id
        seen = self.specs.get(workflow_id or "")
        if workflow_id is None or seen is None or seen.spec.get("replicas") == request.replicas:
            return
        changed = replace(
            seen,
            generation=seen.generation + 1,
            spec={**seen.spec, "replicas": request.replicas},
        )
        self.specs[workflow_id] = changed
        with contextlib.suppress(RPCError):  # the workflow may have ended
            await self.client.get_workflow_handle(workflow_id).signal(SPEC_CHANGED, changed)

    # KEDA ---------------------------------------------------------------------------

    @activity.defn(name="Apply KEDA ScaledObject")
    async def apply_scaled_object(self, request: ScaledObjectRequest) -> None:
        self._record("Apply KEDA ScaledObject", request)
        if not self.keda_installed:
            raise KedaUnavailable("the API server does not serve scaledobjects.keda.sh")
        spec = ModelDeploymentSpec.model_validate(request.spec)
        self.scaled_objects[request.ref.name] = scaled_object(
            ref=request.ref, spec=spec, scaler_address="kama-gateway:9091"
        )

    @activity.defn(name="Delete KEDA ScaledObject")
    async def delete_scaled_object(self, ref: ObjectRef) -> None:
        self._record("Delete KEDA ScaledObject", ref)
        self.scaled_objects.pop(ref.name, None)

    # llama-server ---------------------------------------------------------------------

    @activity.defn(name="Count busy slots")
    async def count_busy_slots(self, request: SlotsRequest) -> int | None:
        self._record("Count busy slots", request)
        return self.busy_slots.popleft() if self.busy_slots else 0


@dataclass
class FakeImporter:
    """The importer pod's activities: a Hugging Face repo with one tiny GGUF file, a
    cache with room, and a claim holding the same file. `resolve_failures` are raised
    by the next resolutions, as the real activity raises them."""

    resolve_failures: deque[ApplicationError] = field(default_factory=deque)
    files: list[ResolvedFile] = field(
        default_factory=lambda: [
            ResolvedFile(path=MODEL_FILE, size=MODEL_SIZE, sha256=MODEL_SHA256)
        ]
    )  # what the source resolves to
    free_bytes: int = 10 << 30  # free space of the cache volume
    download_failures: deque[ApplicationError] = field(default_factory=deque)  # next downloads
    verify_failures: deque[ApplicationError] = field(default_factory=deque)  # next re-hashes
    calls: list[Call] = field(default_factory=list)

    def _record(self, name: str, argument: Any) -> None:
        self.calls.append(Call(name, argument, activity.info().current_attempt_scheduled_time))

    def called(self, name: str) -> list[Any]:
        return [call.argument for call in self.calls if call.name == name]

    def activities(self) -> list[Callable[..., Any]]:
        return [
            self.resolve_source,
            self.download_file,
            self.ensure_space,
            self.prepare_staging,
            self.lookup,
            self.publish,
            self.discard_staging,
            self.verify_published,
            self.resolve_volume,
            self.copy_file,
            self.verify_in_place,
        ]

    def _resolved(self, name: str, argument: Any) -> ResolvedSource:
        self._record(name, argument)
        if self.resolve_failures:
            raise self.resolve_failures.popleft()
        return ResolvedSource(commit=COMMIT, files=list(self.files), entrypoint=self.files[0].path)

    @activity.defn(name="Resolve Hugging Face source")
    async def resolve_source(self, source: HubSource) -> ResolvedSource:
        return self._resolved("Resolve Hugging Face source", source)

    @activity.defn(name="Resolve volume source")
    async def resolve_volume(self, source: PvcSource) -> ResolvedSource:
        resolved = self._resolved("Resolve volume source", source)
        return replace(resolved, commit="")

    @activity.defn(name="Download file into cache staging")
    async def download_file(self, request: DownloadRequest) -> DownloadedFile:
        self._record("Download file into cache staging", request)
        if self.download_failures:
            raise self.download_failures.popleft()
        return DownloadedFile(
            path=request.file.path,
            size=request.file.size,
            sha256=request.file.sha256 or MODEL_SHA256,
        )

    @activity.defn(name="Copy file into cache staging")
    async def copy_file(self, request: CopyRequest) -> DownloadedFile:
        self._record("Copy file into cache staging", request)
        return DownloadedFile(path=request.file.path, size=request.file.size, sha256=MODEL_SHA256)

    @activity.defn(name="Check free space in cache")
    async def ensure_space(self, request: SpaceRequest) -> int:
        self._record("Check free space in cache", request)
        return self.free_bytes

    @activity.defn(name="Prepare cache staging")
    async def prepare_staging(self, request: dict[str, Any]) -> int:
        """The real one removes stale staging and counts this import's partial files
        (`activities.cache.StagingRequest`, as JSON here)."""
        self._record("Prepare cache staging", request)
        if self.free_bytes < request["needed_bytes"]:
            raise ApplicationError(
                f"cache has {self.free_bytes} bytes free, the import needs {request['needed_bytes']}",
                {"freeBytes": self.free_bytes, "neededBytes": request["needed_bytes"]},
                type="InsufficientStorage",
                non_retryable=True,
            )
        return self.free_bytes

    @activity.defn(name="Find published artifact")
    async def lookup(self, request: LookupRequest) -> bool:
        self._record("Find published artifact", request)
        return False

    @activity.defn(name="Inspect GGUF and publish artifact")
    async def publish(self, request: PublishRequest) -> PublishedArtifact:
        self._record("Inspect GGUF and publish artifact", request)
        return PublishedArtifact(
            manifest_digest=MANIFEST_DIGEST,
            artifact_digest=ARTIFACT_DIGEST,
            total_size=sum(f.size for f in request.files),
            directory=f"{request.cache_root}/blobs/sha256/{MANIFEST_DIGEST}",
            facts=TINY_GGUF,
        )

    @activity.defn(name="Discard staged files")
    async def discard_staging(self, request: DiscardRequest) -> None:
        self._record("Discard staged files", request)

    @activity.defn(name="Re-hash published artifact")
    async def verify_published(self, request: VerifyPublishedRequest) -> int:
        self._record("Re-hash published artifact", request)
        if self.verify_failures:
            raise self.verify_failures.popleft()
        return MODEL_SIZE

    @activity.defn(name="Verify files in place")
    async def verify_in_place(self, request: InPlaceRequest) -> InPlaceArtifact:
        self._record("Verify files in place", request)
        return InPlaceArtifact(
            files=[
                DownloadedFile(path=f.path, size=f.size, sha256=MODEL_SHA256) for f in request.files
            ],
            manifest_digest=MANIFEST_DIGEST,
            artifact_digest=ARTIFACT_DIGEST,
            total_size=sum(f.size for f in request.files),
            base_path=request.entrypoint.rpartition("/")[0],
            facts=TINY_GGUF,
        )
