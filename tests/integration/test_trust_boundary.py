"""Anyone who reaches Kama's Temporal namespace gains nothing (#25, #41).

An attacker with no Kubernetes right at all starts a workflow of its own that
schedules Kama's activities on Kama's control queue, with inputs of its choosing,
against the real worker and API server: the worker runs no activity for a workflow
that is not one of its own types on its own queue (`activities.workflow_provenance`),
so every forged task fails at once (non-retryable) and nothing is written
(`test_an_attackers_workflow_has_no_activity_of_kamas_run`). Behind that fence each
activity still checks what it acts on against the cluster: those checks run here
in-process with the worker's own settings against the real API server (`forge`), as a
task would run if it got past the fence.

Before #25 the same `Create serving pod` task took a whole Pod manifest: the worker
created a pod with a `hostPath: /` volume in any namespace. Before #41 a forged `Write
status` with the uid Temporal lists set FitFailed on another tenant's deployment."""

from __future__ import annotations

import inspect
import json
import secrets
import time
import uuid
from dataclasses import asdict
from typing import Any

import httpx
import pytest
from temporalio import activity as temporal_activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.converter import DataConverter
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from kama.api import FINALIZER
from kama.config import Settings
from kama.contracts import SPEC_CHANGED, STATUS_QUERY
from kama.serving_plan import ServingPlan
from kama.serving_pod import ServingTemplate
from kamactl.worker import control_activities
from kamadev.stack import SHELL_IMAGE
from tests.conftest import GatewayProcess, KamaControl, fresh_namespace
from tests.integration.forged_task_workflow import ForgedTask, ForgedTaskWorkflow
from tests.integration.test_real_nodes import logs, python_pod, terminated
from tests.integration.test_serving_plane import deployment
from tests.support import access_key, apply, eventually, get_json, kubectl

HOSTILE_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "owned", "namespace": "kube-system"},
    "spec": {
        "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1d"]}],
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    },
}


async def forge_over_temporal(
    control: KamaControl, activity: str, argument: dict[str, Any]
) -> BaseException:
    """Schedule `activity` on Kama's control queue from an attacker's own workflow;
    the failure the attacker gets back."""
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


async def forge(
    control: KamaControl, activity_name: str, argument: dict[str, Any]
) -> BaseException:
    """Run `activity_name` with this input as the worker would if the task got past
    the provenance fence: in-process, built as the worker builds it (its settings, the
    stack's API server), its input decoded by Temporal's converter; the failure."""
    client = await Client.connect(control.stack.temporal.address)
    found = {
        temporal_activity._Definition.must_from_callable(fn).name: fn
        for fn in control_activities(
            settings=Settings.from_env(control.env), api=control.stack.api_client(), client=client
        )
    }
    fn = found[activity_name]
    converter = DataConverter.default.payload_converter
    types = temporal_activity._Definition.must_from_callable(fn).arg_types
    args = converter.from_payloads(converter.to_payloads([argument]), types)
    try:
        result = ActivityEnvironment().run(fn, *args)
        if inspect.isawaitable(result):
            await result
    except Exception as exc:
        return exc
    raise AssertionError(f"the forged {activity_name} task succeeded")


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


def artifact_without_cache(namespace: str, name: str) -> dict[str, Any]:
    """A ModelArtifact that never imports (its cache does not exist): nothing of
    Kama's own makes an importer pod for it."""
    return {
        "apiVersion": "kama.dev/v1alpha1",
        "kind": "ModelArtifact",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "source": {
                "huggingFace": {"repo": "acme/none", "revision": "0" * 40, "files": ["m.gguf"]}
            },
            "cacheRef": {"name": "absent-cache"},
        },
    }


def typed(failure: BaseException, kind: str) -> str:
    assert isinstance(failure, ApplicationError), failure
    assert failure.type == kind, failure
    assert failure.non_retryable, failure
    return failure.message


async def test_an_attackers_workflow_has_no_activity_of_kamas_run(
    kama_control: KamaControl, namespace: str
) -> None:
    """The #41 attack, with what a Temporal client can learn: the victim's real uid
    (Temporal lists it in workflow ids) and a valid template. Every task is refused
    before it runs, naming the attacker's workflow, and nothing is written."""
    control = kama_control
    uid = victim(control, namespace)["metadata"]["uid"]
    ref = {"namespace": namespace, "name": "victim", "uid": uid}
    fit_failed = {"type": "FitFailed", "status": "True", "reason": "Forged", "message": "x",
                  "lastTransitionTime": "2026-12-06T00:00:00Z", "observedGeneration": 1}  # fmt: skip
    tasks: dict[str, dict[str, Any]] = {
        "Write status": {"kind_plural": "modeldeployments", "ref": ref,
                         "status": {"conditions": [fit_failed]}},
        "Record event": {"kind": "ModelDeployment", "type": "Warning", "reason": "Forged",
                         "message": "x", "ref": {**ref, "namespace": "kube-system"}},
        "Create serving pod": {"ref": ref, "ordinal": 0,
                               "template": template(image=control.env["KAMA_RUNTIME_IMAGE"])},
        "Delete KEDA ScaledObject": ref,
        "Delete cache claim": {"namespace": namespace, "name": "models"},
    }  # fmt: skip
    for name, argument in tasks.items():
        message = typed(await forge_over_temporal(control, name, argument), "ForgedRequest")
        assert "'Forged task', which is not one of Kama's" in message, (name, message)
    found = get_json(control.stack, "modeldeployment", "victim", "-n", namespace)
    conditions = (found.get("status") or {}).get("conditions") or []
    assert not [c for c in conditions if c.get("reason") == "Forged"], conditions
    events = get_json(control.stack, "events", "-n", "kube-system")["items"]
    assert not [e for e in events if e.get("reason") == "Forged"]
    assert get_json(control.stack, "pods", "-n", namespace)["items"] == []


async def entity_workflow_id(client: Client, *, namespace: str, name: str) -> str:
    """The ID of a resource's entity workflow, as an attacker finds it: in Temporal's
    list of running workflows."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        async for found in client.list_workflows("ExecutionStatus = 'Running'"):
            if f"/{namespace}/{name}/" in found.id and found.id.startswith("deployment/"):
                return found.id
        time.sleep(0.5)
    raise AssertionError(f"no running workflow for {namespace}/{name} in Temporal's list")


async def test_kamas_own_workflows_signalled_or_started_by_an_attacker_change_nothing(
    kama_control: KamaControl, namespace: str
) -> None:
    """Item 7 of #41 with Kama's own workflow types: a `spec changed` signal with a
    forged spec and deletion sent to the victim's real workflow (its ID from
    Temporal's list), the victim's deployment workflow started again under another
    ID, and a rollout of it started with a valid template. The signal is only a hint
    (the workflow reads the resource and keeps its real generation and finalizer);
    both starts fail at once, non-retryably, before any of Kama's code acts."""
    control = kama_control
    found = victim(control, namespace)
    uid = found["metadata"]["uid"]
    client = await Client.connect(control.stack.temporal.address)
    workflow_id = await entity_workflow_id(client, namespace=namespace, name="victim")
    assert uid in workflow_id, workflow_id
    handle = client.get_workflow_handle(workflow_id)
    ref = {"namespace": namespace, "name": "victim", "uid": uid,
           "cluster": control.env.get("KAMA_CLUSTER", "")}  # fmt: skip
    forged_spec = {**found["spec"], "replicas": 3}
    await handle.signal(SPEC_CHANGED, {"ref": ref, "generation": 99, "spec": forged_spec})
    await handle.signal(
        SPEC_CHANGED, {"ref": ref, "generation": 100, "spec": forged_spec, "deleting": True}
    )

    async def confirmed() -> dict[str, Any]:
        answer: dict[str, Any] = await handle.query(STATUS_QUERY, result_type=dict)
        return answer

    deadline = time.monotonic() + 60
    answer = await confirmed()
    while (
        answer.get("generation") != found["metadata"]["generation"] and time.monotonic() < deadline
    ):
        time.sleep(0.5)
        answer = await confirmed()
    assert answer.get("generation") == found["metadata"]["generation"], answer
    after = get_json(control.stack, "modeldeployment", "victim", "-n", namespace)
    assert FINALIZER in (after["metadata"].get("finalizers") or []), after["metadata"]
    assert after["spec"]["replicas"] == found["spec"]["replicas"]
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING

    queue = control.env["KAMA_CONTROL_QUEUE"]
    snapshot = {"ref": ref, "generation": 1, "spec": forged_spec}
    rollout = {"ref": ref, "template": template(image=control.env["KAMA_RUNTIME_IMAGE"]),
               "desired": 3, "next_ordinal": 0, "deadline_s": 60}  # fmt: skip
    starts = [("Keep model deployment", {"snapshot": snapshot}, "is not the one for"),
              ("Roll out model deployment", rollout, "only as a child of")]  # fmt: skip
    for workflow_type, argument, said in starts:
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                workflow_type, argument, id=f"attackers-{uuid.uuid4().hex[:8]}", task_queue=queue
            )
        message = typed(failed.value.cause, "ForgedRequest")
        assert said in message, (workflow_type, message)
    assert get_json(control.stack, "pods", "-n", namespace)["items"] == []


async def test_a_forged_serving_pod_task_creates_nothing(
    kama_control: KamaControl, namespace: str
) -> None:
    control = kama_control
    uid = victim(control, namespace)["metadata"]["uid"]
    runtime_image = control.env["KAMA_RUNTIME_IMAGE"]
    ref = {"namespace": namespace, "name": "victim", "uid": uid}

    # the attack of the issue: a manifest of the attacker's choosing
    failure = await forge_over_temporal(control, "Create serving pod", {"manifest": HOSTILE_POD})
    assert isinstance(failure, ApplicationError), failure
    assert "decoding arguments" in failure.message, failure  # not a CreatePod at all

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
    for name in ("Delete serving pod", "Mark pod draining", "Delete pod"):
        message = typed(await forge(control, name, pod), "ForgedRequest")
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
    apply(control.stack, artifact_without_cache(namespace, "art"))
    ref = {"namespace": namespace, "name": "art", "uid": "forged"}
    message = typed(
        await forge(control, "Start importer pod", {"ref": ref, "operation_id": "x-g1-a1"}),
        "ForgedRequest",
    )
    assert "forged" in message
    pods = get_json(control.stack, "pods", "-n", namespace, "-l", "kama.dev/operation=x-g1-a1")
    assert pods["items"] == []


def test_a_status_with_forged_gguf_facts_is_refused_by_the_api_server(
    kama_control: KamaControl, namespace: str
) -> None:
    """3e8 layers in an artifact's status once got the shared worker OOMKilled while it
    planned, and again on every replay. Whoever may write the status now meets the
    CRD's bounds (kama.api.gguf_bounds): the API server refuses the patch, naming the
    field, and nothing reaches a workflow."""
    control = kama_control
    apply(control.stack, artifact_without_cache(namespace, "forged-facts"))
    for fact, value in (("layers", 300_000_000), ("vocabSize", 1 << 40), ("contextLength", -1)):
        patch = json.dumps({"status": {"gguf": {fact: value}}})
        refused = kubectl(control.stack, "patch", "modelartifact", "forged-facts", "-n", namespace,
                          "--subresource=status", "--type=merge", "-p", patch, check=False)  # fmt: skip
        assert refused.returncode != 0, f"a status with {fact}={value} was accepted"
        assert f"status.gguf.{fact}" in refused.stderr, refused.stderr
    found = get_json(control.stack, "modelartifact", "forged-facts", "-n", namespace)
    assert "gguf" not in (found.get("status") or {})


def test_a_tenants_key_neither_lists_nor_reaches_nor_wakes_another_namespaces_model(
    kama_control: KamaControl, keyed_gateway: GatewayProcess, namespace: str
) -> None:
    control = kama_control
    victim(control, namespace)  # a model at zero replicas
    attacker_namespace = next(fresh_namespace(control.stack, prefix="attacker"))
    try:
        own = access_key(control.stack, namespace, name=f"key-{secrets.token_hex(3)}")
        attackers = access_key(
            control.stack, attacker_namespace, name=f"key-{secrets.token_hex(3)}"
        )
        model = f"{namespace}/victim"

        def listed(key: str) -> tuple[list[str]] | None:
            """The models the key lists, once the gateway knows the key."""
            reply = httpx.get(
                f"{keyed_gateway.url}/v1/models", headers={"authorization": f"Bearer {key}"}
            )
            if reply.status_code == 401:
                return None  # the key's watch event is still on its way
            return ([m["id"] for m in reply.json()["data"]],)

        (mine,) = eventually(lambda: listed(own), timeout=30, what="the tenant's key")
        assert model in mine
        (theirs,) = eventually(lambda: listed(attackers), timeout=30, what="the other key")
        assert theirs == [], theirs

        chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        anonymous = httpx.post(f"{keyed_gateway.url}/v1/chat/completions", json=chat)
        assert anonymous.status_code == 401 and anonymous.json()["error"]["code"]
        crossing = httpx.post(
            f"{keyed_gateway.url}/v1/chat/completions",
            json=chat,
            headers={"authorization": f"Bearer {attackers}"},
        )
        assert crossing.status_code == 404, crossing.text
        assert crossing.json()["error"]["code"] == "model_not_found"
        plain = httpx.post(
            f"{keyed_gateway.url}/v1/chat/completions",
            content=json.dumps(chat),
            headers={"authorization": f"Bearer {own}", "content-type": "text/plain"},
        )
        assert plain.status_code == 415, plain.text
        time.sleep(2)  # a wake would have set spec.replicas by now
        found = get_json(control.stack, "modeldeployment", "victim", "-n", namespace)
        assert found["spec"].get("replicas", 0) == 0, "the attacker's request woke the model"
    finally:
        kubectl(control.stack, "delete", "namespace", attacker_namespace, "--wait=false")


def test_a_copied_key_hash_is_no_key_and_both_objects_are_warned(
    kama_control: KamaControl, keyed_gateway: GatewayProcess, namespace: str
) -> None:
    """Another tenant copies a key's hash into its own ModelAccessKey: the key names
    its object, so the copy grants nothing, and while two objects hold the hash the
    key is refused and the gateway records a DuplicateKeyHash Event on each."""
    control = kama_control
    copier = next(fresh_namespace(control.stack, prefix="copier"))
    try:
        name = f"key-{secrets.token_hex(3)}"
        own = access_key(control.stack, namespace, name=name)
        mine = get_json(control.stack, "modelaccesskey", name, "-n", namespace)

        def models(key: str) -> int:
            url = f"{keyed_gateway.url}/v1/models"
            return httpx.get(url, headers={"authorization": f"Bearer {key}"}).status_code

        eventually(lambda: models(own) == 200, timeout=30, what="the tenant's key to work")
        copy = {
            "apiVersion": "kama.dev/v1alpha1",
            "kind": "ModelAccessKey",
            "metadata": {"name": "copy", "namespace": copier},
            "spec": {"keySHA256": mine["spec"]["keySHA256"]},
        }
        apply(control.stack, copy)
        eventually(lambda: models(own) == 401, timeout=30, what="the shared key refused")

        def warned(where: str, obj: str) -> bool:
            events = get_json(
                control.stack, "events", "-n", where,
                "--field-selector", f"involvedObject.name={obj},reason=DuplicateKeyHash",
            )  # fmt: skip
            return any(e["type"] == "Warning" for e in events["items"])

        eventually(lambda: warned(namespace, name), timeout=30, what="the owner's Event")
        eventually(lambda: warned(copier, "copy"), timeout=30, what="the copier's Event")
        kubectl(control.stack, "delete", "modelaccesskey", "copy", "-n", copier)
        eventually(lambda: models(own) == 200, timeout=30, what="the key to work again")
    finally:
        kubectl(control.stack, "delete", "namespace", copier, "--wait=false")


ATTACKER_SCRIPT = """
import asyncio, json, os, uuid
from datetime import timedelta
import httpx
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount"
API = "https://" + os.environ["KUBERNETES_SERVICE_HOST"] + ":" + os.environ["KUBERNETES_SERVICE_PORT"]

def read(namespace, name):
    headers = {"authorization": "Bearer " + open(TOKEN + "/token").read()}
    url = API + "/api/v1/namespaces/" + namespace + "/secrets/" + name
    return httpx.get(url, headers=headers, verify=TOKEN + "/ca.crt").status_code

@workflow.defn(name="Attack")
class Attack:
    @workflow.run
    async def run(self, task: dict) -> str:
        try:
            await workflow.execute_activity(
                task["activity"], task["argument"], task_queue=task["queue"],
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=1))
        except Exception as error:
            cause = error.cause
            return "refused " + str(getattr(cause, "type", None)) + " " + str(cause)
        return "succeeded"

async def main():
    print("own secret", read(os.environ["OWN_NAMESPACE"], "own-token"), flush=True)
    print("other secret", read(os.environ["VICTIM_NAMESPACE"], "victim-token"), flush=True)
    client = await Client.connect(os.environ["TEMPORAL"])
    queue = "attacker-" + uuid.uuid4().hex[:6]
    async with Worker(client, task_queue=queue, workflows=[Attack],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        for name, activity, argument in json.loads(os.environ["TASKS"]):
            result = await client.execute_workflow(
                Attack.run, {"activity": activity, "argument": argument,
                             "queue": os.environ["CONTROL_QUEUE"]},
                id="attack-" + uuid.uuid4().hex, task_queue=queue)
            print(name, result, flush=True)

asyncio.run(main())
# the Temporal bridge's threads may still call into Python while the interpreter
# finalizes (a SIGSEGV at exit now and then): every answer is printed, leave at once
os._exit(0)
"""


def test_a_tenant_pod_with_every_right_at_home_gains_nothing_elsewhere(
    kama_control: KamaControl, namespace: str
) -> None:
    """The issue's attacker: a pod in a tenant namespace whose ServiceAccount may do
    anything there (pods, Secrets, Kama resources). It reads its own Secret; another
    namespace's Secret is refused; through Kama's Temporal it tries to make the worker
    create a hostPath pod in the victim's namespace, a pod for the victim's deployment,
    and an importer for the victim's artifact: each is refused."""
    control = kama_control
    tenant = next(fresh_namespace(control.stack, prefix="tenant"))
    try:
        victim(control, namespace)
        apply(control.stack, artifact_without_cache(namespace, "art"))
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque"}
        apply(
            control.stack,
            {**secret, "metadata": {"name": "victim-token", "namespace": namespace}},
            {**secret, "metadata": {"name": "own-token", "namespace": tenant}},
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "owner", "namespace": tenant}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "everything", "namespace": tenant},
             "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "everything", "namespace": tenant},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                         "name": "everything"},
             "subjects": [{"kind": "ServiceAccount", "name": "owner", "namespace": tenant}]},
        )  # fmt: skip
        runtime_image = control.env["KAMA_RUNTIME_IMAGE"]
        tasks = [
            ("hostpath", "Create serving pod", {"manifest": {**HOSTILE_POD, "metadata": {
                "name": "owned", "namespace": namespace}}}),
            ("deployment", "Create serving pod", {
                "ref": {"namespace": namespace, "name": "victim", "uid": "guessed"},
                "template": template(image=runtime_image), "ordinal": 0}),
            ("importer", "Start importer pod", {
                "ref": {"namespace": namespace, "name": "art", "uid": "guessed"},
                "operation_id": "x-g1-a1"}),
        ]  # fmt: skip
        pod = python_pod("attacker", tenant, ATTACKER_SCRIPT)
        pod["spec"]["containers"][0]["command"][0] = "/opt/kama/bin/python"
        pod["spec"]["serviceAccountName"] = "owner"
        pod["spec"]["containers"][0]["env"] = [
            {"name": "OWN_NAMESPACE", "value": tenant},
            {"name": "VICTIM_NAMESPACE", "value": namespace},
            {"name": "TEMPORAL", "value": control.stack.temporal_for_pods},
            {"name": "CONTROL_QUEUE", "value": control.env["KAMA_CONTROL_QUEUE"]},
            {"name": "TASKS", "value": json.dumps(tasks)},
        ]
        apply(control.stack, pod)
        state = terminated(control.stack, tenant, "attacker")
        out = logs(control.stack, tenant, "attacker")
        assert state["exitCode"] == 0, out
        lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        assert "own secret 200" in out, out  # every right at home
        assert "other secret 403" in out, out
        assert lines["hostpath"].startswith("refused"), out
        assert lines["deployment"].startswith("refused ForgedRequest"), out
        assert "not one of Kama's" in lines["deployment"], out
        assert lines["importer"].startswith("refused ForgedRequest"), out
        pods = get_json(control.stack, "pods", "-n", namespace)["items"]
        assert pods == [], [p["metadata"]["name"] for p in pods]
    finally:
        kubectl(control.stack, "delete", "namespace", tenant, "--wait=false")
