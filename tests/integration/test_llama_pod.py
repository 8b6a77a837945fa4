"""A llama-server Pod on a real node: model on a PVC mounted read-only, Ready
through its readiness probe, answering on its own pod IP, gone after deletion."""

from __future__ import annotations

from typing import Any

import httpx

from kamadev.demo import LLAMA_PORT, claim_host_path, claim_manifest, llama_pod_manifest
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.stack import LocalStack
from tests.integration.test_serving_plane import llama_server_pid
from tests.support import apply, eventually, get_json, kubectl, pid_alive


def ready_pod(stack: LocalStack, namespace: str, name: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pod = get_json(stack, "pod", name, "-n", namespace)
        conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
        return pod if conds.get("Ready") == "True" else None

    return eventually(ready, timeout=90, what=f"pod {name} Ready")


def container_pid(pod: dict[str, Any]) -> int:
    """The pod's llama-server as this host's /proc sees it (containers share its PID
    namespace view from the outside)."""
    pid = llama_server_pid(pod["status"]["podIP"])
    assert pid is not None, pod["metadata"]["name"]
    return pid


def test_llama_server_pod_serves_and_stops(stack: LocalStack, namespace: str) -> None:
    apply(stack, claim_manifest(name="models", namespace=namespace))
    volume = claim_host_path(core=stack.core(), name="models", namespace=namespace)
    write_model(volume / "tiny.gguf", shape=ModelShape())
    pods = [
        llama_pod_manifest(name=name, namespace=namespace, claim="models", model_file="tiny.gguf")
        for name in ("llama-a", "llama-b")
    ]
    apply(stack, *pods)
    pod_a, pod_b = ready_pod(stack, namespace, "llama-a"), ready_pod(stack, namespace, "llama-b")
    ip_a, ip_b = pod_a["status"]["podIP"], pod_b["status"]["podIP"]
    assert ip_a != ip_b, "every pod gets its own IP so both can listen on the same port"

    with httpx.Client(timeout=30) as http:
        completion = http.post(
            f"http://{ip_a}:{LLAMA_PORT}/completion",
            json={"prompt": "Hello", "n_predict": 8, "temperature": 0, "ignore_eos": True},
        )
        assert completion.status_code == 200
        assert completion.json()["tokens_predicted"] == 8
        chat = http.post(
            f"http://{ip_b}:{LLAMA_PORT}/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
                "temperature": 0,
            },
        )
        assert chat.status_code == 200
        assert chat.json()["choices"][0]["message"]["role"] == "assistant"
        props = http.get(f"http://{ip_a}:{LLAMA_PORT}/props").json()
        assert props["total_slots"] == 2 and props["model_path"] == "/models/tiny.gguf"

    pid_a, pid_b = container_pid(pod_a), container_pid(pod_b)
    assert pid_alive(pid_a) and pid_alive(pid_b)
    kubectl(stack, "delete", "pod", "llama-a", "-n", namespace, "--wait=true", "--timeout=60s")
    assert not pid_alive(pid_a)
    kubectl(stack, "delete", "pod", "llama-b", "-n", namespace, "--grace-period=0", "--force")
    eventually(
        lambda: not pid_alive(pid_b), timeout=15, what="the force-deleted pod's process to exit"
    )
    assert kubectl(stack, "get", "pod", "-n", namespace, "-o", "name").stdout.strip() == ""
