"""KEDA as an external system for the DeploymentWorkflow: write and remove the
ScaledObject of a deployment in KEDA mode (`kama.scaled_object`).

Both calls are idempotent (server-side apply with Kama's field manager; a delete of a
missing object is success). Where KEDA cannot be used the answer is the typed,
non-retryable `KedaUnavailable`, naming why: the worker was not told the gateway's
scaler address (the chart's `keda.enabled`), or the API server does not know
ScaledObjects (KEDA is not installed). Waiting does not change either; the workflow
says so in an Event and keeps scaling the model itself."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube_errors import KubeTarget, NotFound, kube_call
from kama.api.deployment import ModelDeploymentSpec
from kama.contracts import ObjectRef
from kama.reasons import Failure
from kama.scaled_object import KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS, scaled_object

FIELD_MANAGER = "kama"


class KedaUnavailable(ApplicationError):
    """KEDA mode was asked for where it cannot work."""

    def __init__(self, message: str) -> None:
        super().__init__(message, type=Failure.KEDA_UNAVAILABLE, non_retryable=True)


@dataclass(frozen=True)
class ScaledObjectRequest:
    ref: ObjectRef  # the ModelDeployment
    spec: dict[str, Any]  # its spec, as the watcher saw it


class KedaActivities:
    def __init__(self, *, api: k8s.ApiClient, scaler_address: str | None) -> None:
        """`scaler_address`: host:port where KEDA reaches the gateways' external scaler
        (`KAMA_KEDA_SCALER_ADDRESS`); None where this install does not serve one."""
        self.custom = k8s.CustomObjectsApi(api)
        self.scaler_address = scaler_address

    @activity.defn(name="Apply KEDA ScaledObject")
    def apply_scaled_object(self, request: ScaledObjectRequest) -> None:
        if not self.scaler_address:
            raise KedaUnavailable(
                "spec.scaling.autoscaler is KEDA but this Kama install serves no KEDA "
                "external scaler (set the chart's keda.enabled, which gives the worker "
                "KAMA_KEDA_SCALER_ADDRESS)"
            )
        ref = request.ref
        spec = ModelDeploymentSpec.model_validate(request.spec)
        body = scaled_object(ref=ref, spec=spec, scaler_address=self.scaler_address)
        target = KubeTarget(resource=SCALED_OBJECTS, namespace=ref.namespace, name=ref.name)
        try:
            with kube_call(verb="apply", target=target):
                self.custom.patch_namespaced_custom_object(
                    KEDA_GROUP,
                    KEDA_VERSION,
                    ref.namespace,
                    SCALED_OBJECTS,
                    ref.name,
                    body,
                    field_manager=FIELD_MANAGER,
                    force=True,
                    _content_type="application/apply-patch+yaml",
                )
        except NotFound as exc:
            raise KedaUnavailable(
                f"spec.scaling.autoscaler is KEDA but the API server does not serve "
                f"{SCALED_OBJECTS}.{KEDA_GROUP}/{KEDA_VERSION}: is KEDA installed? "
                f"({exc.api_message})"
            ) from exc

    @activity.defn(name="Delete KEDA ScaledObject")
    def delete_scaled_object(self, ref: ObjectRef) -> None:
        """Remove the ScaledObject Kama wrote (Kama scales the model itself again);
        gone, or KEDA gone with it, is success."""
        target = KubeTarget(resource=SCALED_OBJECTS, namespace=ref.namespace, name=ref.name)
        with suppress(NotFound), kube_call(verb="delete", target=target):
            self.custom.delete_namespaced_custom_object(
                KEDA_GROUP, KEDA_VERSION, ref.namespace, SCALED_OBJECTS, ref.name
            )
