"""What `make dev` runs on top of the local stack: Kama installed by its Helm chart
(CRDs, worker, watcher and gateway as pods with their own ServiceAccounts, on the
stack's Temporal), a Hugging Face Hub fixture serving a generated model, and a demo
ModelCache + ModelArtifact + ModelDeployment with `minReplicas: 0`, and a
ModelAccessKey for a freshly minted API key (`make dev` prints the key; the gateway
keeps the chart's default, `gateway.auth.mode: apikey`). The deployment starts at
zero, so the first request through the gateway is a cold start."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from kama.api import key_sha256
from kamadev.chart import CHART, RELEASE, helm, local_stack_values
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.hub import HubFixture
from kamadev.processes import wait_until
from kamadev.stack import LocalStack

DEMO_NAMESPACE = "kama-demo"
DEMO_REPO = "kama-demo/tiny-chat"
DEMO_MODEL = f"{DEMO_NAMESPACE}/tiny-chat"
KAMA_NAMESPACE = "kama-system"
GATEWAY_PORT = 8000  # the chart's gateway.port


@dataclass
class KamaDemo:
    gateway_url: str
    hub: HubFixture
    stack: LocalStack
    api_key: str  # its hash is the demo namespace's ModelAccessKey `demo`
    installed: bool = False

    def stop(self) -> None:
        if self.installed:  # Kama's pods go; the stack's teardown takes the rest
            helm(self.stack, "uninstall", RELEASE, "-n", KAMA_NAMESPACE, "--wait",
                 "--timeout", "90s", check=False)  # fmt: skip
        self.hub.stop()


def _kubectl(stack: LocalStack, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        [str(stack.binaries.kubectl), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=stack.kubectl_env(),
        check=True,
        timeout=120,
    ).stdout


def demo_resources(*, api_key: str) -> list[dict[str, Any]]:
    meta = {"namespace": DEMO_NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEMO_NAMESPACE}},
        {
            "apiVersion": "kama.dev/v1alpha1",
            "kind": "ModelAccessKey",
            "metadata": {"name": "demo", **meta},
            "spec": {"keySHA256": key_sha256(api_key)},
        },
        {
            "apiVersion": "kama.dev/v1alpha1",
            "kind": "ModelCache",
            "metadata": {"name": "models", **meta},
            "spec": {"claimTemplate": {"size": "2Gi", "accessModes": ["ReadWriteOnce"]}},
        },
        {
            "apiVersion": "kama.dev/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": "tiny-chat", **meta},
            "spec": {
                "source": {"huggingFace": {"repo": DEMO_REPO, "files": ["tiny.gguf"]}},
                "cacheRef": {"name": "models"},
            },
        },
        {
            "apiVersion": "kama.dev/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": "tiny-chat", **meta},
            "spec": {
                "modelRef": {"name": "tiny-chat"},
                "aliases": ["tiny-chat"],
                "runtime": {"contextSize": 2048, "concurrency": 2},
                "resources": {"cpu": "250m"},
                "scaling": {"minReplicas": 0, "maxReplicas": 1, "idleTimeout": "10m"},
            },
        },
    ]


def start_kama_demo(stack: LocalStack) -> KamaDemo:
    hub = HubFixture()
    hub_url = hub.start(host=stack.service_host)
    (stack.workdir / "demo").mkdir(parents=True, exist_ok=True)
    model = write_model(stack.workdir / "demo" / "tiny.gguf", shape=ModelShape())
    hub.add_repo(DEMO_REPO, {"tiny.gguf": model})
    demo = KamaDemo(
        gateway_url="", hub=hub, stack=stack, api_key=f"kama_{secrets.token_urlsafe(32)}"
    )
    try:
        # Kama as a user installs it: the chart (CRDs, one ServiceAccount and role per
        # component, worker, watcher and gateway pods), on the stack's Temporal
        values = local_stack_values(hub_url=hub_url)
        values["temporal"] = {"address": stack.temporal_for_pods}
        values["watcher"] = {"replicas": 1}
        values["gateway"] = {"replicas": 1}
        values_file = stack.workdir / "demo" / "values.yaml"
        values_file.write_text(json.dumps(values))  # JSON is YAML
        helm(stack, "install", RELEASE, str(CHART), "-n", KAMA_NAMESPACE, "--create-namespace",
             "-f", str(values_file), "--wait", "--timeout", "3m")  # fmt: skip
        demo.installed = True
        _apply_when_served(stack, demo_resources(api_key=demo.api_key))
        demo.gateway_url = f"http://{_gateway_address(stack)}:{GATEWAY_PORT}"

        def artifact_ready() -> bool:
            out = _kubectl(
                stack, "get", "modelartifact", "tiny-chat", "-n", DEMO_NAMESPACE, "-o", "json"
            )
            return bool(json.loads(out).get("status", {}).get("phase") == "Ready")

        wait_until(artifact_ready, timeout=300, what="the demo artifact to be imported")
    except BaseException:
        demo.stop()
        raise
    return demo


def _apply_when_served(stack: LocalStack, items: list[dict[str, Any]]) -> None:
    """`kubectl apply` the items, once the API server serves the chart's new CRDs (a
    moment after they are Established)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            _kubectl(stack, "apply", "-f", "-", stdin=json.dumps(
                {"apiVersion": "v1", "kind": "List", "items": items}
            ))  # fmt: skip
            return
        except subprocess.CalledProcessError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def _gateway_address(stack: LocalStack) -> str:
    """The ready gateway pod's IP (this host routes to every node's pod range)."""
    out = _kubectl(
        stack, "get", "pods", "-n", KAMA_NAMESPACE, "-o", "json",
        "-l", "app.kubernetes.io/component=gateway",
    )  # fmt: skip
    for pod in json.loads(out)["items"]:
        conditions = pod.get("status", {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return str(pod["status"]["podIP"])
    raise RuntimeError("no ready gateway pod after helm install --wait")
