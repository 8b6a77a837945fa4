"""`Delete cache claim` acts on what the live cluster says: whoever reaches Kama's
Temporal namespace can schedule it, naming any cache (issue #41: a forged task deleted
cache claims). The claim goes only while its live ModelCache is being deleted with
`retentionPolicy: Delete`, and only if Kama created it."""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client as k8s

from activities.claims import CREATED_BY, CacheRequest, ClaimActivities, cache_claim_name

REQUEST = CacheRequest(namespace="team-a", name="models")


class FakeCustom:
    def __init__(self, cache: dict[str, Any] | None) -> None:
        self.cache = cache

    def get_namespaced_custom_object(self, *_args: Any) -> Any:
        if self.cache is None:
            raise k8s.ApiException(status=404, reason="Not Found")
        return self.cache


class FakeCore:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    def read_namespaced_persistent_volume_claim(self, name: str, _ns: str) -> Any:
        return k8s.V1PersistentVolumeClaim(
            metadata=k8s.V1ObjectMeta(name=name, annotations={CREATED_BY: "kama"})
        )

    def delete_namespaced_persistent_volume_claim(self, name: str, _ns: str) -> None:
        self.deleted.append(name)


def cache(*, deleting: bool, policy: str = "Delete") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "models", "namespace": "team-a", "uid": "c-1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"claimTemplate": {"size": "1Gi"}, "retentionPolicy": policy},
    }


def deleted(live: dict[str, Any] | None) -> list[str]:
    activities = ClaimActivities(api=k8s.ApiClient())
    core = FakeCore()
    activities.custom, activities.core = cast(Any, FakeCustom(live)), cast(Any, core)
    activities.delete_cache_claim(REQUEST)
    return core.deleted


def test_a_cache_claim_goes_only_with_its_cache_and_its_policy() -> None:
    assert deleted(cache(deleting=True)) == [cache_claim_name("models")]
    assert deleted(cache(deleting=False)) == [], "a cache in use keeps its claim"
    assert deleted(cache(deleting=True, policy="Retain")) == [], "Retain keeps it"
    assert deleted(None) == [], "no cache: nothing to go with"
