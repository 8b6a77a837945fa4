"""The serving plane on the local stack: a ModelDeployment becomes placed, ready
llama-server pods (real scheduler, real runtime supervisor, real llama-server) that
stay on the node of its artifact's local volume, says `Ready` (so `kubectl wait
--for=condition=Ready` works), follows `kubectl scale`, rolls out a spec change without
failing a request, replaces a killed server, binds GPU replicas where the planner
said, reports a FitFailed with numbers, and drains its pods on deletion while the
artifact stays."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
from temporalio.client import Client
from temporalio.worker import Replayer

from kama.serving_plan import LLAMA_PORT
from kama.serving_pod import ROLE_LABEL, SERVER_ROLE
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.stack import GPUNode
from tests.conftest import KamaControl
from tests.integration.test_artifact_plane import cache, condition, hf_artifact, wait_condition
from tests.support import apply, events_about, eventually, get_json, kubectl, serving_headers
from workflows.deployment import DeploymentWorkflow
from workflows.drain import DrainWorkflow
from workflows.rollout import RolloutWorkflow

SERVE_TIMEOUT = 180


def deployment(namespace: str, name: str, artifact: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kama.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"modelRef": {"name": artifact}, **spec},
    }


def ready_artifact(
    control: KamaControl,
    namespace: str,
    tmp_path: Path,
    *,
    name: str,
    seed: int,
    n_ctx: int = 4096,
    shared: bool = False,
) -> dict[str, Any]:
    """An imported artifact, in the namespace's cache `models` (a ReadWriteOnce claim:
    a local volume pinned to one node) or, `shared`, in a cache `shared`
    (ReadWriteMany: a volume every node, fake ones included, can mount)."""
    repo = f"acme/serve-{uuid.uuid4().hex[:6]}"
    model = write_model(
        tmp_path / f"{name}.gguf", shape=ModelShape(n_layer=2, n_head_kv=2, n_ctx=n_ctx, seed=seed)
    )
    control.hub.add_repo(repo, {"model.gguf": model})
    pool, artifact = cache(namespace), hf_artifact(namespace, name, repo, ["model.gguf"])
    if shared:
        pool["metadata"]["name"] = artifact["spec"]["cacheRef"]["name"] = "shared"
        pool["spec"]["claimTemplate"]["accessModes"] = ["ReadWriteMany"]
    apply(control.stack, pool, artifact)
    return wait_condition(control, namespace, name, "Ready")


def pinned_node(pod: dict[str, Any]) -> list[str] | None:
    """The node names a serving pod's required node affinity allows, if it names any."""
    affinity = pod["spec"].get("affinity", {}).get("nodeAffinity", {})
    terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {})
    for term in terms.get("nodeSelectorTerms", []):
        for field in term.get("matchFields", []):
            if field["key"] == "metadata.name":
                return list(field["values"])
    return None


def assert_ready(obj: dict[str, Any], status: str, reason: str) -> None:
    ready = condition(obj, "Ready") or {}
    assert (ready.get("status"), ready.get("reason")) == (status, reason), ready


def md(control: KamaControl, namespace: str, name: str) -> dict[str, Any]:
    control.worker.check_alive()
    obj: dict[str, Any] = get_json(control.stack, "modeldeployment", name, "-n", namespace)
    return obj


def wait_md_condition(
    control: KamaControl, namespace: str, name: str, kind: str, status: str = "True"
) -> dict[str, Any]:
    """The ModelDeployment once its condition `kind` has `status`."""

    def check() -> dict[str, Any] | None:
        obj = md(control, namespace, name)
        found = condition(obj, kind)
        return obj if found and found["status"] == status else None

    return eventually(check, timeout=60, what=f"{name} {kind}={status}", interval=0.5)


def serving_pods(control: KamaControl, namespace: str, name: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = get_json(
        control.stack, "pods", "-n", namespace, "-l", f"kama.dev/deployment={name}"
    )["items"]
    return pods


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def routable(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a router may use: ready, not draining, not being deleted."""
    return [
        p
        for p in pods
        if is_ready(p)
        and p["metadata"].get("labels", {}).get("kama.dev/draining") != "true"
        and not p["metadata"].get("deletionTimestamp")
    ]


def wait_ready(control: KamaControl, namespace: str, name: str, replicas: int) -> dict[str, Any]:
    seen: dict[str, Any] = {}  # the last look, to say what was not ready

    def check() -> dict[str, Any] | None:
        obj = md(control, namespace, name)
        status = obj.get("status", {})
        fingerprint = status.get("fingerprint")
        pods = serving_pods(control, namespace, name)
        seen["conditions"] = [
            (c["type"], c["status"], c.get("reason"), c.get("message", "")[:300])
            for c in status.get("conditions", [])
        ]
        seen["pods"] = [(p["metadata"]["name"], p.get("status", {})) for p in pods]
        current = [
            p
            for p in routable(pods)
            if p["metadata"]["labels"]["kama.dev/fingerprint"] == fingerprint
        ]
        ok = (
            status.get("readyReplicas") == replicas
            and len(current) == replicas
            and len(pods) == replicas
            and (condition(obj, "RuntimeReady") or {}).get("status") == "True"
        )
        return obj if ok else None

    try:
        return eventually(
            check, timeout=SERVE_TIMEOUT, what=f"{name} {replicas}/{replicas} ready", interval=0.5
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {json.dumps(seen, default=str)[:4000]}") from None


def chat(pod: dict[str, Any]) -> str:
    """A chat answered by the pod's own llama-server (with the pod's serving key)."""
    key = serving_headers(pod).get("authorization", "Bearer none").removeprefix("Bearer ")
    client = openai.OpenAI(
        base_url=f"http://{pod['status']['podIP']}:{LLAMA_PORT}/v1", api_key=key, max_retries=0
    )
    reply = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    return reply.choices[0].message.content or ""


def llama_server_pid(pod_ip: str) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"llama-server") and pod_ip.encode() in argv:
            return int(entry.name)
    return None


def test_cpu_deployment_serves_scales_rolls_out_and_drains(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    artifact = ready_artifact(control, namespace, tmp_path, name="tiny", seed=61)
    apply(
        control.stack,
        deployment(
            namespace,
            "chat",
            "tiny",
            replicas=1,
            runtime={"contextSize": 512, "concurrency": 2},
            resources={"cpu": "100m"},
            scaling={"maxReplicas": 3, "drainTimeout": "30s"},
        ),
    )
    obj = wait_ready(control, namespace, "chat", 1)
    assert_ready(obj, "True", "AllReplicasReady")
    kubectl(
        control.stack,
        "wait",
        "--for=condition=Ready",
        "modeldeployment/chat",
        "-n",
        namespace,
        "--timeout=30s",
    )
    status = obj["status"]
    assert status["profile"]["mode"] == "CPU" and status["profile"]["estimatedRamBytes"] > 0
    assert status["artifactDigest"] == artifact["status"]["manifestDigest"]
    assert condition(obj, "Placed")["status"] == "True"  # type: ignore[index]
    # placement.mode Auto: CPU is a fallback only where the cluster has a GPU (the
    # fake GPU nodes some tests register); with none, CPU is what Auto asked for
    gpus = any(
        node["status"].get("allocatable", {}).get("nvidia.com/gpu", "0") != "0"
        for node in get_json(control.stack, "nodes")["items"]
    )
    degraded = condition(obj, "Degraded")
    assert degraded and "CPU" in degraded["message"]
    assert (degraded["status"], degraded["reason"]) == (
        ("True", "CPUPlacement") if gpus else ("False", "AsRequested")
    ), degraded
    table = kubectl(control.stack, "get", "modeldeployments", "-n", namespace).stdout
    row = next(line.split() for line in table.splitlines() if line.startswith("chat"))
    assert row[1:7] == ["tiny", "CPU", "1", "3", "1/1", "AllReplicasReady"], table

    (pod,) = serving_pods(control, namespace, "chat")
    # Kama serves every namespace here (the cluster-wide mode): before its first pods
    # the worker fenced this one with the chart's policies (#41)
    fences = {
        p["metadata"]["name"]: p["spec"]
        for p in get_json(control.stack, "networkpolicies", "-n", namespace)["items"]
    }
    assert set(fences) == {"kama-serving-pods", "kama-importer-pods"}, fences
    assert fences["kama-serving-pods"]["podSelector"] == {"matchLabels": {ROLE_LABEL: SERVER_ROLE}}
    assert fences["kama-serving-pods"]["policyTypes"] == ["Ingress", "Egress"]
    assert not fences["kama-serving-pods"].get("egress"), "serving pods reach nothing"
    spec = pod["spec"]
    # the cache is a local ReadWriteOnce volume: the artifact names its node, and the
    # replica is pinned there
    location = artifact["status"]["servingLocation"]
    (term,) = location["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == [spec["nodeName"]]
    assert pinned_node(pod) == [spec["nodeName"]] == [status["profile"]["node"]]
    container = spec["containers"][0]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["volumeMounts"][0]["mountPath"] == "/models"
    assert container["volumeMounts"][0]["readOnly"] is True
    owner = pod["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "ModelDeployment" and owner["uid"] == obj["metadata"]["uid"]
    args = pod["metadata"]["annotations"]["kama.dev/llama-server-args"]
    assert "--ctx-size 1024 --parallel 2" in args and "--fit off" in args
    assert chat(pod)

    # kubectl scale → two ready pods
    kubectl(control.stack, "scale", "modeldeployment", "chat", "-n", namespace, "--replicas=2")
    wait_ready(control, namespace, "chat", 2)
    two = serving_pods(control, namespace, "chat")
    assert {p["spec"]["nodeName"] for p in two} == {spec["nodeName"]}, "one node for the claim"
    assert all(pinned_node(p) == [spec["nodeName"]] for p in two)
    old_fingerprint = md(control, namespace, "chat")["status"]["fingerprint"]

    # a spec change rolls out while a client keeps sending requests to routable pods
    stop = threading.Event()
    outcomes: list[tuple[str, str]] = []

    def client_loop() -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                targets = routable(serving_pods(control, namespace, "chat"))
                if not targets:
                    outcomes.append(("no-endpoint", ""))
                    continue
                pod = targets[len(outcomes) % len(targets)]
                try:
                    r = http.post(
                        f"http://{pod['status']['podIP']}:{LLAMA_PORT}/v1/completions",
                        json={"prompt": "once upon", "max_tokens": 16},
                        headers=serving_headers(pod),
                    )
                    outcomes.append(
                        (str(r.status_code), pod["metadata"]["labels"]["kama.dev/fingerprint"])
                    )
                except httpx.HTTPError as exc:
                    outcomes.append((type(exc).__name__, pod["metadata"]["name"]))

    loop = threading.Thread(target=client_loop)
    loop.start()
    try:
        kubectl(
            control.stack,
            "patch",
            "modeldeployment",
            "chat",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"runtime": {"concurrency": 3}}}),
        )

        def rolled_out() -> dict[str, Any] | None:
            obj = md(control, namespace, "chat")
            if obj["status"].get("fingerprint") == old_fingerprint:
                return None
            pods = serving_pods(control, namespace, "chat")
            fingerprints = {p["metadata"]["labels"]["kama.dev/fingerprint"] for p in pods}
            done = fingerprints == {obj["status"]["fingerprint"]} and len(routable(pods)) == 2
            return obj if done and obj["status"].get("readyReplicas") == 2 else None

        new = eventually(
            rolled_out, timeout=SERVE_TIMEOUT, what="the rollout to finish", interval=0.5
        )
    finally:
        stop.set()
        loop.join(timeout=60)
    failures = [o for o in outcomes if o[0] != "200"]
    assert not failures, f"{len(failures)} of {len(outcomes)} requests failed: {failures[:5]}"
    served_by = {fp for _, fp in outcomes}
    assert old_fingerprint in served_by and new["status"]["fingerprint"] in served_by, (
        "requests were answered by the old pods, then by the new ones"
    )
    args = serving_pods(control, namespace, "chat")[0]["metadata"]["annotations"][
        "kama.dev/llama-server-args"
    ]
    assert "--ctx-size 1536 --parallel 3" in args

    # deleting the deployment drains and deletes its pods; the artifact stays Ready
    kubectl(control.stack, "delete", "modeldeployment", "chat", "-n", namespace, "--timeout=120s")
    assert serving_pods(control, namespace, "chat") == []
    assert (
        condition(get_json(control.stack, "modelartifact", "tiny", "-n", namespace), "Ready") or {}
    )["status"] == "True"

    # what this deployment recorded (entity, rollouts, drains) replays on the current code
    assert replayed_types(control, namespace) == {
        "Keep model deployment",
        "Roll out model deployment",
        "Drain serving pod",
    }


def replayed_types(control: KamaControl, namespace: str) -> set[str]:
    """Replay every serving-plane history of `namespace`; the workflow types seen.
    A non-deterministic change to the workflow code fails the replay."""

    async def replay() -> set[str]:
        client = await Client.connect(control.stack.temporal.address)
        types = ("Keep model deployment", "Roll out model deployment", "Drain serving pod")
        query = (
            f"KamaNamespace = '{namespace}' AND ("
            + " OR ".join(f"WorkflowType = '{t}'" for t in types)
            + ")"
        )
        replayer = Replayer(workflows=[DeploymentWorkflow, RolloutWorkflow, DrainWorkflow])
        seen = set()
        async for execution in client.list_workflows(query):
            handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
            await replayer.replay_workflow(await handle.fetch_history())
            seen.add(execution.workflow_type)
        return seen

    return asyncio.run(replay())


def test_killed_llama_server_is_replaced(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    ready_artifact(control, namespace, tmp_path, name="fragile", seed=62)
    apply(
        control.stack,
        deployment(
            namespace,
            "fragile",
            "fragile",
            replicas=1,
            runtime={"contextSize": 256},
            resources={"cpu": "100m"},
            scaling={"drainTimeout": "10s"},
        ),
    )
    wait_ready(control, namespace, "fragile", 1)
    (before,) = serving_pods(control, namespace, "fragile")
    pid = llama_server_pid(before["status"]["podIP"])
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    def replaced() -> dict[str, Any] | None:
        pods = routable(serving_pods(control, namespace, "fragile"))
        return (
            pods[0]
            if len(pods) == 1 and pods[0]["metadata"]["uid"] != before["metadata"]["uid"]
            else None
        )

    after = eventually(replaced, timeout=SERVE_TIMEOUT, what="a replacement pod", interval=0.5)
    assert after["metadata"]["name"] != before["metadata"]["name"]
    obj = wait_ready(control, namespace, "fragile", 1)
    assert chat(after)
    events = events_about(control.stack, namespace, "fragile")
    assert "RuntimeReady" in events
    assert obj["status"]["readyReplicas"] == 1


def test_unready_artifact_and_fit_failure_create_no_pods(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    apply(control.stack, deployment(namespace, "orphan", "missing", replicas=1))

    orphan = wait_md_condition(control, namespace, "orphan", "ArtifactReady", "False")
    found = condition(orphan, "ArtifactReady")
    assert found is not None
    assert "missing" in found["message"]
    assert_ready(orphan, "False", "ArtifactMissing")

    ready_artifact(control, namespace, tmp_path, name="small", seed=63)
    apply(
        control.stack,
        deployment(
            namespace,
            "huge",
            "small",
            replicas=1,
            placement={"mode": "CPU"},
            runtime={
                "contextSize": 1 << 22,
                "concurrency": 256,
                "kvCache": {"keyType": "f32", "valueType": "f32"},
            },
        ),
    )

    obj = wait_md_condition(control, namespace, "huge", "FitFailed")
    assert_ready(obj, "False", "FitFailed")
    message = condition(obj, "FitFailed")["message"]  # type: ignore[index]
    assert "GiB" in message or "TiB" in message
    rejected = obj["status"]["rejectedCandidates"]
    assert rejected and all(
        r["requiredBytes"] > r["availableBytes"] for r in rejected if "requiredBytes" in r
    )
    assert serving_pods(control, namespace, "huge") == []
    assert serving_pods(control, namespace, "orphan") == []
    # the Event is recorded by the activity after the status write: wait for it
    eventually(
        lambda: "FitFailed" in events_about(control.stack, namespace, "huge") or None,
        timeout=30,
        what="the FitFailed Event",
    )


def test_gpu_deployment_is_bound_where_the_planner_chose(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    small = GPUNode(
        name=f"gpu-l4-{uuid.uuid4().hex[:4]}", gpus=1, product="NVIDIA-L4", memory_mib=23034
    )
    big = GPUNode(name=f"gpu-h100-{uuid.uuid4().hex[:4]}", gpus=4)
    # imported first: an untainted fake node could otherwise get the importer pod; into
    # a cache every node can mount (a local volume would keep the replica off the GPUs)
    ready_artifact(control, namespace, tmp_path, name="gpu-model", seed=64, shared=True)
    control.stack.add_gpu_node(small)
    control.stack.add_gpu_node(big)
    try:
        # 4Mi tokens x 24 slots: about 30 GB of KV and buffers, more than the 22.5 GiB
        # of the L4, less than one H100
        apply(
            control.stack,
            deployment(
                namespace,
                "gpu",
                "gpu-model",
                replicas=1,
                placement={"mode": "GPU"},
                runtime={"contextSize": 1 << 22, "concurrency": 24},
            ),
        )

        def bound() -> dict[str, Any] | None:
            pods = serving_pods(control, namespace, "gpu")
            return pods[0] if len(pods) == 1 and pods[0]["spec"].get("nodeName") else None

        pod = eventually(bound, timeout=SERVE_TIMEOUT, what="the GPU pod to be scheduled")
        status = md(control, namespace, "gpu")["status"]
        profile = status["profile"]
        assert profile["mode"] == "GPU" and profile["node"] == big.name == pod["spec"]["nodeName"]
        assert profile["gpusPerReplica"] == 1
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == "1"
        terms = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [big.product]
        assert pinned_node(pod) is None, "a claim many nodes can mount pins no node"
        args = pod["metadata"]["annotations"]["kama.dev/llama-server-args"]
        assert f"--n-gpu-layers {profile['gpuLayers']}" in args and profile["gpuLayers"] == 3
        assert f"--ctx-size {24 << 22} --parallel 24" in args and "--split-mode none" in args
        assert any(r["node"] == small.name for r in status["rejectedCandidates"])
        obj = md(control, namespace, "gpu")
        assert (condition(obj, "Degraded") or {}).get("status") == "False"
    finally:
        remove_from_fake_nodes(control, namespace, deployments=["gpu"], nodes=[small, big])


def remove_from_fake_nodes(
    control: KamaControl, namespace: str, *, deployments: list[str], nodes: list[GPUNode]
) -> None:
    """Delete `deployments` and their pods (force: nothing runs on a fake node, so no
    kubelet confirms a deletion), then the fake `nodes`."""
    for name in deployments:
        kubectl(
            control.stack, "delete", "modeldeployment", name, "-n", namespace,
            "--wait=false", check=False,
        )  # fmt: skip
        for pod in serving_pods(control, namespace, name):
            kubectl(
                control.stack, "delete", "pod", pod["metadata"]["name"], "-n", namespace,
                "--grace-period=0", "--force",
            )  # fmt: skip
    for node in nodes:
        kubectl(control.stack, "delete", "node", node.name, "--wait=false", "--ignore-not-found")
