"""The importer pod, built as data (no I/O) like `kama.serving_pod` builds the serving
pod: `importer_pod_manifest` turns a typed `ImporterTemplate` (what every importer pod
of this worker shares), the operation and the volumes it mounts into the Pod the
worker creates (`activities.importer_pods` only reads the artifact and sends it).

What an operator sets for importer pods besides their Temporal connection: the
container's resources, extra environment (a proxy for downloads: `HTTPS_PROXY`,
`NO_PROXY`) and a CA bundle to trust for the model source (a TLS-inspecting proxy, a
private Hub mirror). The chart hands them to the worker as `KAMA_IMPORTER_RESOURCES`
and `KAMA_IMPORTER_ENV` (JSON, shaped as in a pod spec) and
`KAMA_IMPORTER_CA_CONFIGMAP` / `KAMA_IMPORTER_CA_KEY` (a ConfigMap in each served
namespace). They are checked when the worker starts, so a bad value stops it with a
message that names the variable instead of failing every import later."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kama.contracts import ObjectRef
from kama.importer_protocol import IMPORTER_PORT, TOKEN_ENV

# where the CA bundle is mounted in importer pods; the importer's HTTP client (httpx)
# trusts exactly the bundle SSL_CERT_FILE names
CA_MOUNT = "/etc/kama/source-ca"
CA_FILE = "ca.crt"
CA_VOLUME = "source-ca"
CACHE_MOUNT = "/cache"
SOURCE_MOUNT = "/source"
TOKEN_MOUNT = "/var/run/kama/hf-token"
IMPORTER_ROLE = "importer"
IMPORTER_USER = 65532
DEFAULT_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "250m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}
"""An importer streams and hashes in bounded buffers (a few MiB); without a request
it would be BestEffort (first evicted) and, in a namespace with a LimitRange or a
ResourceQuota, maybe refused."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_RESOURCE_KEYS = frozenset({"requests", "limits"})
# names Kama sets itself: an operator's value would silently cut the pod off Temporal,
# the Hub endpoint or the mounted bundle
_RESERVED_PREFIXES = ("TEMPORAL_", "KAMA_")
_RESERVED_NAMES = frozenset({"SSL_CERT_FILE"})


@dataclass(frozen=True, kw_only=True)
class ImporterMounts:
    """What one importer pod mounts, each read by the worker from the artifact's own
    spec (never from an activity's input): the cache's claim, the source claim
    (read-only), and the Secret key that `tokenSecretRef` names."""

    cache_claim: str | None = None
    source_claim: str | None = None
    token_secret: str | None = None
    token_key: str | None = None

    def volumes(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        found: list[tuple[dict[str, Any], dict[str, Any]]] = []
        if self.cache_claim:
            found.append(
                (
                    {"name": "cache", "persistentVolumeClaim": {"claimName": self.cache_claim}},
                    {"name": "cache", "mountPath": CACHE_MOUNT},
                )
            )
        if self.source_claim:
            found.append(
                (
                    {
                        "name": "source",
                        "persistentVolumeClaim": {
                            "claimName": self.source_claim,
                            "readOnly": True,
                        },
                    },
                    {"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True},
                )
            )
        if self.token_secret and self.token_key:
            found.append(
                (
                    {
                        "name": "hf-token",
                        "secret": {
                            "secretName": self.token_secret,
                            "items": [{"key": self.token_key, "path": "token"}],
                            "defaultMode": 0o440,
                        },
                    },
                    {"name": "hf-token", "mountPath": TOKEN_MOUNT, "readOnly": True},
                )
            )
        return found


def artifact_mounts(
    spec: Mapping[str, Any], *, cache_claim: str | None, source: bool, token: bool
) -> ImporterMounts:
    """What one operation's importer pod mounts, from the live artifact's `spec`: the
    cache's claim (found by the caller, None: not mounted), the source claim the spec
    names when `source`, and its `tokenSecretRef` when `token`."""
    hub_or_claim = spec.get("source") or {}
    claim = hub_or_claim.get("persistentVolumeClaim") or {}
    secret = (hub_or_claim.get("huggingFace") or {}).get("tokenSecretRef") or {}
    return ImporterMounts(
        cache_claim=cache_claim,
        source_claim=claim.get("claimName") if source else None,
        token_secret=secret.get("name") if token else None,
        token_key=secret.get("key") if token else None,
    )


@dataclass(frozen=True)
class ImporterPodOptions:
    resources: dict[str, dict[str, str]] = field(default_factory=dict)
    env: tuple[dict[str, Any], ...] = ()
    ca_configmap: str | None = None
    ca_key: str = CA_FILE

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ImporterPodOptions:
        """The options the chart passed; ValueError naming the variable otherwise."""
        return cls(
            resources=_resources(env.get("KAMA_IMPORTER_RESOURCES") or "{}"),
            env=_extra_env(env.get("KAMA_IMPORTER_ENV") or "[]"),
            ca_configmap=env.get("KAMA_IMPORTER_CA_CONFIGMAP") or None,
            ca_key=env.get("KAMA_IMPORTER_CA_KEY") or CA_FILE,
        )

    def container_env(self) -> list[dict[str, Any]]:
        """The importer container's `env` entries these options add."""
        entries = [dict(entry) for entry in self.env]
        if self.ca_configmap is not None:
            entries.append({"name": "SSL_CERT_FILE", "value": f"{CA_MOUNT}/{CA_FILE}"})
        return entries

    def ca_volume(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The ConfigMap volume with the CA bundle and its mount, when one is set."""
        if self.ca_configmap is None:
            return None
        volume = {
            "name": CA_VOLUME,
            "configMap": {
                "name": self.ca_configmap,
                "items": [{"key": self.ca_key, "path": CA_FILE}],
            },
        }
        return volume, {"name": CA_VOLUME, "mountPath": CA_MOUNT, "readOnly": True}


def _json(value: str, *, variable: str) -> object:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{variable} is not JSON: {exc}") from None


def _resources(value: str) -> dict[str, dict[str, str]]:
    variable = "KAMA_IMPORTER_RESOURCES"
    found = _json(value, variable=variable)
    if not isinstance(found, dict):
        raise ValueError(f"{variable} must be an object with requests and/or limits")
    resources: dict[str, dict[str, str]] = {}
    for key, amounts in found.items():
        if key not in _RESOURCE_KEYS:
            raise ValueError(f"{variable}: unknown key {key!r} (requests, limits)")
        if not isinstance(amounts, dict) or not all(
            isinstance(name, str) and isinstance(amount, str | int | float)
            and not isinstance(amount, bool)
            for name, amount in amounts.items()
        ):  # fmt: skip
            raise ValueError(f"{variable}.{key} must map resource names to quantities")
        resources[key] = {name: str(amount) for name, amount in amounts.items()}
    return resources


def _extra_env(value: str) -> tuple[dict[str, Any], ...]:
    variable = "KAMA_IMPORTER_ENV"
    found = _json(value, variable=variable)
    if not isinstance(found, list):
        raise ValueError(f"{variable} must be a list of env entries (name, value)")
    entries: list[dict[str, Any]] = []
    for number, entry in enumerate(found):
        where = f"{variable}[{number}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError(f"{where} must be an object with a name")
        name = entry["name"]
        if not _ENV_NAME.match(name):
            raise ValueError(f"{where}: {name!r} is not an environment variable name")
        if name.startswith(_RESERVED_PREFIXES) or name in _RESERVED_NAMES:
            raise ValueError(f"{where}: {name} is set by Kama itself")
        if set(entry) - {"name", "value", "valueFrom"} or (
            ("value" in entry) == ("valueFrom" in entry)
        ):
            raise ValueError(f"{where} ({name}) needs exactly one of value, valueFrom")
        if "value" in entry and not isinstance(entry["value"], str):
            raise ValueError(f"{where} ({name}): value must be a string")
        if "valueFrom" in entry and not isinstance(entry["valueFrom"], dict):
            raise ValueError(f"{where} ({name}): valueFrom must be an object")
        entries.append(dict(entry))
    return tuple(entries)


@dataclass(frozen=True, kw_only=True)
class ImporterTemplate:
    """What every importer pod of this worker shares: the Kama image, the Hub it
    downloads from and the operator's options."""

    image: str
    hf_endpoint: str = "https://huggingface.co"
    options: ImporterPodOptions = field(default_factory=ImporterPodOptions)


def importer_pod_name(artifact: str, operation_id: str) -> str:
    return f"{artifact[:40]}-import-{operation_id[-12:]}".lower()


def importer_pod_manifest(
    *,
    template: ImporterTemplate,
    name: str,
    owner: ObjectRef,
    operation_id: str,
    token: str,
    mounts: ImporterMounts,
) -> dict[str, Any]:
    """The importer pod of one operation, owned by its ModelArtifact: it meets the
    `restricted` Pod Security level (non-root, seccomp RuntimeDefault, no privilege
    escalation, every capability dropped), has a read-only root filesystem, no
    service-account token, and requests resources (the operator's, else
    `DEFAULT_RESOURCES`). It holds no Temporal credential: it serves the worker on
    its pod IP (`kama.importer_protocol`), answering only `token` (a new one for each
    pod, made by the caller). The cache claim is mounted read-write, the source claim,
    the token Secret and the CA bundle read-only."""
    options = template.options
    ca = options.ca_volume()
    volumes_and_mounts = [*mounts.volumes(), *([ca] if ca is not None else [])]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": {
                "app.kubernetes.io/managed-by": "kama",
                "kama.dev/role": IMPORTER_ROLE,
                "kama.dev/artifact": owner.name,
                "kama.dev/operation": operation_id,
            },
            "ownerReferences": [
                {
                    "apiVersion": "kama.dev/v1alpha1",
                    "kind": "ModelArtifact",
                    "name": owner.name,
                    "uid": owner.uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "restartPolicy": "Always",
            # the pause process is PID 1, not the importer: PID 1 ignores a SIGTERM it
            # has no handler for yet, so a pod deleted as it starts would run out its
            # grace period (as serving pods do, `kama.serving_pod`)
            "shareProcessNamespace": True,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 10,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": IMPORTER_USER,
                "runAsGroup": IMPORTER_USER,
                "fsGroup": IMPORTER_USER,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "importer",
                    "image": template.image,
                    "args": ["importer"],
                    "env": [
                        {
                            "name": "POD_IP",
                            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                        },
                        {"name": TOKEN_ENV, "value": token},
                        {"name": "KAMA_HF_ENDPOINT", "value": template.hf_endpoint},
                        *options.container_env(),
                    ],
                    "ports": [{"name": "importer", "containerPort": IMPORTER_PORT}],
                    "resources": options.resources or DEFAULT_RESOURCES,
                    "securityContext": {
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [mount for _, mount in volumes_and_mounts],
                }
            ],
            "volumes": [volume for volume, _ in volumes_and_mounts],
        },
    }
