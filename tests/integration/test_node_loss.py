"""A node whose kubelet dies, on the real nodes: the control plane loses it (Ready
Unknown after the controller-manager's grace period), Kama replaces the replica that
ran there on the surviving node (its artifact sits on a ReadWriteMany cache every node
can mount), and the gateway sends nothing more to the lost pod, although its
llama-server still runs: only the kubelet died."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kama.serving_plan import LLAMA_PORT
from kamadev.realnode.node import RealNode
from kamadev.stack import LocalStack
from tests.conftest import GatewayProcess
from tests.integration.runbook_shell import RUNBOOKS, run_runbook
from tests.integration.test_gateway import client
from tests.integration.test_serving_plane import (
    deployment,
    ready_artifact,
    serving_pods,
    wait_ready,
)
from tests.support import apply, eventually, get_json, serving_headers

LOSS_TIMEOUT = 150  # the controller-manager's 40 s grace period, then Kama's reaction


def node_named(stack: LocalStack, name: str) -> RealNode:
    return next(n for n in stack.nodes.nodes if n.name == name)


def llama_counter(pod: dict[str, Any], name: str) -> float:
    """One of llama-server's own counters (its /metrics), e.g. `prompt_tokens_total`."""
    url = f"http://{pod['status']['podIP']}:{LLAMA_PORT}/metrics"
    text = httpx.get(url, headers=serving_headers(pod), timeout=5).text
    match = re.search(rf"^llamacpp:{name} (\S+)$", text, re.MULTILINE)
    assert match, text
    return float(match.group(1))


def prompt_tokens_served(pod: dict[str, Any]) -> float:
    """llama-server's own count of prompt tokens it processed."""
    return llama_counter(pod, "prompt_tokens_total")


@pytest.fixture
def revive_kubelets(stack: LocalStack) -> Iterator[None]:
    yield
    for node in stack.nodes.nodes:
        node.start_kubelet()  # a no-op where it runs

    def all_ready() -> bool:
        nodes = get_json(stack, "nodes", "-l", "!kama.dev/fake-node")["items"]
        return all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
            for n in nodes
        )

    eventually(all_ready, timeout=90, what="every real node Ready again")


def test_a_lost_nodes_replica_is_replaced_and_no_longer_routed(
    gateway: GatewayProcess, namespace: str, tmp_path: Path, revive_kubelets: None
) -> None:
    control = gateway.control
    ready_artifact(control, namespace, tmp_path, name="roaming-model", seed=23, shared=True)
    apply(
        control.stack,
        deployment(
            namespace, "roaming", "roaming-model", replicas=2,
            runtime={"contextSize": 512, "concurrency": 2}, resources={"cpu": "100m"},
            scaling={"minReplicas": 2, "maxReplicas": 2},
        ),
    )  # fmt: skip
    wait_ready(control, namespace, "roaming", 2)
    before = {p["metadata"]["name"]: p for p in serving_pods(control, namespace, "roaming")}
    victim_pod = sorted(before.values(), key=lambda p: p["spec"]["nodeName"])[-1]
    victim_node = victim_pod["spec"]["nodeName"]

    node_named(control.stack, victim_node).kill_kubelet()

    def replaced() -> bool:
        pods = serving_pods(control, namespace, "roaming")
        names = {p["metadata"]["name"] for p in pods}
        elsewhere = [p for p in pods if p["spec"].get("nodeName") != victim_node]
        return victim_pod["metadata"]["name"] not in names and len(elsewhere) == 2

    eventually(replaced, timeout=LOSS_TIMEOUT, what="the lost replica replaced on another node")
    wait_ready(control, namespace, "roaming", 2)
    # the model-serving runbook's checks for a lost node, as written
    said = run_runbook(
        control.stack, RUNBOOKS["serving"], "lost-node", {"NS": namespace, "NAME": "roaming"}
    )
    assert re.search(rf"^{re.escape(victim_node)}\s+NotReady", said, re.M), said
    assert victim_pod["metadata"]["name"] not in said and "2/2" in said, said
    # the lost pod's llama-server still answers (only its kubelet died) ...
    served = prompt_tokens_served(victim_pod)
    api = client(gateway)
    for _ in range(6):
        reply = api.chat.completions.create(
            model=f"{namespace}/roaming",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=4,
        )
        assert reply.choices[0].message.content is not None
    # ... and the gateway sent it nothing
    assert prompt_tokens_served(victim_pod) == served
