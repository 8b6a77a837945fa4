"""The serving pod of a ModelDeployment, as data.

Kama manages serving pods directly. Everything that makes one replica what it is
(runtime image, serving plan, artifact location, resources, GPU binding,
scheduling constraints) is a `ServingTemplate`; its fingerprint goes into a label,
so a changed template means a rollout and an unchanged one means nothing to do.
Pod names are `<deployment>-<fingerprint>-<ordinal>`, so re-running the activity
that creates one is harmless. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from kama.accelerators import GPU_PRODUCT_LABEL, GPU_RESOURCE
from kama.cache_layout import BLOBS_DIR
from kama.serving_plan import (
    ARTIFACT_LAYOUT_ENV,
    DRAFT_DIR,
    IN_PLACE_LAYOUT,
    LLAMA_PORT,
    MODELS_DIR,
    SUPERVISOR_PORT,
    ServingPlan,
    adapter_mount,
)

API_VERSION: Final = "kama.dev/v1alpha1"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
ROLE_LABEL: Final = "kama.dev/role"
SERVER_ROLE: Final = "server"
DEPLOYMENT_LABEL: Final = "kama.dev/deployment"
FINGERPRINT_LABEL: Final = "kama.dev/fingerprint"
DRAINING_LABEL: Final = "kama.dev/draining"
ORDINAL_ANNOTATION: Final = "kama.dev/ordinal"
ARGS_ANNOTATION: Final = "kama.dev/llama-server-args"
RUNTIME_USER: Final = 65532
GRACE_BEYOND_DRAIN_S: Final = 15
SERVING_PLAN_ENV: Final = "KAMA_SERVING_PLAN"
"""The serving container's environment variable that carries its ``ServingPlan`` as JSON:
the runtime reads it, the gateway finds the plan of a pod by it."""
LISTEN_FIRST_ENV: Final = "KAMA_LISTEN_FIRST"
"""The port the serving image's entrypoint, `kama-listen-first`, listens on before it
execs the runtime (runtime/probe_socket.py: why)."""
SERVED_NAME_ENV: Final = "LLAMA_ARG_ALIAS"
"""llama-server's `--alias`, from the environment it inherits: the name its answers give
the model (`<namespace>/<deployment>`, the name clients use), instead of its file's. Not
in the fingerprint: replicas started before it name their file, and the gateway renames
what they send (`gateway.answer_model`)."""
FINGERPRINT_CHARS: Final = 10
MAX_NAME_PREFIX: Final = 40
# ServingPlan and ServingTemplate fields that did not exist in the first release's
# fingerprints
PLAN_FIELDS_ADDED_LATER: Final = (
    "load_mode",
    "cache_reuse",
    "prompt_cache_mib",
    "mode",
    "pooling",
    "projector",
    "draft_name",
    "draft_entrypoint",
    "draft_manifest_digest",
    "draft_in_place",
    "draft_gpu_layers",
    "draft_max",
    "draft_min",
    "adapters",
)
TEMPLATE_FIELDS_ADDED_LATER: Final = (
    "node",
    "gpu_resource",
    "gpu_product_label",
    "draft_claim_name",
    "draft_sub_path",
    "adapter_volumes",
)


@dataclass(frozen=True, kw_only=True)
class ServingTemplate:
    """What one replica is; two pods with equal templates are interchangeable."""

    image: str
    plan: ServingPlan
    claim_name: str
    sub_path: str
    cpu_request: str
    memory_request: str
    memory_limit: str | None = None
    gpus: int = 0
    gpu_product: str | None = None
    gpu_resource: str | None = None
    """The extended resource requested `gpus` of (a MIG profile's, a renamed shared
    one); None: `nvidia.com/gpu`."""
    gpu_product_label: str | None = None
    """The node label `gpu_product` is read from; None: `nvidia.com/gpu.product`."""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    node: str | None = None
    """The one node every replica runs on: set when the artifact's claim can be
    mounted by one node at a time (ReadWriteOnce)."""
    draft_claim_name: str | None = None  # where the draft model's artifact is
    draft_sub_path: str | None = None
    adapter_volumes: tuple[tuple[str, str, str], ...] | None = None
    """Where each adapter's artifact is: (adapter name, claim, subPath)."""

    def fingerprint(self) -> str:
        """A hash of the template. Fields added after pods were running are left out
        while unset, so a Kama upgrade neither rolls every deployment nor changes what
        a running workflow computes when it replays its history."""
        content = asdict(self)
        for name in PLAN_FIELDS_ADDED_LATER:
            if content["plan"].get(name) is None:
                del content["plan"][name]
        for name in TEMPLATE_FIELDS_ADDED_LATER:
            if content.get(name) is None:
                del content[name]
        canonical = json.dumps(content, sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:FINGERPRINT_CHARS]


def serving_selector(deployment: str) -> str:
    return f"{DEPLOYMENT_LABEL}={deployment},{ROLE_LABEL}={SERVER_ROLE}"


def serving_pod_name(*, deployment: str, fingerprint: str, ordinal: int) -> str:
    return f"{deployment[:MAX_NAME_PREFIX].rstrip('-.')}-{fingerprint}-{ordinal}"


def _resources(template: ServingTemplate) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": template.cpu_request, "memory": template.memory_request}
    limits: dict[str, str] = {}
    if template.memory_limit:
        limits["memory"] = template.memory_limit
    if template.gpus:
        resource = template.gpu_resource or GPU_RESOURCE
        requests[resource] = limits[resource] = str(template.gpus)
    return {"requests": requests, **({"limits": limits} if limits else {})}


def _layout_env(template: ServingTemplate) -> list[dict[str, str]]:
    """Tell the supervisor when the artifact is not a blob published in a cache (whose
    subPath is always `blobs/sha256/<manifest digest>`) but a Direct source's directory
    on its own claim, which it must hash again (runtime/supervisor.py)."""
    published = f"{BLOBS_DIR}/{template.plan.manifest_digest}"
    if template.sub_path == published:
        return []
    return [{"name": ARTIFACT_LAYOUT_ENV, "value": IN_PLACE_LAYOUT}]


def _affinity(template: ServingTemplate) -> dict[str, Any] | None:
    """Required node affinity: the GPU product the plan counted on (by the label it
    was read from), and the one node of a single-node claim (by name, as a DaemonSet
    pins its pods)."""
    term: dict[str, list[dict[str, Any]]] = {}
    if template.gpus and template.gpu_product:
        label = template.gpu_product_label or GPU_PRODUCT_LABEL
        term["matchExpressions"] = [
            {"key": label, "operator": "In", "values": [template.gpu_product]}
        ]
    if template.node:
        term["matchFields"] = [
            {"key": "metadata.name", "operator": "In", "values": [template.node]}
        ]
    if not term:
        return None
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def _mount(spec: dict[str, Any], *, volume: str, path: str, claim: str, sub_path: str) -> None:
    """Another artifact (a draft model, an adapter) read-only at `path` of the runtime."""
    spec["containers"][0]["volumeMounts"].append(
        {"name": volume, "mountPath": path, "subPath": sub_path, "readOnly": True}
    )
    spec["volumes"].append(
        {"name": volume, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
    )


def serving_pod_manifest(
    *,
    template: ServingTemplate,
    namespace: str,
    deployment: str,
    deployment_uid: str,
    ordinal: int,
) -> dict[str, Any]:
    """The Pod for replica `ordinal`: non-root, read-only root filesystem, no
    privilege escalation, no service-account token, the artifact read-only at
    /models, readiness from the runtime supervisor (llama-server health + props)."""
    fingerprint = template.fingerprint()
    plan = template.plan
    args = plan.llama_server_args(host="$(POD_IP)", port=LLAMA_PORT)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a crashed replica is replaced by Kama, visibly
        # the pod's pause process is PID 1, not the runtime: PID 1 ignores a SIGTERM it
        # has no handler for yet, so a pod deleted in the runtime's first moments would
        # run on until its grace period ended; any other process dies of it at once
        "shareProcessNamespace": True,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": int(plan.drain_timeout_s) + GRACE_BEYOND_DRAIN_S,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_USER,
            "runAsGroup": RUNTIME_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "runtime",
                "image": template.image,
                "args": ["runtime"],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": SERVING_PLAN_ENV, "value": plan.to_json()},
                    {"name": LISTEN_FIRST_ENV, "value": str(SUPERVISOR_PORT)},
                    {"name": SERVED_NAME_ENV, "value": f"{namespace}/{deployment}"},
                    *_layout_env(template),
                ],
                "ports": [
                    {"name": "http", "containerPort": LLAMA_PORT},
                    {"name": "supervisor", "containerPort": SUPERVISOR_PORT},
                ],
                "readinessProbe": {
                    "httpGet": {"path": "/readyz", "port": SUPERVISOR_PORT},
                    "periodSeconds": 1,
                    "failureThreshold": 2,
                },
                "livenessProbe": {
                    "httpGet": {"path": "/livez", "port": SUPERVISOR_PORT},
                    "periodSeconds": 10,
                    "failureThreshold": 3,
                },
                "resources": _resources(template),
                "securityContext": {
                    "readOnlyRootFilesystem": True,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {
                        "name": "model",
                        "mountPath": MODELS_DIR,
                        "subPath": template.sub_path,
                        "readOnly": True,
                    }
                ],
            }
        ],
        "volumes": [
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": template.claim_name, "readOnly": True},
            }
        ],
    }
    if template.draft_claim_name and template.draft_sub_path:
        container = spec["containers"][0]
        container["volumeMounts"].append(
            {
                "name": "draft",
                "mountPath": DRAFT_DIR,
                "subPath": template.draft_sub_path,
                "readOnly": True,
            }
        )
        spec["volumes"].append(
            {
                "name": "draft",
                "persistentVolumeClaim": {"claimName": template.draft_claim_name, "readOnly": True},
            }
        )
    for i, (name, claim, sub_path) in enumerate(template.adapter_volumes or ()):
        _mount(
            spec, volume=f"adapter-{i}", path=adapter_mount(name), claim=claim, sub_path=sub_path
        )
    if template.node_selector:
        spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        spec["tolerations"] = list(template.tolerations)
    affinity = _affinity(template)
    if affinity:
        spec["affinity"] = affinity
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": serving_pod_name(
                deployment=deployment, fingerprint=fingerprint, ordinal=ordinal
            ),
            "namespace": namespace,
            "labels": {
                MANAGED_BY_LABEL: "kama",
                ROLE_LABEL: SERVER_ROLE,
                DEPLOYMENT_LABEL: deployment,
                FINGERPRINT_LABEL: fingerprint,
            },
            "annotations": {ORDINAL_ANNOTATION: str(ordinal), ARGS_ANNOTATION: " ".join(args)},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "ModelDeployment",
                    "name": deployment,
                    "uid": deployment_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }
