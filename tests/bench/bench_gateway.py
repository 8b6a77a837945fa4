"""Benchmarks of the gateway (run on demand: `make bench`), each against a baseline
measured in the same run, printed and written to bench-results/.

- added latency: short non-streamed completions and time to first byte of streamed
  ones, through the gateway vs straight to the same llama-server pod, interleaved,
  at concurrency 1, 16 and 64 (targets at concurrency 1: ≤ 1 ms p50, ≤ 5 ms p99 added)
- throughput at concurrency 64 against a fast upstream (tests/bench/fast_upstream.py)
  run inside a pod's network namespace, where its pod IP exists on real nodes (so
  the gateway is what is measured): gateway / direct (target ≥ 0.95), the
  gateway's CPU time per proxied request, and the same for the least a proxy can do
  (`PROXY_FLOOR`: parse, forward on a pooled connection, write back), which is the
  ceiling of any Python proxy in this setup
- the server hosting the gateway: the same hot path (route, lease, proxy, lean
  upstream client, relay) under granian RSGI (as it ships), granian ASGI and
  uvicorn (httptools, uvloop), against the fast upstream: CPU per proxied request,
  throughput at concurrency 64 and added latency at concurrency 1 (no stack needed)
- scale from zero: time to first byte through the gateway for a model at zero,
  minus llama-server's own start-to-healthy time for the same model and flags
  measured in the same run (target ≤ 1 s p50)
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from gateway.transport.upstream import UpstreamBody, UpstreamTransport
from kama.serving_plan import LLAMA_PORT, ServingPlan
from kamadev.binaries import REPO_ROOT
from kamadev.llama_process import stop, wait_healthy
from kamadev.processes import free_port
from kamadev.stack import SHELL_IMAGE
from tests.bench.fast_upstream import serve_fast_upstream
from tests.bench.pod_netns import start_in_pod_netns
from tests.conftest import GatewayProcess, KamaControl
from tests.integration.test_serving_plane import (
    deployment,
    ready_artifact,
    routable,
    serving_pods,
    wait_ready,
)
from tests.support import apply, eventually, get_json, kubectl, serving_headers

RESULTS = REPO_ROOT / "bench-results"
ROUNDS = 5
COLD_STARTS = 5
FAST_REQUESTS = 3000
THROUGHPUT_ROUNDS = 5  # interleaved; the median round counts
LATENCY_REQUESTS = 100  # per round and target: enough samples for a p99 at concurrency 1
ERRORS: dict[str, list[str]] = {}  # url -> failures seen (reported, not hidden)

PROXY_FLOOR = """
# The least any HTTP proxy can do per request, in Python on uvloop: parse the request
# with httptools, forward it on a pooled keep-alive connection, parse the answer and
# write it back. No routing, metrics, limits, errors or streaming: a ceiling, not a
# gateway.
import asyncio, sys, httptools, uvloop
UPSTREAM = (sys.argv[2], 8080)
pool = []
class Upstream(asyncio.Protocol):
    def __init__(self):
        self.parser = httptools.HttpResponseParser(self)
        self.client = None
        self.length = b"0"
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.parser.feed_data(data)
    def on_header(self, name, value):
        if name.lower() == b"content-length":
            self.length = value
    def on_headers_complete(self):
        self.client.transport.write(
            b"HTTP/1.1 %d OK\\r\\ncontent-type: application/json\\r\\ncontent-length: %s\\r\\n\\r\\n"
            % (self.parser.get_status_code(), self.length)
        )
    def on_body(self, body):
        self.client.transport.write(body)
    def on_message_complete(self):
        self.client = None
        pool.append(self)
class Client(asyncio.Protocol):
    def __init__(self):
        self.parser = httptools.HttpRequestParser(self)
        self.body = []
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.parser.feed_data(data)
    def on_url(self, url):
        self.url = url
    def on_body(self, body):
        self.body.append(body)
    def on_message_complete(self):
        body, self.body = b"".join(self.body), []
        if pool:
            self.forward(pool.pop(), body)
        else:
            asyncio.ensure_future(self.connect(body))
    async def connect(self, body):
        _, upstream = await asyncio.get_running_loop().create_connection(Upstream, *UPSTREAM)
        self.forward(upstream, body)
    def forward(self, upstream, body):
        upstream.client = self
        upstream.transport.write(
            b"POST %s HTTP/1.1\\r\\nhost: upstream\\r\\ncontent-type: application/json\\r\\n"
            b"content-length: %d\\r\\n\\r\\n%s" % (self.url, len(body), body)
        )
async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Client, "127.0.0.1", int(sys.argv[1]), backlog=2048)
    await server.serve_forever()
uvloop.run(main())
"""


def fast_upstream_pod(namespace: str, plan: ServingPlan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "fast-upstream",
            "namespace": namespace,
            "labels": {"kama.dev/role": "server", "kama.dev/deployment": "fast"},
        },
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "ip-holder",
                    "image": SHELL_IMAGE,
                    "command": ["sh", "-c", "exec sleep 3600"],
                    "env": [{"name": "KAMA_SERVING_PLAN", "value": plan.to_json()}],
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                }
            ],
        },
    }


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def record(name: str, data: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2))
    print(f"\n{name}: " + json.dumps(data, indent=2))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def post(
    client: UpstreamTransport,
    *,
    url: httpx.URL,
    payload: bytes,
    wait_s: float,
    authorization: str | None = None,
) -> UpstreamBody:
    """A JSON POST through the lean client; the answer's body is the caller's to read."""
    headers = [(b"content-type", b"application/json")]
    if authorization is not None:
        headers.append((b"authorization", authorization.encode()))
    return await client.request(
        host=url.host,
        port=url.port or 80,
        method="POST",
        target=url.path,
        headers=headers,
        body=payload,
        connect_timeout=min(wait_s, 10),
        read_timeout=wait_s,
    )


async def answered(client: UpstreamTransport, *, url: str, body: dict[str, Any]) -> bool:
    """One POST answered 200 (waiting for a route without blocking this event loop,
    which also serves the in-process upstream)."""
    try:
        response = await post(
            client, url=httpx.URL(url), payload=json.dumps(body).encode(), wait_s=5
        )
    except httpx.HTTPError:
        return False
    await response.aclose()
    return response.status == 200


async def timed_batch(
    client: UpstreamTransport,
    *,
    url: str,
    body: dict[str, Any],
    n: int,
    concurrency: int,
    stream: bool,
    authorization: str | None = None,
) -> tuple[list[float], float]:
    """Latencies (to the whole answer, or to the first body byte when streaming) and
    the wall time of `n` requests from `concurrency` keep-alive connections. The
    client is the gateway's own lean HTTP/1.1 client, so the load generator's cost
    per request stays small next to what it measures, for both targets alike."""
    parsed = httpx.URL(url)
    payload = json.dumps(body).encode()
    latencies: list[float] = []
    remaining = [n]
    errors = ERRORS.setdefault(url, [])

    async def worker() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            started = time.perf_counter()
            try:
                response = await post(
                    client, url=parsed, payload=payload, wait_s=120, authorization=authorization
                )
                try:
                    chunks = aiter(response)
                    await anext(chunks)
                    if stream:
                        latencies.append(time.perf_counter() - started)
                    async for _ in chunks:
                        pass
                    if not stream:
                        latencies.append(time.perf_counter() - started)
                finally:
                    await response.aclose()
            except httpx.HTTPError as exc:
                errors.append(type(exc).__name__)
                continue
            if response.status != 200:
                errors.append(str(response.status))

    wall = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - wall


SERVERS = ("granian-rsgi", "granian-asgi", "uvicorn")


def start_host(server: str, port: int, upstream_port: int) -> subprocess.Popen[bytes]:
    """The hot path under `server`, as a process (tests/bench/gateway_hosts.py)."""
    argv = [sys.executable, "-m", "tests.bench.gateway_hosts", server, str(port)]
    return subprocess.Popen([*argv, "127.0.0.1", str(upstream_port)], cwd=REPO_ROOT)


def test_servers_hosting_the_gateway() -> None:
    ports = {server: free_port() for server in SERVERS}
    upstream_port = free_port()
    hosts = {server: start_host(server, ports[server], upstream_port) for server in SERVERS}
    results: dict[str, Any] = {}

    async def run() -> None:
        upstream = await asyncio.start_server(
            serve_fast_upstream, "127.0.0.1", upstream_port, backlog=1024
        )
        client = UpstreamTransport()
        body = {"model": "bench/fast", "prompt": "x"}
        urls = {s: f"http://127.0.0.1:{ports[s]}/v1/completions" for s in SERVERS}
        direct = f"http://127.0.0.1:{upstream_port}/v1/completions"
        for server, url in urls.items():
            for _ in range(300):
                if await answered(client, url=url, body=body):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"{server} never answered")
            await timed_batch(client, url=url, body=body, n=500, concurrency=16, stream=False)
        walls: dict[str, list[float]] = {s: [] for s in SERVERS}
        cpu = dict.fromkeys(SERVERS, 0.0)
        for _ in range(THROUGHPUT_ROUNDS):  # interleaved, so drift hits every server alike
            for server, url in urls.items():
                before = process_cpu_s(hosts[server].pid)
                _, wall = await timed_batch(
                    client, url=url, body=body, n=FAST_REQUESTS, concurrency=64, stream=False
                )
                cpu[server] += process_cpu_s(hosts[server].pid) - before
                walls[server].append(wall)
        latency: dict[str, list[float]] = {s: [] for s in ("direct", *SERVERS)}
        for _ in range(ROUNDS):
            for name, url in (("direct", direct), *urls.items()):
                samples, _ = await timed_batch(
                    client, url=url, body=body, n=LATENCY_REQUESTS, concurrency=1, stream=False
                )
                latency[name] += samples
        for server in SERVERS:
            row: dict[str, Any] = {
                "cpu_us_per_request": round(
                    cpu[server] / (THROUGHPUT_ROUNDS * FAST_REQUESTS) * 1e6
                ),
                "rps_c64": round(FAST_REQUESTS / statistics.median(walls[server])),
            }
            for q in (50, 99):
                added = percentile(latency[server], q) - percentile(latency["direct"], q)
                row[f"added_p{q}_ms_c1"] = round(added * 1000, 3)
            results[server] = row
        results["direct_p50_ms_c1"] = round(percentile(latency["direct"], 50) * 1000, 3)
        results["cores"] = os.cpu_count()
        await client.aclose()
        upstream.close()

    try:
        asyncio.run(run())
    finally:
        for host in hosts.values():
            host.terminate()
            host.wait(timeout=30)
    results["errors"] = {url: dict(Counter(kinds)) for url, kinds in ERRORS.items() if kinds}
    ERRORS.clear()
    record("gateway_servers", results)


def test_gateway_added_latency_and_throughput(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    gw = gateway
    control = gw.control
    ready_artifact(control, namespace, tmp_path, name="bench", seed=81)
    apply(
        control.stack,
        deployment(
            namespace, "bench", "bench", replicas=1,
            runtime={"contextSize": 256, "concurrency": 64}, resources={"cpu": "100m"},
        ),
    )  # fmt: skip
    wait_ready(control, namespace, "bench", 1)
    (pod,) = routable(serving_pods(control, namespace, "bench"))
    direct = f"http://{pod['status']['podIP']}:{LLAMA_PORT}/v1/completions"
    pod_key = serving_headers(pod).get("authorization")
    through = f"{gw.url}/v1/completions"
    model = f"{namespace}/bench"
    results: dict[str, Any] = {}

    async def run() -> None:
        client = UpstreamTransport()
        for stream in (False, True):
            body = {"model": model, "prompt": "hi", "max_tokens": 1 if not stream else 4}
            body["stream"] = stream
            await timed_batch(client, url=through, body=body, n=20, concurrency=4, stream=stream)
            for concurrency in (1, 16, 64):
                n = max(LATENCY_REQUESTS, concurrency * 2)
                samples: dict[str, list[float]] = {"direct": [], "gateway": []}
                for _ in range(ROUNDS):  # interleaved: direct, gateway, direct, ...
                    for name, url in (("direct", direct), ("gateway", through)):
                        latencies, _ = await timed_batch(
                            client,
                            url=url,
                            body=body,
                            n=n,
                            concurrency=concurrency,
                            stream=stream,
                            # the pod's own llama-server key, as the gateway sends it
                            authorization=pod_key if name == "direct" else None,
                        )
                        samples[name] += latencies
                key = f"{'ttft' if stream else 'latency'}_c{concurrency}"
                row = {}
                for q in (50, 99):
                    d, g = percentile(samples["direct"], q), percentile(samples["gateway"], q)
                    row[f"direct_p{q}_ms"] = round(d * 1000, 2)
                    row[f"gateway_p{q}_ms"] = round(g * 1000, 2)
                    row[f"added_p{q}_ms"] = round((g - d) * 1000, 2)
                results[key] = row
        await client.aclose()

    asyncio.run(run())

    # A fast upstream, so the gateway itself is what is measured: a pod that only
    # holds an IP, and a process of this host answering inside its network namespace
    # (tests/bench/fast_upstream.py; the pod IP exists only there), which is also what
    # its readiness probe finds; the model routes to it.
    apply(control.stack, deployment(namespace, "fast", "no-such-artifact"))
    plan = ServingPlan(entrypoint="x", manifest_digest="0" * 64, ctx_total=64, concurrency=64)
    apply(control.stack, fast_upstream_pod(namespace, plan))
    fast_pod = eventually(
        lambda: (
            pod
            if (pod := get_json(control.stack, "pod", "fast-upstream", "-n", namespace))
            .get("status", {})
            .get("podIP")
            else None
        ),
        timeout=60,
        what="the fast upstream pod's IP",
    )
    fast_ip = fast_pod["status"]["podIP"]
    upstream = start_in_pod_netns(
        fast_pod,
        [sys.executable, "-m", "tests.bench.fast_upstream", fast_ip, "8080"],
        listens_on=(fast_ip, 8080),
    )

    async def throughput() -> None:
        client = UpstreamTransport()
        for _ in range(600):
            if await answered(client, url=through, body={"model": f"{namespace}/fast"}):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the gateway never routed to the fast upstream")
        floor_url = f"http://127.0.0.1:{floor_port}/v1/completions"
        for _ in range(300):
            if await answered(client, url=floor_url, body={}):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the proxy floor never answered")
        body = {"model": f"{namespace}/fast", "prompt": "x"}
        targets = {  # name -> (url, the process whose CPU time is counted)
            "direct": (f"http://{fast_ip}:8080/v1/completions", upstream.pid),
            "gateway": (through, gw.process.popen.pid),
            "proxy_floor": (f"http://127.0.0.1:{floor_port}/v1/completions", floor.pid),
        }
        walls: dict[str, list[float]] = {name: [] for name in targets}
        cpu: dict[str, float] = dict.fromkeys(targets, 0.0)
        own_cpu: dict[str, float] = dict.fromkeys(targets, 0.0)  # this process, per target
        for _ in range(THROUGHPUT_ROUNDS):
            for name, (url, pid) in targets.items():
                before, own_before = process_cpu_s(pid), process_cpu_s(os.getpid())
                _, wall = await timed_batch(
                    client, url=url, body=body, n=FAST_REQUESTS, concurrency=64, stream=False
                )
                cpu[name] += process_cpu_s(pid) - before
                own_cpu[name] += process_cpu_s(os.getpid()) - own_before
                walls[name].append(wall)
        rps = {name: FAST_REQUESTS / statistics.median(walls[name]) for name in targets}
        per_request = {
            name: round(cpu[name] / (THROUGHPUT_ROUNDS * FAST_REQUESTS) * 1e6) for name in targets
        }
        own_per_request = {
            name: round(own_cpu[name] / (THROUGHPUT_ROUNDS * FAST_REQUESTS) * 1e6)
            for name in targets
        }
        results["fast_upstream_c64"] = {
            "direct_rps": round(rps["direct"]),
            "gateway_rps": round(rps["gateway"]),
            "ratio": round(rps["gateway"] / rps["direct"], 3),
            "gateway_cpu_us_per_request": per_request["gateway"],
            # the fast upstream's own CPU per request (in the direct rounds)
            "upstream_cpu_us_per_request": per_request["direct"],
            # the load generator (this process) per request, for each target
            "client_cpu_us_per_request_direct": own_per_request["direct"],
            "client_cpu_us_per_request_through_gateway": own_per_request["gateway"],
            "client_cpu_us_per_request_through_floor": own_per_request["proxy_floor"],
            # the least a proxy can do, on the same upstream: the ceiling of any
            # Python proxy here (the extra hop costs the client and upstream too)
            "proxy_floor_rps": round(rps["proxy_floor"]),
            "proxy_floor_ratio": round(rps["proxy_floor"] / rps["direct"], 3),
            "proxy_floor_cpu_us_per_request": per_request["proxy_floor"],
            "gateway_vs_proxy_floor": round(rps["gateway"] / rps["proxy_floor"], 3),
            "cores": os.cpu_count(),
        }
        await client.aclose()

    floor_port = free_port()
    floor_app = tmp_path / "proxy_floor.py"
    floor_app.write_text(PROXY_FLOOR)
    floor = subprocess.Popen([sys.executable, str(floor_app), str(floor_port), fast_ip])
    try:
        asyncio.run(throughput())
    finally:
        for process in (floor, upstream):
            process.terminate()
            process.wait(timeout=10)
    results["errors"] = {
        ("gateway" if url.startswith(gw.url) else "direct"): dict(Counter(kinds))
        for url, kinds in ERRORS.items()
        if kinds
    }
    record("gateway_latency_throughput", results)
    kubectl(
        control.stack,
        "delete",
        "pod",
        "fast-upstream",
        "-n",
        namespace,
        "--grace-period=0",
        "--force",
    )
    # leave a quiet cluster to the next benchmark: no replica idling, no pods polled
    kubectl(control.stack, "delete", "md", "bench", "fast", "-n", namespace, "--wait=true")


def runtime_started_at(control: KamaControl, namespace: str, pod: dict[str, Any]) -> float:
    """When the pod's supervisor launched llama-server (its first log line), as a
    Unix time: what the control plane and the pod start took, before llama-server."""
    logs = kubectl(control.stack, "logs", pod["metadata"]["name"], "-n", namespace).stdout
    stamp = logs.splitlines()[0][: len("2026-01-01 00:00:00,000")]
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def llama_start_to_healthy(binary: Path, model: Path, plan: ServingPlan) -> float:
    port = free_port()
    args = plan.llama_server_args(model_dir=str(model.parent), host="127.0.0.1", port=port)
    process = subprocess.Popen(
        [str(binary), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        return wait_healthy(
            url=f"http://127.0.0.1:{port}", process=process, timeout_s=120, poll_s=0.02
        )
    finally:
        stop(process, grace_s=30)


def test_scale_from_zero_overhead(gateway: GatewayProcess, namespace: str, tmp_path: Path) -> None:
    gw = gateway
    control = gw.control
    artifact = ready_artifact(control, namespace, tmp_path, name="cold", seed=82)
    apply(
        control.stack,
        deployment(
            namespace, "cold", "cold",
            runtime={"contextSize": 512, "concurrency": 2}, resources={"cpu": "100m"},
            scaling={"idleTimeout": "10m"},
        ),
    )  # fmt: skip
    fingerprint = eventually(
        lambda: (
            get_json(control.stack, "md", "cold", "-n", namespace)
            .get("status", {})
            .get("fingerprint")
        ),
        timeout=60,
        what="the deployment planned",
    )
    assert fingerprint
    digest = artifact["status"]["manifestDigest"].removeprefix("sha256:")
    plan = ServingPlan(
        entrypoint="cold.gguf", manifest_digest=digest, ctx_total=1024, concurrency=2
    )
    model = tmp_path / "cold.gguf"
    woken, healthy, to_runtime = [], [], []
    for _ in range(COLD_STARTS):
        eventually(
            lambda: serving_pods(control, namespace, "cold") == [], timeout=120, what="at zero"
        )
        time.sleep(1)
        started, started_wall = time.perf_counter(), time.time()
        with httpx.stream(
            "POST", f"{gw.url}/v1/completions",
            json={"model": f"{namespace}/cold", "prompt": "hi", "max_tokens": 1, "stream": True},
            timeout=120,
        ) as response:  # fmt: skip
            for _ in response.iter_raw():
                woken.append(time.perf_counter() - started)
                break
        (pod,) = serving_pods(control, namespace, "cold")
        to_runtime.append(runtime_started_at(control, namespace, pod) - started_wall)
        healthy.append(llama_start_to_healthy(control.stack.binaries.llama_server, model, plan))
        kubectl(control.stack, "scale", "md", "cold", "-n", namespace, "--replicas=0")
    overheads = [w - h for w, h in zip(woken, healthy, strict=True)]
    record(
        "gateway_scale_from_zero",
        {
            "ttfb_from_zero_s": [round(w, 3) for w in woken],
            "llama_start_to_healthy_s": [round(h, 3) for h in healthy],
            "request_to_llama_server_launch_s": [round(t, 3) for t in to_runtime],
            "control_plane_overhead_p50_s": round(statistics.median(overheads), 3),
            "target_p50_s": 1.0,
        },
    )
