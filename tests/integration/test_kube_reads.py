"""The tests' cluster reads through the Python client (tests/kube_reads.py) answer what
`kubectl get -o json` answers, on the live stack: the same objects, kinds and
apiVersions, a List for lists, one object for one name, and kubectl's NotFound."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kamadev.stack import LocalStack
from tests.integration.test_artifact_plane import cache
from tests.kube_reads import get_via_client
from tests.support import apply, kubectl


def identities(answer: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    items = answer["items"] if answer["kind"] == "List" else [answer]
    return sorted(
        (i["apiVersion"], i["kind"], i["metadata"].get("namespace", ""), i["metadata"]["name"])
        for i in items
    )


def test_client_reads_answer_as_kubectl_does(crds: LocalStack, namespace: str) -> None:
    stack = crds
    apply(stack, cache(namespace))
    queries = [
        ("nodes",),
        ("pods", "-n", "kube-system"),
        ("pods", "-A", "-l", "k8s-app=kube-dns"),
        ("crd", "modeldeployments.kama.dev"),
        ("mc", "models", "-n", namespace),
        ("modelcache/models", "-n", namespace),
        ("modeldeployments,modelcaches", "-n", namespace),
        ("events", "-n", "default"),
        ("serviceaccount", "default", "-n", namespace),
    ]
    for args in queries:
        through_client = get_via_client(stack, args)
        assert through_client is not None, f"{args} was left to kubectl"
        by_kubectl = json.loads(kubectl(stack, "get", *args, "-o", "json").stdout)
        assert through_client["kind"] == by_kubectl["kind"], args
        assert identities(through_client) == identities(by_kubectl), args
        assert identities(by_kubectl), f"{args}: nothing to compare"
    with pytest.raises(AssertionError, match=r'NotFound\): modeldeployments "nope" not found'):
        get_via_client(stack, ("md", "nope", "-n", namespace))
    missing = kubectl(stack, "get", "md", "nope", "-n", namespace, check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr
