"""Real nodes (kubelet + containerd + runc + CNI bridge + kube-proxy, each in its own
network and mount namespace) joined to the stack's API server: what the runtime
enforces, Services and DNS across nodes, and a teardown that leaves nothing behind.

Pods here run Kama's own `kama` image (Debian's python3.11), imported into containerd
by the stack; nothing is pulled.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kamadev.binaries import REPO_ROOT
from kamadev.processes import processes_with_marker
from kamadev.realnode import cgroups, network
from kamadev.realnode.addresses import StackAddresses
from kamadev.stack import KAMA_IMAGE, LocalStack
from tests.conftest import fresh_namespace
from tests.support import apply, eventually, get_json, kubectl, pid_alive

PYTHON = "/usr/bin/python3.11"


@pytest.fixture(scope="module")
def real_stack() -> Iterator[LocalStack]:
    local = LocalStack(with_temporal=False).start()
    try:
        yield local
    finally:
        local.stop()
        local.remove_workdir()


@pytest.fixture
def ns(real_stack: LocalStack) -> Iterator[str]:
    yield from fresh_namespace(real_stack, prefix="r")


def python_pod(
    name: str,
    namespace: str,
    script: str,
    *,
    node: str | None = None,
    security: dict[str, Any] | None = None,
    pod_security: dict[str, Any] | None = None,
    limits: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    restart: str = "Never",
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": KAMA_IMAGE,
        "imagePullPolicy": "Never",
        "command": [PYTHON, "-u", "-c", script],
    }
    if security:
        container["securityContext"] = security
    if limits:
        container["resources"] = {"limits": limits}
    spec: dict[str, Any] = {"restartPolicy": restart, "containers": [container]}
    if node:
        spec["nodeName"] = node
    if pod_security:
        spec["securityContext"] = pod_security
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec,
    }


def pod_status(stack: LocalStack, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = get_json(stack, "pod", name, "-n", namespace).get("status", {})
    return status


def terminated(stack: LocalStack, namespace: str, name: str) -> dict[str, Any]:
    """The container's terminated state, once it has one."""
    found: dict[str, Any] = {}

    def done() -> bool:
        statuses = pod_status(stack, namespace, name).get("containerStatuses") or []
        state = statuses[0].get("state", {}) if statuses else {}
        found.update(state.get("terminated") or {})
        return bool(found)

    eventually(done, timeout=90, what=f"pod {name} to terminate")
    return found


def logs(stack: LocalStack, namespace: str, name: str) -> str:
    return kubectl(stack, "logs", name, "-n", namespace).stdout


def test_both_nodes_are_real_kubelets(real_stack: LocalStack) -> None:
    nodes = get_json(real_stack, "nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["kama-node-0", "kama-node-1"]
    for node in nodes:
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.37.2"
        assert info["containerRuntimeVersion"].startswith("containerd://2.")
        address = {a["type"]: a["address"] for a in node["status"]["addresses"]}["InternalIP"]
        assert address.startswith("10.") and not address.startswith("10.96.")


def test_memory_limit_is_enforced_by_the_kernel(real_stack: LocalStack, ns: str) -> None:
    apply(
        real_stack,
        python_pod(
            "hog",
            ns,
            "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n",
            limits={"memory": "64Mi"},
        ),
    )
    state = terminated(real_stack, ns, "hog")
    assert state["reason"] == "OOMKilled", state
    assert state["exitCode"] == 137


def test_read_only_root_and_non_root_are_enforced(real_stack: LocalStack, ns: str) -> None:
    script = (
        "import os\n"
        "print('uid', os.getuid())\n"
        "try:\n"
        "    open('/written-by-pod', 'w')\n"
        "    print('write ok')\n"
        "except OSError as exc:\n"
        "    print('write failed', exc.strerror)\n"
    )
    apply(
        real_stack,
        python_pod(
            "confined",
            ns,
            script,
            security={"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
            pod_security={"runAsNonRoot": True, "runAsUser": 65532},
        ),
    )
    assert terminated(real_stack, ns, "confined")["exitCode"] == 0
    out = logs(real_stack, ns, "confined")
    assert "uid 65532" in out
    assert "write failed Read-only file system" in out
    # runAsNonRoot with a root user is refused before anything runs
    apply(
        real_stack,
        python_pod(
            "as-root",
            ns,
            "print('ran')",
            pod_security={"runAsNonRoot": True, "runAsUser": 0},
        ),
    )

    def refused() -> bool:
        statuses = pod_status(real_stack, ns, "as-root").get("containerStatuses") or []
        waiting = statuses[0].get("state", {}).get("waiting", {}) if statuses else {}
        return waiting.get("reason") == "CreateContainerConfigError" and "non-root" in waiting.get(
            "message", ""
        )

    eventually(refused, timeout=60, what="the root pod to be refused")


def test_a_service_answers_from_the_other_node_by_name(real_stack: LocalStack, ns: str) -> None:
    server = (
        "import http.server\n"
        "class Answer(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = b'served by node-0'\n"
        "        self.send_response(200)\n"
        "        self.send_header('Content-Length', str(len(body)))\n"
        "        self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "http.server.HTTPServer(('', 8080), Answer).serve_forever()\n"
    )
    apply(
        real_stack,
        python_pod("web", ns, server, node="kama-node-0", labels={"app": "web"}, restart="Always"),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    cluster_ip = get_json(real_stack, "service", "web", "-n", ns)["spec"]["clusterIP"]
    client = (
        "import socket, time, urllib.request\n"
        "for attempt in range(60):\n"
        "    try:\n"
        f"        resolved = socket.gethostbyname('web.{ns}.svc.cluster.local')\n"
        "        short = socket.gethostbyname('web')\n"
        "        body = urllib.request.urlopen('http://web/', timeout=2).read().decode()\n"
        "        break\n"
        "    except OSError as exc:\n"
        "        print('not yet:', exc)\n"
        "        time.sleep(0.5)\n"
        "print('resolved', resolved, short)\n"
        "print('body', body)\n"
    )
    apply(real_stack, python_pod("client", ns, client, node="kama-node-1"))
    state = terminated(real_stack, ns, "client")
    out = logs(real_stack, ns, "client")
    assert state["exitCode"] == 0, out
    assert f"resolved {cluster_ip} {cluster_ip}" in out
    assert "body served by node-0" in out


def test_pods_reach_the_hosts_temporal_by_its_service_name(
    stack: LocalStack, namespace: str
) -> None:
    """The Temporal dev server runs on the host; pods (importers, the chart's Kama) know
    it as `temporal.kama-system.svc`: CoreDNS names it, kube-proxy takes the ClusterIP
    to the relay on the bridge. A real Temporal client in a pod on each node asks it."""
    assert stack.temporal_for_pods.startswith("temporal.kama-system.svc.cluster.local:")
    client = (
        "import asyncio, socket\n"
        "from temporalio.client import Client\n"
        "async def main():\n"
        f"    client = await Client.connect({stack.temporal_for_pods!r})\n"
        "    count = await client.count_workflows()\n"
        "    print('resolved', socket.gethostbyname('temporal.kama-system.svc.cluster.local'))\n"
        "    print('workflows counted', count.count >= 0)\n"
        "asyncio.run(main())\n"
    )
    service_ip = get_json(stack, "service", "temporal", "-n", "kama-system")["spec"]["clusterIP"]
    for node in ("kama-node-0", "kama-node-1"):
        pod = python_pod(f"asks-{node}", namespace, client, node=node)
        pod["spec"]["containers"][0]["command"][0] = "/opt/kama/bin/python"
        apply(stack, pod)
    for node in ("kama-node-0", "kama-node-1"):
        state = terminated(stack, namespace, f"asks-{node}")
        out = logs(stack, namespace, f"asks-{node}")
        assert state["exitCode"] == 0, out
        assert f"resolved {service_ip}" in out
        assert "workflows counted True" in out


def host_leftovers(stack: LocalStack) -> dict[str, Any]:
    """What of the stack's nodes would still be on the host: processes, mounts,
    cgroups, network interfaces and iptables rules."""
    addresses = stack.nodes.addresses
    links = json.loads(
        subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout
    )
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    return {
        "processes": processes_with_marker(stack_id=stack.stack_id),
        "mounts": [
            line
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if str(stack.workdir) in line or "/var/lib/kubelet" in line or "/run/containerd" in line
        ],
        "cgroups": [str(p) for p in cgroups.leftovers(prefix=addresses.cgroup_prefix())],
        "links": [
            link["ifname"]
            for link in links
            if link["ifname"] in (addresses.bridge, *[addresses.host_veth(i) for i in range(2)])
        ],
        "iptables": [
            line
            for line in rules.splitlines()
            if "KUBE-" in line or "CNI-" in line or addresses.cluster_cidr in line
        ],
    }


def test_teardown_leaves_nothing_on_the_host() -> None:
    own = LocalStack(with_temporal=False).start()
    try:
        apply(
            own, python_pod("sleeper", "default", "import time; time.sleep(3600)", restart="Always")
        )
        eventually(
            lambda: pod_status(own, "default", "sleeper").get("phase") == "Running",
            timeout=90,
            what="a pod running on a real node",
        )
        during = host_leftovers(own)
        assert during["processes"] and during["cgroups"] and during["links"]
    finally:
        own.stop()
        own.remove_workdir()
    assert host_leftovers(own) == {
        "processes": [],
        "mounts": [],
        "cgroups": [],
        "links": [],
        "iptables": [],
    }


def claim(namespace: str, name: str, mode: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "10Mi"}}},
    }


def writers(namespace: str, name: str, claim_name: str, *, spread: bool) -> dict[str, Any]:
    """Two replicas writing their node's name into the claim; `spread` requires them
    on different nodes."""
    labels = {"app": name}
    script = (
        "import os, time\n"
        "open(f\"/data/{os.environ['NODE']}-{os.environ['POD']}\", 'w').write('x')\n"
        "time.sleep(3600)\n"
    )
    pod = python_pod(name, namespace, script, labels=labels, restart="Always")["spec"]
    container = pod["containers"][0]
    container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    container["env"] = [
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    pod["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]
    if spread:
        pod["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": labels},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def nodes_that_wrote(path: Path) -> list[str]:
    """`writers` name their files `<node>-<pod>`, and their pods are `rw?-...`."""
    return sorted(p.name.rsplit("-rw", 1)[0] for p in path.iterdir())


def running_nodes(stack: LocalStack, namespace: str, app: str) -> list[str]:
    pods = get_json(stack, "pods", "-n", namespace, "-l", f"app={app}")["items"]
    running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
    return sorted(p["spec"]["nodeName"] for p in running) if len(running) == 2 else []


def test_a_read_write_once_volume_keeps_its_pods_on_its_node(
    real_stack: LocalStack, ns: str
) -> None:
    apply(
        real_stack, claim(ns, "local", "ReadWriteOnce"), writers(ns, "rwo", "local", spread=False)
    )
    nodes = eventually(
        lambda: running_nodes(real_stack, ns, "rwo"), timeout=90, what="both replicas running"
    )
    volume = get_json(real_stack, "pvc", "local", "-n", ns)["spec"]["volumeName"]
    pv = get_json(real_stack, "pv", volume)
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    [pinned] = terms[0]["matchExpressions"][0]["values"]
    assert nodes == [pinned, pinned]
    path = Path(pv["spec"]["hostPath"]["path"])
    eventually(
        lambda: nodes_that_wrote(path) == [pinned, pinned],
        timeout=30,
        what="both replicas' files in the volume",
    )


def test_a_shared_volume_is_mounted_on_both_nodes(real_stack: LocalStack, ns: str) -> None:
    apply(
        real_stack, claim(ns, "shared", "ReadWriteMany"), writers(ns, "rwx", "shared", spread=True)
    )
    nodes = eventually(
        lambda: running_nodes(real_stack, ns, "rwx"), timeout=90, what="one replica per node"
    )
    assert nodes == ["kama-node-0", "kama-node-1"]
    volume = get_json(real_stack, "pvc", "shared", "-n", ns)["spec"]["volumeName"]
    path = Path(get_json(real_stack, "pv", volume)["spec"]["hostPath"]["path"])
    eventually(
        lambda: nodes_that_wrote(path) == nodes,
        timeout=30,
        what="a file from each node in the shared volume",
    )


CRASHING_STACK = """
import json, sys, time
from kamadev.stack import LocalStack
from tests.support import eventually, get_json
stack = LocalStack(with_temporal=False, nodes=1).start()
eventually(
    lambda: [p for p in get_json(stack, "pods", "-n", "kube-system")["items"]
             if p.get("status", {}).get("phase") == "Running"],
    timeout=90, what="CoreDNS running",
)
print(json.dumps({"octet": stack.nodes.addresses.octet, "workdir": str(stack.workdir),
                  "root": stack.nodes.nodes[0].cgroup_root}), flush=True)
time.sleep(600)
"""


def test_a_stack_after_a_crashed_one_sweeps_what_it_left() -> None:
    crashed = subprocess.Popen(
        [sys.executable, "-c", CRASHING_STACK], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT
    )
    try:
        assert crashed.stdout is not None
        left = json.loads(crashed.stdout.readline())
    finally:
        crashed.kill()  # SIGKILL: no teardown at all
        crashed.wait()
    addresses = StackAddresses(octet=left["octet"])
    try:
        # its daemons died with it; its containers, cgroups and bridge did not
        orphans = cgroups.processes_below(left["root"])
        assert orphans, "the crashed node's containers outlive it"
        assert cgroups.leftovers(prefix=addresses.cgroup_prefix())
        assert network.link_exists(addresses.bridge)

        after = LocalStack(with_temporal=False, nodes=1).start()
        try:
            assert after.nodes.addresses.octet == left["octet"]
            assert not any(pid_alive(pid) for pid in orphans)
            assert after.nodes.nodes[0].name == "kama-node-0"
        finally:
            after.stop()
            after.remove_workdir()
        assert host_leftovers(after) == {
            "processes": [],
            "mounts": [],
            "cgroups": [],
            "links": [],
            "iptables": [],
        }
    finally:
        shutil.rmtree(left["workdir"], ignore_errors=True)
