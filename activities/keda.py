"""KEDA as an external system for the DeploymentWorkflow: write and remove the
ScaledObject of a deployment in KEDA mode (`kama.scaled_object`).

Both calls are idempotent (server-side apply with Kama's field manager; a delete of a
missing object is success), and both act only on what the live cluster says, not on
their input (anyone who reaches Kama's Temporal namespace can schedule them): the
ScaledObject is built from the live ModelDeployment's spec (uid checked), and only
while that spec asks for KEDA; a ScaledObject is deleted only if it is Kama's for that
deployment (its controller is the ModelDeployment with that uid) and the deployment no
longer asks for KEDA (changed, being deleted, or gone). Where KEDA cannot be used the answer is the typed,
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
from activities.provenance import OwnerGone, live_object
from kama.api.deployment import Autoscaler, ModelDeploymentSpec
from kama.contracts import DEPLOYMENTS, ObjectRef
from kama.reasons import Failure
from kama.scaled_object import KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS, scaled_object
from kama.tenancy import TenancyPolicy

FIELD_MANAGER = "kama"


class KedaUnavailable(ApplicationError):
    """KEDA mode was asked for where it cannot work."""

    def __init__(self, message: str) -> None:
        super().__init__(message, type=Failure.KEDA_UNAVAILABLE, non_retryable=True)


@dataclass(frozen=True)
class ScaledObjectRequest:
    ref: ObjectRef  # the ModelDeployment
    spec: dict[str, Any]  # its spec as the workflow saw it: not used, the live one is read


class KedaActivities:
    def __init__(
        self,
        *,
        api: k8s.ApiClient,
        scaler_address: str | None,
        tenancy: TenancyPolicy | None = None,
    ) -> None:
        """`scaler_address`: host:port where KEDA reaches the gateways' external scaler
        (`KAMA_KEDA_SCALER_ADDRESS`); None where this install does not serve one."""
        self.custom = k8s.CustomObjectsApi(api)
        self.scaler_address = scaler_address
        self.tenancy = tenancy or TenancyPolicy()

    def _live_spec(self, ref: ObjectRef) -> tuple[ModelDeploymentSpec, bool] | None:
        """The live deployment's spec and whether it is being deleted; None when it is
        gone. ForgedRequest for a uid that is not the live object's."""
        try:
            live = live_object(self.custom, policy=self.tenancy, plural=DEPLOYMENTS, ref=ref)
        except OwnerGone:
            return None
        deleting = (live.get("metadata") or {}).get("deletionTimestamp") is not None
        return ModelDeploymentSpec.model_validate(live.get("spec") or {}), deleting

    @activity.defn(name="Apply KEDA ScaledObject")
    def apply_scaled_object(self, request: ScaledObjectRequest) -> None:
        if not self.scaler_address:
            raise KedaUnavailable(
                "spec.scaling.autoscaler is KEDA but this Kama install serves no KEDA "
                "external scaler (set the chart's keda.enabled, which gives the worker "
                "KAMA_KEDA_SCALER_ADDRESS)"
            )
        ref = request.ref
        live = self._live_spec(ref)
        if live is None or live[1] or live[0].scaling.autoscaler != Autoscaler.KEDA:
            return  # gone, going, or no longer KEDA's: the workflow's next pass removes it
        spec = live[0]
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
        """Remove the ScaledObject Kama wrote for the deployment (Kama scales the model
        itself again); gone, or KEDA gone with it, is success. Nothing is deleted while
        the live deployment asks for KEDA, nor a ScaledObject that is not Kama's for it."""
        live = self._live_spec(ref)
        if live is not None and not live[1] and live[0].scaling.autoscaler == Autoscaler.KEDA:
            return
        target = KubeTarget(resource=SCALED_OBJECTS, namespace=ref.namespace, name=ref.name)
        try:
            with kube_call(verb="get", target=target):
                found = self.custom.get_namespaced_custom_object(
                    KEDA_GROUP, KEDA_VERSION, ref.namespace, SCALED_OBJECTS, ref.name
                )
        except NotFound:
            return
        meta = found.get("metadata") or {}
        if not any(
            o.get("kind") == "ModelDeployment" and o.get("controller") and o.get("uid") == ref.uid
            for o in meta.get("ownerReferences") or []
        ):
            return  # not the one Kama wrote for this deployment
        with suppress(NotFound), kube_call(verb="delete", target=target):
            self.custom.delete_namespaced_custom_object(
                KEDA_GROUP,
                KEDA_VERSION,
                ref.namespace,
                SCALED_OBJECTS,
                ref.name,
                body={"preconditions": {"uid": meta.get("uid")}},
            )
