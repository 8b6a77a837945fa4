"""The `Start importer pod` activity's part beyond building the pod (which
`test_importer_pod` covers): what the pod mounts comes from the live ModelArtifact,
never from the activity's input; a forged uid or an artifact without a cache is
refused; every pod gets a token of its own; a pod that exists already is as good."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client import ApiException

from activities.importer_pods import ImporterPod, ImporterPodActivities, PodRef
from activities.provenance import ForgedRequest
from kama.contracts import ARTIFACTS, CACHES, ObjectRef
from kama.importer_pod import ImporterTemplate, importer_pod_name
from kama.importer_protocol import TOKEN_ENV

REF = ObjectRef(namespace="team-a", name="llama", uid="u-1")


@dataclass
class FakeCustom:
    """The artifact and its cache, as the API server returns them."""

    artifact_spec: dict[str, Any]

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any]:
        if plural == ARTIFACTS:
            return {"metadata": {"uid": REF.uid}, "spec": self.artifact_spec}
        assert plural == CACHES and name == "models"
        return {"spec": {"persistentVolumeClaim": {"claimName": "shared-models"}}}


@dataclass
class FakeCore:
    """What was created; `exists`: the API server answers 409 (the pod is there)."""

    exists: bool = False
    created: list[dict[str, Any]] = field(default_factory=list)

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> None:
        if self.exists:
            raise ApiException(status=409, reason="AlreadyExists")
        self.created.append(body)


def activities(spec: dict[str, Any], core: FakeCore) -> ImporterPodActivities:
    found = ImporterPodActivities(api=k8s.ApiClient(), importer=ImporterTemplate(image="kama:dev"))
    found.custom, found.core = FakeCustom(spec), core
    return found


SPEC = {
    "cacheRef": {"name": "models"},
    "source": {"huggingFace": {"repo": "acme/llama", "tokenSecretRef": {"name": "hf", "key": "t"}}},
}


def test_the_pod_mounts_the_claims_and_secret_of_the_live_artifact() -> None:
    core = FakeCore()
    request = ImporterPod(ref=REF, operation_id="op-1", mount_token=True)
    found = activities(SPEC, core).ensure_importer_pod(request)
    assert found == PodRef(namespace=REF.namespace, name=importer_pod_name(REF.name, "op-1"))
    [pod] = core.created
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["cache"]["persistentVolumeClaim"] == {"claimName": "shared-models"}
    assert volumes["hf-token"]["secret"]["secretName"] == "hf"
    assert "source" not in volumes, "the spec names no source claim"


def test_each_pod_gets_a_new_token() -> None:
    core = FakeCore()
    for operation in ("op-1", "op-2"):
        activities(SPEC, core).ensure_importer_pod(ImporterPod(ref=REF, operation_id=operation))
    tokens = [
        {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}[TOKEN_ENV]
        for pod in core.created
    ]
    assert len(set(tokens)) == 2 and all(len(token) >= 40 for token in tokens)


def test_a_pod_that_exists_already_is_as_good() -> None:
    request = ImporterPod(ref=REF, operation_id="op-1")
    found = activities(SPEC, FakeCore(exists=True)).ensure_importer_pod(request)
    assert found.name == importer_pod_name(REF.name, "op-1")


@pytest.mark.parametrize(
    ("ref", "spec", "refused"),
    [
        (ObjectRef(namespace="team-a", name="llama", uid="other"), SPEC, "has uid u-1"),
        (REF, {"source": SPEC["source"]}, "names no cache"),
    ],
)
def test_a_forged_uid_or_an_artifact_without_a_cache_is_refused(
    ref: ObjectRef, spec: dict[str, Any], refused: str
) -> None:
    core = FakeCore()
    with pytest.raises(ForgedRequest, match=refused):
        activities(spec, core).ensure_importer_pod(ImporterPod(ref=ref, operation_id="op-1"))
    assert not core.created
