"""What `make dev` runs on top of the local stack: Kama installed by its Helm chart
(CRDs, worker, watcher and gateway as pods with their own ServiceAccounts, on the
stack's Temporal), a Hugging Face Hub fixture serving two repositories, and in the
demo namespace a ModelCache, a ModelAccessKey for a freshly minted API key (`make dev`
prints the key; the gateway keeps the chart's default, `gateway.auth.mode: apikey`)
and two models at `minReplicas: 0`, so the first request to each is a cold start:

* `gemma-3-270m`: Gemma 3 270M, a real model (fetched from PyPI at setup as a dev
  fixture, under the Gemma Terms of Use), imported with its published sha256. A base
  model without a chat template: the demo asks it for completions.
* `tiny-chat`: a generated llama model with a chat template, for chat requests."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from kama.api import key_sha256, minted_key
from kamadev.chart import CHART, RELEASE, helm, local_stack_values
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.hub import HubFixture
from kamadev.processes import wait_until
from kamadev.real_models import GEMMA3_SHA256, ensure_gemma3
from kamadev.stack import LocalStack

DEMO_NAMESPACE = "kama-demo"
DEMO_REPO = "kama-demo/tiny-chat"
DEMO_MODEL = f"{DEMO_NAMESPACE}/tiny-chat"
REAL_REPO = "google/gemma-3-270m-GGUF"
REAL_FILE = "gemma-3-270m-q4_k_m.gguf"
REAL_MODEL = f"{DEMO_NAMESPACE}/gemma-3-270m"
DEMO_ARTIFACTS = ("tiny-chat", "gemma-3-270m")
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
        {
            "apiVersion": "kama.dev/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": "gemma-3-270m", **meta},
            "spec": {
                "source": {"huggingFace": {"repo": REAL_REPO, "files": [REAL_FILE]}},
                "cacheRef": {"name": "models"},
                "expectedSHA256": GEMMA3_SHA256,
            },
        },
        {
            "apiVersion": "kama.dev/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": "gemma-3-270m", **meta},
            "spec": {
                "modelRef": {"name": "gemma-3-270m"},
                "aliases": ["gemma-3-270m"],
                "runtime": {"contextSize": 2048, "concurrency": 2},
                "resources": {"cpu": "500m"},
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
    hub.add_repo(REAL_REPO, {REAL_FILE: ensure_gemma3()})
    demo = KamaDemo(
        gateway_url="",
        hub=hub,
        stack=stack,
        api_key=minted_key(namespace=DEMO_NAMESPACE, name="demo", secret=secrets.token_urlsafe(32)),
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

        def artifacts_ready() -> bool:
            out = _kubectl(stack, "get", "modelartifact", "-n", DEMO_NAMESPACE, "-o", "json")
            ready = {
                item["metadata"]["name"]
                for item in json.loads(out)["items"]
                if item.get("status", {}).get("phase") == "Ready"
            }
            return ready >= set(DEMO_ARTIFACTS)

        wait_until(artifacts_ready, timeout=300, what="the demo artifacts to be imported")
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
