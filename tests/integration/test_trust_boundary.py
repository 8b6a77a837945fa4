"""Anyone who reaches Kama's Temporal namespace gains nothing (#25): a client with no
Kubernetes right at all starts a workflow of its own that schedules Kama's
activities on Kama's control queue, with inputs of its choosing, against the real
worker and API server. Every forged task fails at once (non-retryable), naming what
did not match, and nothing is created or removed.

Before the fix the same `Create serving pod` task took a whole Pod manifest: the
worker created a pod with a `hostPath: /` volume in any namespace."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from kama.serving_plan import ServingPlan
from kama.serving_pod import ServingTemplate
from kamadev.stack import SHELL_IMAGE
from tests.conftest import KamaControl
from tests.integration.forged_task_workflow import ForgedTask, ForgedTaskWorkflow
from tests.integration.test_serving_plane import deployment
from tests.support import apply, get_json, kubectl

pytestmark = pytest.mark.stack

HOSTILE_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "owned", "namespace": "kube-system"},
    "spec": {
        "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1d"]}],
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    },
}


async def forge(control: KamaControl, activity: str, argument: dict[str, Any]) -> BaseException:
    """Run `activity` on Kama's control queue as an attacker's workflow would; the
    failure the attacker gets back."""
    client = await Client.connect(control.stack.temporal.address)
    queue = f"attacker-{uuid.uuid4().hex[:8]}"
    task = ForgedTask(
        activity=activity, argument=argument, task_queue=control.env["KAMA_CONTROL_QUEUE"]
    )
    async with Worker(client, task_queue=queue, workflows=[ForgedTaskWorkflow]):
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                ForgedTaskWorkflow.run, task, id=f"forged-{uuid.uuid4().hex}", task_queue=queue
            )
    cause = failed.value.cause
    assert isinstance(cause, ActivityError), cause
    assert cause.cause is not None
    return cause.cause


def template(*, image: str, **fields: Any) -> dict[str, Any]:
    plan = ServingPlan(entrypoint="m.gguf", manifest_digest="0" * 64, ctx_total=512, concurrency=1)
    shaped = ServingTemplate(
        image=image,
        plan=plan,
        claim_name="models",
        sub_path=f"blobs/sha256/{'0' * 64}",
        cpu_request="100m",
        memory_request="64Mi",
        **fields,
    )
    return asdict(shaped)


def victim(control: KamaControl, namespace: str) -> dict[str, Any]:
    apply(control.stack, deployment(namespace, "victim", "absent-artifact", replicas=0))
    found: dict[str, Any] = get_json(control.stack, "modeldeployment", "victim", "-n", namespace)
    return found


def typed(failure: BaseException, kind: str) -> str:
    assert isinstance(failure, ApplicationError), failure
    assert failure.type == kind, failure
    assert failure.non_retryable, failure
    return failure.message


async def test_a_forged_serving_pod_task_creates_nothing(
    kama_control: KamaControl, namespace: str
) -> None:
    control = kama_control
    uid = victim(control, namespace)["metadata"]["uid"]
    runtime_image = control.env["KAMA_RUNTIME_IMAGE"]
    ref = {"namespace": namespace, "name": "victim", "uid": uid}

    # the attack of the issue: a manifest of the attacker's choosing
    failure = await forge(control, "Create serving pod", {"manifest": HOSTILE_POD})
    assert "ref" in str(failure) or "template" in str(failure), failure

    message = typed(
        await forge(
            control,
            "Create serving pod",
            {
                "ref": {**ref, "uid": "forged"},
                "template": template(image=runtime_image),
                "ordinal": 0,
            },
        ),
        "ForgedRequest",
    )
    assert "forged" in message and uid in message

    message = typed(
        await forge(
            control,
            "Create serving pod",
            {"ref": ref, "template": template(image="busybox"), "ordinal": 0},
        ),
        "ForgedRequest",
    )
    assert "busybox" in message and runtime_image in message

    control_plane = [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]
    message = typed(
        await forge(
            control,
            "Create serving pod",
            {
                "ref": ref,
                "template": template(image=runtime_image, tolerations=control_plane),
                "ordinal": 0,
            },
        ),
        "PlacementNotAllowed",
    )
    assert "node-role.kubernetes.io/control-plane" in message

    for where in (namespace, "kube-system"):
        pods = get_json(control.stack, "pods", "-n", where)["items"]
        assert not [p for p in pods if p["metadata"]["name"] in ("owned", "victim")], pods
        assert not [p for p in pods if "victim" in p["metadata"]["name"]], pods


async def test_forged_tasks_touch_no_pod_that_is_not_kamas(
    kama_control: KamaControl, namespace: str
) -> None:
    control = kama_control
    kubectl(
        control.stack,
        "run",
        "bystander",
        "-n",
        namespace,
        f"--image={SHELL_IMAGE}",
        "--image-pull-policy=Never",
        "--restart=Never",
        "--command",
        "--",
        "sleep",
        "3600",
    )
    pod = {"namespace": namespace, "name": "bystander"}
    for activity in ("Delete serving pod", "Mark pod draining", "Delete pod"):
        message = typed(await forge(control, activity, pod), "ForgedRequest")
        assert "bystander" in message and "not a Kama" in message
    message = typed(
        await forge(control, "Count busy slots", {**pod, "pod": "bystander"}), "ForgedRequest"
    )
    assert "bystander" in message
    found = get_json(control.stack, "pod", "bystander", "-n", namespace)
    assert not found["metadata"].get("deletionTimestamp")
    assert "kama.dev/draining" not in (found["metadata"].get("labels") or {})


async def test_a_forged_importer_task_starts_no_importer(
    kama_control: KamaControl, namespace: str
) -> None:
    control = kama_control
    apply(
        control.stack,
        {
            "apiVersion": "kama.dev/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": "art", "namespace": namespace},
            "spec": {
                "source": {
                    "huggingFace": {"repo": "acme/none", "revision": "0" * 40, "files": ["m.gguf"]}
                },
                "cacheRef": {"name": "absent-cache"},
            },
        },
    )
    ref = {"namespace": namespace, "name": "art", "uid": "forged"}
    message = typed(
        await forge(control, "Start importer pod", {"ref": ref, "operation_id": "x-g1-a1"}),
        "ForgedRequest",
    )
    assert "forged" in message
    pods = get_json(control.stack, "pods", "-n", namespace, "-l", "kama.dev/operation=x-g1-a1")
    assert pods["items"] == []
