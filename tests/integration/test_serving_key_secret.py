"""The serving master key's Secret as the worker keeps it (`kamactl.serving_key_secret`)
against the real API server: created once with a random key and read back the same
at every later start (so `helm template` renders nothing that could change it); a
Secret already there (one an earlier chart rendered, or the operator's) adopted as
is; two workers racing on a first start end with one key; the operator's own Secret
never created for them; a Secret without a usable key refused with a clear error."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes import client as k8s

from kamactl.serving_key_secret import (
    GENERATED_BY,
    MAX_KEY_BYTES,
    ServingKeyUnavailable,
    ensure_serving_key,
)
from kamadev.stack import LocalStack


def core_of(stack: LocalStack) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(stack.api_client())


def test_the_key_is_created_once_and_kept(stack: LocalStack, namespace: str) -> None:
    core = core_of(stack)
    first = ensure_serving_key(
        core, namespace=namespace, name="k", field="serving-key", generate=True
    )
    assert len(first) >= 32
    again = ensure_serving_key(
        core, namespace=namespace, name="k", field="serving-key", generate=True
    )
    assert again == first
    secret = core.read_namespaced_secret("k", namespace)
    assert base64.b64decode(secret.data["serving-key"]).decode() == first
    assert (secret.metadata.annotations or {}).get(GENERATED_BY) == "kama-worker"
    assert not secret.metadata.owner_references, "no owner: it outlives uninstalls"


def test_a_secret_already_there_is_adopted(stack: LocalStack, namespace: str) -> None:
    core = core_of(stack)
    rendered = base64.b64encode(b"rendered-by-an-earlier-chart").decode()
    core.create_namespaced_secret(
        namespace,
        k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="old"), data={"serving-key": rendered}),
    )
    found = ensure_serving_key(
        core, namespace=namespace, name="old", field="serving-key", generate=True
    )
    assert found == "rendered-by-an-earlier-chart"


def test_two_workers_starting_at_once_agree_on_one_key(stack: LocalStack, namespace: str) -> None:
    core = core_of(stack)
    with ThreadPoolExecutor(4) as pool:
        keys = list(
            pool.map(
                lambda _: ensure_serving_key(
                    core, namespace=namespace, name="race", field="serving-key", generate=True
                ),
                range(4),
            )
        )
    assert len(set(keys)) == 1, keys


def test_the_operators_secret_is_never_created_and_a_bad_one_is_refused(
    stack: LocalStack, namespace: str
) -> None:
    core = core_of(stack)
    with pytest.raises(ServingKeyUnavailable, match="existingSecret"):
        ensure_serving_key(core, namespace=namespace, name="mine", field="k", generate=False)
    with pytest.raises(k8s.ApiException) as missing:
        core.read_namespaced_secret("mine", namespace)
    assert missing.value.status == 404
    for name, data, said in [
        ("no-field", {"other": "eA=="}, "has no key 'k'"),
        ("too-long", {"k": base64.b64encode(b"x" * (MAX_KEY_BYTES + 1)).decode()}, "over"),
        ("blank", {"k": base64.b64encode(b"  \n").decode()}, "empty"),
    ]:
        core.create_namespaced_secret(
            namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), data=data)
        )
        with pytest.raises(ServingKeyUnavailable, match=said):
            ensure_serving_key(core, namespace=namespace, name=name, field="k", generate=True)
