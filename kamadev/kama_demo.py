"""What `make dev` runs on top of the local stack: the whole of Kama (worker,
watcher, gateway) as processes, Kama's CRDs, a Hugging Face Hub fixture serving a
generated model, and a demo ModelCache + ModelArtifact + ModelDeployment with
`minReplicas: 0`. The deployment starts at zero, so the first request through the
gateway is a cold start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from kamadev.binaries import REPO_ROOT
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.hub import HubFixture
from kamadev.processes import ManagedProcess, free_port, wait_until
from kamadev.stack import KAMA_IMAGE, LocalStack

DEMO_NAMESPACE = "kama-demo"
DEMO_REPO = "kama-demo/tiny-chat"
DEMO_MODEL = f"{DEMO_NAMESPACE}/tiny-chat"


@dataclass
class KamaDemo:
    gateway_url: str
    hub: HubFixture
    processes: list[ManagedProcess] = field(default_factory=list)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop(grace=5)
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


def demo_resources() -> list[dict[str, Any]]:
    meta = {"namespace": DEMO_NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEMO_NAMESPACE}},
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
    hub_url = hub.start()
    (stack.workdir / "demo").mkdir(parents=True, exist_ok=True)
    model = write_model(stack.workdir / "demo" / "tiny.gguf", shape=ModelShape())
    hub.add_repo(DEMO_REPO, {"tiny.gguf": model})
    _kubectl(stack, "apply", "-f", str(REPO_ROOT / "deploy" / "crds"))
    _kubectl(stack, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    port, ops_port = free_port(), free_port()
    env = {
        "KUBECONFIG": str(stack.kubeconfig),
        "KAMA_TEMPORAL_ADDRESS": stack.temporal.address,
        "KAMA_HF_ENDPOINT": hub_url,
        "KAMA_IMPORTER_IMAGE": KAMA_IMAGE,
    }
    demo = KamaDemo(gateway_url=f"http://127.0.0.1:{port}", hub=hub)
    for command, extra in (
        ("worker", []),
        ("watcher", []),
        (
            "gateway",
            ["--host", "127.0.0.1", "--port", str(port), "--ops-port", str(ops_port)],
        ),
    ):
        demo.processes.append(
            ManagedProcess(
                name=f"kama-{command}",
                argv=[sys.executable, "-m", "kamactl", command, *extra],
                log_path=stack.workdir / "logs" / f"kama-{command}.log",
                stack_id=stack.stack_id,
                env={**os.environ, "KAMA_HEALTH_PORT": str(free_port()), **env},
                cwd=REPO_ROOT,
            )
        )
    try:
        deadline = time.monotonic() + 60
        while True:  # the CRDs take a moment to be served after Established
            try:
                _kubectl(
                    stack,
                    "apply",
                    "-f",
                    "-",
                    stdin=json.dumps(
                        {"apiVersion": "v1", "kind": "List", "items": demo_resources()}
                    ),
                )
                break
            except subprocess.CalledProcessError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

        def gateway_ready() -> bool:
            for process in demo.processes:
                process.check_alive()
            try:
                ready = httpx.get(f"http://127.0.0.1:{ops_port}/readyz", timeout=2)
                return ready.status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(gateway_ready, timeout=60, what="the gateway")

        def artifact_ready() -> bool:
            out = _kubectl(
                stack, "get", "modelartifact", "tiny-chat", "-n", DEMO_NAMESPACE, "-o", "json"
            )
            return bool(json.loads(out).get("status", {}).get("phase") == "Ready")

        wait_until(artifact_ready, timeout=180, what="the demo artifact to be imported")
    except BaseException:
        demo.stop()
        raise
    return demo
