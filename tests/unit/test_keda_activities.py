"""The KEDA activities act on what the live cluster says, not on their input: anyone
who reaches Kama's Temporal namespace can schedule them (issue #41: a forged task
deleted any ScaledObject, and wrote a victim's with a maxReplicaCount of its choice)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from kubernetes import client as k8s

from activities.keda import KedaActivities, ScaledObjectRequest
from activities.provenance import ForgedRequest
from kama.contracts import ObjectRef

REF = ObjectRef(namespace="team-a", name="chat", uid="uid-chat")


class FakeCustom:
    """The API server's custom objects: one ModelDeployment and maybe a ScaledObject."""

    def __init__(self, *, deployment: dict[str, Any] | None, scaled: dict[str, Any] | None):
        self.objects: dict[str, dict[str, Any]] = {}
        if deployment is not None:
            self.objects["modeldeployments"] = deployment
        if scaled is not None:
            self.objects["scaledobjects"] = scaled
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[dict[str, Any]] = []

    def get_namespaced_custom_object(self, _g: str, _v: str, _ns: str, plural: str, _n: str) -> Any:
        if plural not in self.objects:
            raise k8s.ApiException(status=404, reason="Not Found")
        return self.objects[plural]

    def patch_namespaced_custom_object(self, *args: Any, **_kw: Any) -> None:
        self.applied.append(args[5])

    def delete_namespaced_custom_object(self, *_args: Any, body: Any = None, **_kw: Any) -> None:
        self.deleted.append(body)


def live_deployment(*, autoscaler: str = "KEDA", max_replicas: int = 3, **meta: Any) -> Any:
    return {
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "uid-chat", **meta},
        "spec": {
            "modelRef": {"name": "m"},
            "scaling": {"autoscaler": autoscaler, "maxReplicas": max_replicas},
        },
    }


def kamas_scaled_object(owner_uid: str = "uid-chat") -> dict[str, Any]:
    owner = {"kind": "ModelDeployment", "name": "chat", "uid": owner_uid, "controller": True}
    return {"metadata": {"name": "chat", "uid": "so-1", "ownerReferences": [owner]}}


def activities(custom: FakeCustom) -> KedaActivities:
    found = KedaActivities(api=k8s.ApiClient(), scaler_address="gateway:9091")
    found.custom = cast(Any, custom)
    return found


def test_a_scaled_object_is_built_from_the_live_spec_not_the_input() -> None:
    custom = FakeCustom(deployment=live_deployment(max_replicas=3), scaled=None)
    forged = {"modelRef": {"name": "m"}, "scaling": {"autoscaler": "KEDA", "maxReplicas": 1000}}
    activities(custom).apply_scaled_object(ScaledObjectRequest(ref=REF, spec=forged))
    assert [body["spec"]["maxReplicaCount"] for body in custom.applied] == [3]
    custom = FakeCustom(deployment=live_deployment(autoscaler="Kama"), scaled=None)
    activities(custom).apply_scaled_object(ScaledObjectRequest(ref=REF, spec=forged))
    assert custom.applied == [], "a deployment that does not ask for KEDA gets none"


def test_a_scaled_object_is_deleted_only_when_it_is_kamas_and_no_longer_wanted() -> None:
    in_keda = FakeCustom(deployment=live_deployment(), scaled=kamas_scaled_object())
    activities(in_keda).delete_scaled_object(REF)
    assert in_keda.deleted == [], "the live deployment still asks for KEDA"
    someone_elses = FakeCustom(
        deployment=live_deployment(autoscaler="Kama"), scaled=kamas_scaled_object("other-uid")
    )
    activities(someone_elses).delete_scaled_object(REF)
    assert someone_elses.deleted == []
    for deployment in (
        live_deployment(autoscaler="Kama"),
        live_deployment(deletionTimestamp="2026-12-06T00:00:00Z"),
        None,
    ):
        left = FakeCustom(deployment=deployment, scaled=kamas_scaled_object())
        activities(left).delete_scaled_object(REF)
        assert left.deleted == [{"preconditions": {"uid": "so-1"}}], deployment


def test_a_forged_uid_is_refused() -> None:
    custom = FakeCustom(deployment=live_deployment(autoscaler="Kama"), scaled=kamas_scaled_object())
    forged = ObjectRef(namespace="team-a", name="chat", uid="guessed")
    with pytest.raises(ForgedRequest):
        activities(custom).delete_scaled_object(forged)
    assert custom.deleted == []
