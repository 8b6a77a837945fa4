"""Where the gateway pod's added latency goes (issue #30 item 2): on Kama as `make dev`
installs it (the chart's gateway pod, API keys on, real nodes), short completions at
concurrency 1 from this host, interleaved round by round through:

- `direct`: straight to the llama-server pod (with its own key);
- `relay-host`: a byte relay on this host (tests/bench/tcp_relay.py), one extra
  userspace hop on loopback;
- `relay-pod`: the same relay inside the gateway pod's network namespace (nsenter),
  so the extra hop crosses pod networking as the gateway's does;
- `gateway`: the gateway pod (route, key check, lease, proxy, relay, metrics);

then the same once more after the gateway's CPU request is raised from the chart's
200m to one CPU (`gateway-1cpu`), the pod rolled. The split of the gateway's added p50:
hop (relay-host - direct), pod networking (relay-pod - relay-host), the gateway's own
work above a byte relay (gateway - relay-pod), its CPU request (gateway - gateway-1cpu).
Its own stack (the chart must be the only Kama on it). Written to
bench-results/gateway_path.json."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.transport.upstream import UpstreamTransport
from kama.serving_plan import LLAMA_PORT
from kamadev.kama_demo import (
    DEMO_MODEL,
    DEMO_NAMESPACE,
    GATEWAY_PORT,
    KAMA_NAMESPACE,
    KamaDemo,
    start_kama_demo,
)
from kamadev.processes import free_port
from kamadev.stack import LocalStack
from tests.bench.bench_gateway import ERRORS, percentile, record, timed_batch
from tests.bench.pod_netns import start_in_pod_netns
from tests.integration.test_serving_plane import is_ready
from tests.support import eventually, get_json, kubectl, serving_headers

pytestmark = pytest.mark.timeout(1800)

ROUNDS = 6
REQUESTS = 100  # per round and target
GATEWAY = "deployment/kama-gateway"
GOAL_ADDED_P50_MS = 1.0


@pytest.fixture(scope="module")
def demo() -> Iterator[KamaDemo]:
    """A stack of its own with Kama installed by the chart, as `make dev` has it."""
    stack = LocalStack().start()
    try:
        installed = start_kama_demo(stack)
        try:
            yield installed
        finally:
            installed.stop()
    finally:
        stack.stop()
        stack.remove_workdir()


def ready_pod(stack: LocalStack, namespace: str, selector: str) -> dict[str, Any] | None:
    pods = get_json(stack, "pods", "-n", namespace, "-l", selector)["items"]
    ready = [p for p in pods if is_ready(p) and not p["metadata"].get("deletionTimestamp")]
    return ready[0] if len(ready) == 1 and len(pods) == 1 else None


def start_relay(
    *, listen: tuple[str, int], upstream: tuple[str, int], in_pod: dict[str, Any] | None = None
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "tests.bench.tcp_relay", listen[0], str(listen[1])]
    return start_in_pod_netns(in_pod, [*argv, upstream[0], str(upstream[1])], listens_on=listen)


def gateway_pod(stack: LocalStack) -> dict[str, Any]:
    pod = eventually(
        lambda: ready_pod(stack, KAMA_NAMESPACE, "app.kubernetes.io/component=gateway"),
        timeout=180,
        what="one ready gateway pod",
    )
    return pod


def measure(
    targets: dict[str, tuple[str, str | None]], body: dict[str, Any]
) -> dict[str, list[float]]:
    """Latencies per target (url, authorization), the targets alternated per round."""
    samples: dict[str, list[float]] = {name: [] for name in targets}

    async def run() -> None:
        client = UpstreamTransport()
        for url, key in targets.values():  # warm every connection pool
            await timed_batch(
                client, url=url, body=body, n=20, concurrency=1, stream=False, authorization=key
            )
        for _ in range(ROUNDS):
            for name, (url, key) in targets.items():
                latencies, _ = await timed_batch(
                    client,
                    url=url,
                    body=body,
                    n=REQUESTS,
                    concurrency=1,
                    stream=False,
                    authorization=key,
                )
                samples[name] += latencies
        await client.aclose()

    asyncio.run(run())
    return samples


def test_where_the_gateway_pods_added_latency_goes(demo: KamaDemo) -> None:
    stack = demo.stack
    bearer = f"Bearer {demo.api_key}"
    body = {"model": DEMO_MODEL, "prompt": "hi", "max_tokens": 1}
    woken = httpx.post(
        f"{demo.gateway_url}/v1/completions",
        json=body,
        headers={"authorization": bearer},
        timeout=300,
    )
    assert woken.status_code == 200, woken.text
    model_pod = eventually(
        lambda: ready_pod(stack, DEMO_NAMESPACE, "kama.dev/deployment=tiny-chat"),
        timeout=60,
        what="the tiny-chat replica",
    )
    model_ip = model_pod["status"]["podIP"]
    direct = (
        f"http://{model_ip}:{LLAMA_PORT}/v1/completions",
        serving_headers(model_pod).get("authorization"),
    )
    results: dict[str, Any] = {"model_node": model_pod["spec"]["nodeName"], "phases": []}
    relays: list[subprocess.Popen[bytes]] = []
    host_port, pod_port = free_port(), 18090
    try:
        relays.append(start_relay(listen=("127.0.0.1", host_port), upstream=(model_ip, LLAMA_PORT)))
        for cpu in ("200m", "1"):
            if cpu != "200m":
                kubectl(
                    stack,
                    "-n",
                    KAMA_NAMESPACE,
                    "set",
                    "resources",
                    GATEWAY,
                    f"--requests=cpu={cpu}",
                )
                kubectl(stack, "-n", KAMA_NAMESPACE, "rollout", "status", GATEWAY, "--timeout=180s")
            pod = gateway_pod(stack)
            gateway_ip = pod["status"]["podIP"]
            relays.append(
                start_relay(
                    listen=(gateway_ip, pod_port),
                    upstream=(model_ip, LLAMA_PORT),
                    in_pod=pod,
                )
            )
            targets = {
                "direct": direct,
                "relay-host": (f"http://127.0.0.1:{host_port}/v1/completions", direct[1]),
                "relay-pod": (f"http://{gateway_ip}:{pod_port}/v1/completions", direct[1]),
                "gateway": (f"http://{gateway_ip}:{GATEWAY_PORT}/v1/completions", bearer),
            }
            samples = measure(targets, body)
            phase: dict[str, Any] = {
                "gateway_cpu_request": cpu,
                "gateway_node": pod["spec"]["nodeName"],
                "requests_per_target": len(samples["direct"]),
            }
            for name, values in samples.items():
                phase[f"{name}_p50_ms"] = round(percentile(values, 50) * 1000, 3)
                phase[f"{name}_p99_ms"] = round(percentile(values, 99) * 1000, 3)
            results["phases"].append(phase)
            relay = relays.pop()
            relay.terminate()
            relay.wait(timeout=10)
    finally:
        for relay in relays:
            relay.terminate()
            relay.wait(timeout=10)
    before, after = results["phases"]

    def p50(phase: dict[str, Any], name: str) -> float:
        return float(phase[f"{name}_p50_ms"])

    results["split_p50_ms"] = {
        "added_by_the_gateway_pod": round(p50(before, "gateway") - p50(before, "direct"), 3),
        "an_extra_userspace_hop": round(p50(before, "relay-host") - p50(before, "direct"), 3),
        "pod_networking": round(p50(before, "relay-pod") - p50(before, "relay-host"), 3),
        "the_gateways_work_above_a_relay": round(
            p50(before, "gateway") - p50(before, "relay-pod"), 3
        ),
        "its_cpu_request_200m_vs_1": round(
            (p50(before, "gateway") - p50(before, "direct"))
            - (p50(after, "gateway") - p50(after, "direct")),
            3,
        ),
    }
    results["goal_added_p50_ms"] = GOAL_ADDED_P50_MS
    results["cores"] = os.cpu_count()
    results["errors"] = {url: dict(Counter(kinds)) for url, kinds in ERRORS.items() if kinds}
    ERRORS.clear()
    results["measured_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    record("gateway_path", results)
    assert not results["errors"], results["errors"]
