"""Process settings from the environment, parsed without I/O (the caller passes
`os.environ`). Every Kama process reads the same names.

The Temporal connection itself (address, namespace, API key, TLS, profiles) is read
the way every Temporal app reads it, `TEMPORAL_*` through `temporalio.envconfig`
(`kamactl/clients.py`); `KAMA_TEMPORAL_ADDRESS` and `KAMA_TEMPORAL_NAMESPACE`, kept
from before, override those two when set. `KAMA_CLUSTER` names the cluster for when
several share one Temporal namespace (see `cluster_name_problem`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kama.contracts import control_task_queue
from kama.importer_pod import ImporterPodOptions
from kama.tenancy import (
    DEFAULT_NODE_SELECTOR_KEYS,
    DEFAULT_TOLERATION_KEYS,
    TenancyPolicy,
    parse_key_list,
    parse_namespaces,
)

GATEWAY_AUTH_MODES = ("apikey", "disabled")  # KAMA_GATEWAY_AUTH
DEFAULT_CONTROL_QUEUE = "kama-control"
DEFAULT_IMPORTER_IMAGE = "ghcr.io/kama-dev/kama:0.1.0"
DEFAULT_HEALTH_PORT = 8081

# a DNS label: it prefixes workflow IDs and task queues, and may name Kubernetes objects
_CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def cluster_name_problem(name: str) -> str | None:
    """Why `name` cannot be a cluster's name (None if it can).

    "" is the unnamed cluster: the Temporal namespace serves this one cluster, and the
    workflow IDs and the control queue are the ones Kama always used, so an install
    that gains a name later is the only change that moves its workflows. There is no
    derived default (such as the kube-system namespace's uid): an identity that changes
    when a cluster is restored or rebuilt would orphan every running workflow, reading
    it needs a cluster-wide permission that the namespaced mode does not have, and a
    Helm `lookup` is empty under `helm template`. Clusters that share a namespace each
    set their own name (the chart's `clusterName`)."""
    if name == "" or _CLUSTER_NAME.match(name):
        return None
    return (
        f"KAMA_CLUSTER={name!r} is not a valid cluster name: lower-case letters, digits "
        "and '-', at most 63 characters, starting and ending with a letter or digit"
    )


@dataclass(frozen=True)
class Settings:
    # KAMA_TEMPORAL_ADDRESS / KAMA_TEMPORAL_NAMESPACE: None leaves them to TEMPORAL_*
    temporal_address: str | None = None
    temporal_namespace: str | None = None
    control_queue: str = DEFAULT_CONTROL_QUEUE  # as configured; see control_task_queue
    cluster: str = ""  # KAMA_CLUSTER: see cluster_name_problem
    hf_endpoint: str = "https://huggingface.co"
    importer_image: str = DEFAULT_IMPORTER_IMAGE
    # resources, extra env and CA bundle of importer pods (KAMA_IMPORTER_RESOURCES, ...)
    importer_pod: ImporterPodOptions = field(default_factory=ImporterPodOptions)
    # what tenants may ask for: served namespaces, node selector and toleration keys
    tenancy: TenancyPolicy = field(default_factory=TenancyPolicy)
    runtime_image: str = DEFAULT_IMPORTER_IMAGE  # serving pods run `kama runtime` from it
    # earlier runtime images that deployments started before an upgrade still create
    # replicas of (KAMA_ALLOWED_RUNTIME_IMAGES; the chart's admissionPolicy.extraImages)
    previous_runtime_images: tuple[str, ...] = ()
    health_port: int = DEFAULT_HEALTH_PORT  # the watcher's /healthz and /readyz
    health_host: str = "0.0.0.0"  # in a pod: its own IP (the chart passes status.podIP)
    # Prometheus /metrics of the worker and the watcher, on health_host; None: not served
    metrics_port: int | None = None  # Kama's own metrics (KAMA_METRICS_PORT)
    temporal_metrics_port: int | None = None  # the Temporal SDK's (KAMA_TEMPORAL_METRICS_PORT)
    # host:port where KEDA reaches the gateways' external scaler (the chart's
    # keda.enabled); None: KEDA mode is refused with an Event and Kama scales itself
    keda_scaler_address: str | None = None
    # the gateway's public port: "apikey" (every request names a ModelAccessKey) or
    # "disabled" (anyone may use every model: only when set explicitly)
    gateway_auth: str = "apikey"
    # KAMA_GATEWAY_CROSS_NAMESPACE_GRANTS: honour ModelAccessKeys' `namespaces`
    gateway_cross_namespace_grants: bool = False
    # KAMA_GATEWAY_KEY_CEILINGS (JSON): the operator's ceilings on API keys' limits,
    # {"default": {...}, "namespaces": {"<ns>": {...}}} (gateway.auth_limits.KeyCeilings)
    gateway_key_ceilings: Mapping[str, Any] = field(default_factory=dict)
    # KAMA_SERVING_KEY: the master key of llama-servers' API keys (kama.serving_key),
    # held by the worker and the gateway; None: serving pods require no key
    serving_key: str | None = field(default=None, repr=False)
    # KAMA_SERVING_KEY_SECRET (`<namespace>/<name>`), _FIELD, _GENERATE: where the worker
    # reads the master key when KAMA_SERVING_KEY is not set, and whether it creates
    # that Secret when it is missing (kamactl.serving_key_secret)
    serving_key_secret: str | None = None
    serving_key_field: str = "serving-key"
    serving_key_generate: bool = False
    # KAMA_TENANT_NETWORK_POLICIES (JSON list of {"name", "spec"}): the NetworkPolicies
    # of tenant pods the worker creates in each namespace it creates one in (the chart
    # sets it in the cluster-wide mode; activities.tenant_fence)
    tenant_network_policies: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if problem := cluster_name_problem(self.cluster):
            raise ValueError(problem)

    @property
    def runtime_images(self) -> frozenset[str]:
        """The images serving pods may run: the configured one and the previous ones."""
        return frozenset({self.runtime_image, *self.previous_runtime_images})

    @property
    def control_task_queue(self) -> str:
        """The task queue every process of this cluster uses for Kama's workflows and
        control activities (the worker polls it, the watcher and gateway start on it)."""
        return control_task_queue(cluster=self.cluster, queue=self.control_queue)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        defaults = cls()
        return cls(
            temporal_address=env.get("KAMA_TEMPORAL_ADDRESS") or None,
            temporal_namespace=env.get("KAMA_TEMPORAL_NAMESPACE") or None,
            control_queue=env.get("KAMA_CONTROL_QUEUE", defaults.control_queue),
            cluster=env.get("KAMA_CLUSTER", defaults.cluster).strip(),
            hf_endpoint=env.get("KAMA_HF_ENDPOINT", defaults.hf_endpoint),
            importer_image=env.get("KAMA_IMPORTER_IMAGE", defaults.importer_image),
            importer_pod=ImporterPodOptions.from_env(env),
            tenancy=TenancyPolicy(
                watch_namespaces=parse_namespaces(env.get("KAMA_WATCH_NAMESPACE")),
                node_selector_keys=parse_key_list(
                    env.get("KAMA_ALLOWED_NODE_SELECTOR_KEYS"), default=DEFAULT_NODE_SELECTOR_KEYS
                ),
                toleration_keys=parse_key_list(
                    env.get("KAMA_ALLOWED_TOLERATION_KEYS"), default=DEFAULT_TOLERATION_KEYS
                ),
            ),
            runtime_image=env.get("KAMA_RUNTIME_IMAGE")
            or env.get("KAMA_IMPORTER_IMAGE", defaults.runtime_image),
            previous_runtime_images=tuple(
                sorted(parse_key_list(env.get("KAMA_ALLOWED_RUNTIME_IMAGES"), default=()))
            ),
            health_port=int(env.get("KAMA_HEALTH_PORT", defaults.health_port)),
            health_host=env.get("KAMA_HEALTH_HOST") or defaults.health_host,
            metrics_port=_port(env.get("KAMA_METRICS_PORT")),
            temporal_metrics_port=_port(env.get("KAMA_TEMPORAL_METRICS_PORT")),
            keda_scaler_address=env.get("KAMA_KEDA_SCALER_ADDRESS") or None,
            gateway_auth=_gateway_auth(env.get("KAMA_GATEWAY_AUTH")),
            gateway_cross_namespace_grants=_flag(env.get("KAMA_GATEWAY_CROSS_NAMESPACE_GRANTS")),
            gateway_key_ceilings=_json_object(
                "KAMA_GATEWAY_KEY_CEILINGS", env.get("KAMA_GATEWAY_KEY_CEILINGS")
            ),
            serving_key=(env.get("KAMA_SERVING_KEY") or "").strip() or None,
            serving_key_secret=(env.get("KAMA_SERVING_KEY_SECRET") or "").strip() or None,
            serving_key_field=env.get("KAMA_SERVING_KEY_FIELD") or defaults.serving_key_field,
            serving_key_generate=_flag(env.get("KAMA_SERVING_KEY_GENERATE")),
            tenant_network_policies=_named_policies(env.get("KAMA_TENANT_NETWORK_POLICIES")),
        )


def _gateway_auth(value: str | None) -> str:
    """KAMA_GATEWAY_AUTH: unset or empty is "apikey"; a typo is an error, never open."""
    mode = (value or "apikey").strip().lower()
    if mode not in GATEWAY_AUTH_MODES:
        raise ValueError(
            f"KAMA_GATEWAY_AUTH={value!r} is not one of {', '.join(GATEWAY_AUTH_MODES)}"
        )
    return mode


def _json_object(name: str, value: str | None) -> dict[str, Any]:
    """A setting holding a JSON object; unset or empty is {}."""
    if not (value or "").strip():
        return {}
    try:
        document = json.loads(value or "")
    except ValueError as exc:
        raise ValueError(f"{name} is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError(f"{name} must be a JSON object")
    return document


def _named_policies(value: str | None) -> tuple[Mapping[str, Any], ...]:
    """KAMA_TENANT_NETWORK_POLICIES: a JSON list of {"name": str, "spec": object}."""
    if not (value or "").strip():
        return ()
    try:
        document = json.loads(value or "")
    except ValueError as exc:
        raise ValueError(f"KAMA_TENANT_NETWORK_POLICIES is not JSON: {exc}") from None
    if not isinstance(document, list) or not all(
        isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("spec"), dict)
        for p in document
    ):
        raise ValueError('KAMA_TENANT_NETWORK_POLICIES must be a list of {"name", "spec"}')
    return tuple(document)


def _flag(value: str | None) -> bool:
    """A boolean setting: true/1/yes, or false/0/no/unset."""
    text = (value or "false").strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ValueError(f"{value!r} is not a boolean (true or false)")


def _port(value: str | None) -> int | None:
    """A port to listen on; unset, empty or 0 means none."""
    return int(value) if value and int(value) else None
