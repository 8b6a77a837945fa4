"""The gateway on the local stack with real llama-server replicas and the real
`openai` client: OpenAI and native routes, errors in the OpenAI shape, admin routes
refused, streaming with cancellation reaching llama-server, load split by slot
pressure, a killed replica routed around, scale from zero through one wake
workflow with a bounded queue, a 503 with the reason when a model cannot start,
and idle scale-down that an active stream holds off."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from kama.serving_plan import HTTP_THREADS_BEYOND_SLOTS, LLAMA_PORT
from tests.conftest import GatewayProcess
from tests.integration.test_serving_plane import (
    SERVE_TIMEOUT,
    deployment,
    llama_server_pid,
    md,
    ready_artifact,
    routable,
    serving_pods,
    wait_md_condition,
    wait_ready,
)
from tests.support import apply, eventually, kubectl, serving_headers

# answers that take llama-server seconds: an answer's tokens are counted when it ends
LONG_ANSWER = 6000
LONGEST_ANSWER = 8000  # all a slot of 8192 tokens holds after a short prompt


def tokens_predicted(pod: dict[str, Any]) -> float:
    """llama-server's count of the tokens of the answers it ended (its /metrics)."""
    url = f"http://{pod['status']['podIP']}:{LLAMA_PORT}/metrics"
    text = httpx.get(url, headers=serving_headers(pod), timeout=5).text
    found = re.search(r"^llamacpp:tokens_predicted_total (\S+)$", text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=120)


def serve(
    gw: GatewayProcess, namespace: str, tmp_path: Path, name: str, seed: int, **spec: Any
) -> None:
    control = gw.control
    ready_artifact(control, namespace, tmp_path, name=f"{name}-model", seed=seed, n_ctx=8192)
    apply(control.stack, deployment(namespace, name, f"{name}-model", **spec))


def test_openai_and_native_routes(gateway: GatewayProcess, namespace: str, tmp_path: Path) -> None:
    gw = gateway
    serve(
        gw, namespace, tmp_path, "chat", 71,
        replicas=1, aliases=[f"tiny-{namespace}"],
        runtime={"contextSize": 8192, "concurrency": 2}, resources={"cpu": "100m"},
    )  # fmt: skip
    wait_ready(gw.control, namespace, "chat", 1)
    api = client(gw)
    model = f"{namespace}/chat"
    eventually(
        lambda: any(m.id == model and getattr(m, "ready", False) for m in api.models.list().data),
        timeout=30,
        what="the model listed as ready",
    )
    reply = api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    assert reply.choices[0].message.content and reply.usage and reply.usage.completion_tokens > 0
    assert reply.model == model, "the answer names the model the client asked for"
    chunks = list(
        api.chat.completions.create(
            model=f"tiny-{namespace}",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            stream=True,
        )
    )
    assert len(chunks) > 2 and any(c.choices and c.choices[0].delta.content for c in chunks)
    assert {c.model for c in chunks} == {f"tiny-{namespace}"}, "streamed chunks name the alias"
    completion = api.completions.create(model=model, prompt="once upon", max_tokens=8)
    assert completion.choices[0].text and completion.model == model
    native = httpx.post(
        f"{gw.url}/completion",
        headers={"X-Kama-Model": model},
        json={"prompt": "once upon", "n_predict": 4},
        timeout=60,
    )
    assert native.status_code == 200 and native.json()["content"]
    tokens = httpx.post(
        f"{gw.url}/models/{namespace}/chat/tokenize", json={"content": "hello"}, timeout=30
    )
    assert tokens.status_code == 200 and tokens.json()["tokens"]

    # errors, in the OpenAI shape
    with pytest.raises(openai.NotFoundError) as missing:
        api.chat.completions.create(
            model=f"{namespace}/nope", messages=[{"role": "user", "content": "x"}]
        )
    assert "does not exist" in str(missing.value)
    for method, path in (("POST", "/slots/0?action=erase"), ("POST", "/props"), ("GET", "/slots")):
        refused = httpx.request(method, f"{gw.url}{path}", json={}, timeout=10)
        assert refused.status_code in (403, 404) and refused.json()["error"]["message"]
    big = httpx.post(
        f"{gw.url}/v1/completions",
        content=b'{"model": "x", "prompt": "' + b"a" * (9 * 1024 * 1024) + b'"}',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
    bad = httpx.post(
        f"{gw.url}/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]

    # a client that goes away mid-stream frees its slot
    (pod,) = routable(serving_pods(gw.control, namespace, "chat"))
    ip = pod["status"]["podIP"]
    predicted = tokens_predicted(pod)
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/completions",
        json={"model": model, "prompt": "tell a long story", "max_tokens": LONG_ANSWER,
              "stream": True, "ignore_eos": True},
        timeout=60,
    ) as stream:  # fmt: skip
        lines = stream.iter_lines()
        assert any(line.startswith("data:") for line in [next(lines), next(lines), next(lines)])
        busy = httpx.get(
            f"http://{ip}:{LLAMA_PORT}/slots", headers=serving_headers(pod), timeout=5
        ).json()
        assert any(s["is_processing"] for s in busy)
    eventually(
        lambda: (
            not any(
                s["is_processing"]
                for s in httpx.get(
                    f"http://{ip}:{LLAMA_PORT}/slots", headers=serving_headers(pod), timeout=5
                ).json()
            )
        ),
        timeout=10,
        what="the slot to go idle after the client left",
    )
    # idle because cancelled, not because done: a finished answer adds its tokens (all
    # LONG_ANSWER, as it ignores EOS) to llama-server's count, a cancelled one none
    added = tokens_predicted(pod) - predicted
    assert added < LONG_ANSWER, f"cancellation reached llama-server ({added:.0f} tokens)"

    # a client that gives up on a long non-streamed answer is let go at once: the
    # gateway closes its upstream connection (this llama-server build keeps generating
    # a non-streamed answer whose client left, even when called directly)
    predicted = tokens_predicted(pod)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gw.url}/v1/completions",
            json={"model": model, "prompt": "tell a long story", "max_tokens": LONGEST_ANSWER,
                  "ignore_eos": True},
            timeout=httpx.Timeout(10, read=1.0),
        )  # fmt: skip
    eventually(
        lambda: (
            f'kama_gateway_in_flight{{model="{model}"}} 0.0'
            in httpx.get(f"{gw.ops_url}/metrics", timeout=10).text
        ),
        timeout=10,
        what="the gateway to let go of the request whose client left",
    )
    # let go before llama-server ended the answer (which then adds its tokens to its
    # count), not when it ended it
    added = tokens_predicted(pod) - predicted
    assert added < LONGEST_ANSWER, "the gateway held on to a request nobody waits for"
    left = f'kama_gateway_requests_total{{code="499",model="{model}",route="completions"}} 1.0'
    assert left in httpx.get(f"{gw.ops_url}/metrics", timeout=10).text
    metrics = httpx.get(f"{gw.ops_url}/metrics", timeout=10).text
    assert f'kama_gateway_requests_total{{code="200",model="{model}",route="chat"}}' in metrics
    assert "tell a long story" not in metrics


def completion_pod(gw: GatewayProcess, model: str, max_tokens: int = 24) -> str:
    try:
        r = httpx.post(
            f"{gw.url}/v1/completions",
            json={"model": model, "prompt": "count", "max_tokens": max_tokens, "ignore_eos": True},
            timeout=60,
        )
    except httpx.HTTPError as exc:
        return f"error:{type(exc).__name__}"
    return r.headers.get("x-kama-pod", "") if r.status_code == 200 else f"status:{r.status_code}"


def test_load_split_by_slot_pressure_and_killed_replica(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    gw = gateway
    serve(
        gw, namespace, tmp_path, "pair", 72,
        replicas=2, runtime={"contextSize": 512, "concurrency": 4},
        resources={"cpu": "100m"}, scaling={"maxReplicas": 2, "minReplicas": 2},
    )  # fmt: skip
    wait_ready(gw.control, namespace, "pair", 2)
    model = f"{namespace}/pair"
    eventually(lambda: completion_pod(gw, model, 1).startswith("pair-"), timeout=30, what="routing")
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        # long enough that the 32 overlap: the split comes from slot pressure, not
        # from the latency tie-break that decides between two idle replicas
        pods = list(pool.map(lambda _: completion_pod(gw, model, 256), range(32)))
    counts = Counter(pods)
    assert all(p.startswith("pair-") for p in pods), counts
    # each replica took at least its 4 slots' worth: the burst filled both replicas'
    # slots instead of queueing on the faster one (how the rest splits follows each
    # replica's speed, which on two real nodes depends on what else they run)
    assert len(counts) == 2 and min(counts.values()) >= 4, f"load split by slots: {counts}"

    victim = sorted(counts)[0]
    (victim_pod,) = [
        p for p in serving_pods(gw.control, namespace, "pair") if p["metadata"]["name"] == victim
    ]
    pid = llama_server_pid(victim_pod["status"]["podIP"])
    assert pid is not None
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        during = [pool.submit(completion_pod, gw, model, 64) for _ in range(32)]
        time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        finished = [f.result(timeout=90) for f in during]  # none hangs
    assert len(finished) == 32
    after = [completion_pod(gw, model, 4) for _ in range(8)]
    assert all(p.startswith("pair-") and p != victim for p in after), after


def wake_workflows(gw: GatewayProcess, namespace: str, name: str) -> list[str]:
    stack = gw.control.stack
    listed = subprocess.run(
        [
            str(stack.binaries.temporal), "workflow", "list", "--address", stack.temporal.address,
            "--query", f"WorkflowId = 'wake/{namespace}/{name}'", "--output", "json",
        ],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [row["execution"]["runId"] for row in json.loads(listed or "[]")]


def scale_events(gw: GatewayProcess, namespace: str, name: str) -> list[str]:
    events = json.loads(
        kubectl(
            gw.control.stack, "get", "events", "-n", namespace, "-o", "json",
            "--field-selector", f"involvedObject.name={name},reason=Scaled",
        ).stdout
    )["items"]  # fmt: skip
    return [e["message"] for e in events]


def test_scale_from_zero_wakes_once(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    gw = gateway
    serve(
        gw, namespace, tmp_path, "sleepy", 73,
        runtime={"contextSize": 512, "concurrency": 4}, resources={"cpu": "100m"},
        scaling={"maxQueuedRequests": 50, "coldStartTimeout": "2m"},
    )  # fmt: skip
    wait_md_condition(gw.control, namespace, "sleepy", "ScaledToZero")
    assert serving_pods(gw.control, namespace, "sleepy") == []
    model = f"{namespace}/sleepy"
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        answered = list(pool.map(lambda _: completion_pod(gw, model, 4), range(20)))
    assert all(p.startswith("sleepy-") for p in answered), Counter(answered)
    assert len(wake_workflows(gw, namespace, "sleepy")) == 1
    woken = [m for m in scale_events(gw, namespace, "sleepy") if "request arrived" in m]
    assert len(woken) == 1, woken
    assert md(gw.control, namespace, "sleepy")["spec"]["replicas"] == 1
    assert md(gw.control, namespace, "sleepy")["status"].get("lastWake")


def test_queue_overflow_and_unstartable_model(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    gw = gateway
    serve(
        gw, namespace, tmp_path, "narrow", 74,
        runtime={"contextSize": 512}, resources={"cpu": "100m"},
        scaling={"maxQueuedRequests": 2},
    )  # fmt: skip
    model = f"{namespace}/narrow"
    eventually(
        lambda: md(gw.control, namespace, "narrow").get("status", {}).get("fingerprint"),
        timeout=60,
        what="planned",
    )

    def call(_: int) -> httpx.Response:
        return httpx.post(
            f"{gw.url}/v1/completions",
            json={"model": model, "prompt": "x", "max_tokens": 2},
            timeout=120,
        )

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(call, range(6)))
    codes = Counter(r.status_code for r in responses)
    assert codes[429] >= 1 and codes[200] >= 1, codes
    limited = next(r for r in responses if r.status_code == 429)
    assert limited.headers["retry-after"] and limited.json()["error"]["code"] == "queue_full"

    apply(
        gw.control.stack,
        deployment(
            namespace, "toolarge", "narrow-model",
            placement={"mode": "CPU"},
            runtime={"contextSize": 1 << 22, "concurrency": 256},
            scaling={"coldStartTimeout": "4s"},
        ),
    )  # fmt: skip
    wait_md_condition(gw.control, namespace, "toolarge", "FitFailed")
    time.sleep(1)  # let the gateway's watch see the reason
    refused = httpx.post(
        f"{gw.url}/v1/completions",
        json={"model": f"{namespace}/toolarge", "prompt": "x", "max_tokens": 2},
        timeout=60,
    )
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert "FitFailed" in refused.json()["error"]["message"]

    # with a long coldStartTimeout the 503 still comes as soon as the status says the
    # model cannot start: here the request is sent as soon as the gateway knows the
    # model, so it is usually held before the FitFailed condition is written
    apply(
        gw.control.stack,
        deployment(
            namespace, "stuck", "narrow-model",
            placement={"mode": "CPU"},
            runtime={"contextSize": 1 << 22, "concurrency": 256},
            scaling={"coldStartTimeout": "10m"},
        ),
    )  # fmt: skip
    started = time.monotonic()
    while True:
        held = httpx.post(
            f"{gw.url}/v1/completions",
            json={"model": f"{namespace}/stuck", "prompt": "x", "max_tokens": 2},
            timeout=90,  # far short of the 10m coldStartTimeout: a request held to it fails
        )
        if held.status_code != 404 or time.monotonic() - started > 30:
            break
        time.sleep(0.05)  # the gateway's watch has not brought the deployment yet
    assert held.status_code == 503 and "FitFailed" in held.json()["error"]["message"], held.text
    # refused because the status says it cannot start, not at the cold-start timeout
    # (whose 503 names the status's reason too)
    assert held.json()["error"]["code"] == "cannot_start", held.text


def test_idle_model_goes_back_to_zero_unless_streaming(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    gw = gateway
    serve(
        gw, namespace, tmp_path, "idler", 75,
        replicas=1, runtime={"contextSize": 8192}, resources={"cpu": "100m"},
        scaling={"idleTimeout": "4s", "drainTimeout": "10s"},
    )  # fmt: skip
    wait_ready(gw.control, namespace, "idler", 1)
    model = f"{namespace}/idler"
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/completions",
        json={
            "model": model,
            "prompt": "go",
            "max_tokens": 8000,
            "stream": True,
            "ignore_eos": True,
        },
        timeout=120,
    ) as stream:
        started = time.monotonic()
        read_on = False  # whether the stream was still going when the reader stopped
        for number, _line in enumerate(stream.iter_lines()):
            if time.monotonic() - started > 10:  # well past the 4s idleTimeout
                read_on = True
                break
            if number % 20 == 0:
                assert md(gw.control, namespace, "idler")["spec"]["replicas"] == 1, (
                    "kept up while a stream is active"
                )
            time.sleep(0.05)  # a slow reader: the request stays in flight
        assert read_on, "the stream lasted past the idle timeout"
        assert md(gw.control, namespace, "idler")["spec"]["replicas"] == 1
    eventually(
        lambda: (
            md(gw.control, namespace, "idler")["spec"]["replicas"] == 0
            and not serving_pods(gw.control, namespace, "idler")
        ),
        timeout=SERVE_TIMEOUT,
        what="idle scale to zero",
    )
    assert any("idleTimeout" in m for m in scale_events(gw, namespace, "idler"))


def connections_to(ip: str, port: int) -> int:
    """Established TCP connections whose far end is `ip:port`, from /proc/net/tcp
    (the stack's pods are processes on this machine's loopback addresses)."""
    address = "".join(f"{int(part):02X}" for part in reversed(ip.split(".")))
    far = f"{address}:{port:04X}"
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[2] == far and line.split()[3] == "01")


class ConnectionWatch:
    """The most connections open to one replica's llama-server port at any moment
    while it runs, sampled every few milliseconds in a thread."""

    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.most = max(self.most, connections_to(self.ip, LLAMA_PORT))
            time.sleep(0.005)

    def __enter__(self) -> ConnectionWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def test_a_burst_at_a_warm_model_is_answered_in_waves_without_stalls(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    """4x the slots at once: the gateway keeps at most `slots` requests (so at most
    `slots` connections) on the replica and queues the rest, so no connection waits
    for one of llama-server's HTTP threads (each of which keeps an idle keep-alive
    connection for seconds). Besides the gateway's, the replica's port sees the
    gateway's load poll and its supervisor's health checks: at most `slots` + 3.

    No bound on time (a busy host stretches any): a burst stalled when a connection
    waited for one of llama-server's HTTP threads, each held by an idle keep-alive
    connection for 2-5 s. With at most `slots` + 3 connections every one has a thread
    (it has `slots` + HTTP_THREADS_BEYOND_SLOTS), so none waits. The spread of the
    answers and the latency of one wave are printed."""
    gw = gateway
    slots = 4
    serve(
        gw, namespace, tmp_path, "bursty", 76,
        replicas=1, runtime={"contextSize": 512, "concurrency": slots}, resources={"cpu": "100m"},
    )  # fmt: skip
    wait_ready(gw.control, namespace, "bursty", 1)
    model = f"{namespace}/bursty"
    eventually(
        lambda: completion_pod(gw, model, 1).startswith("bursty-"), timeout=30, what="routing"
    )
    (pod,) = routable(serving_pods(gw.control, namespace, "bursty"))

    def burst(size: int) -> list[tuple[str, float]]:
        """`size` requests sent at the same moment: (pod, when answered)."""
        start = threading.Barrier(size)

        def one(_: int) -> tuple[str, float]:
            start.wait()
            return completion_pod(gw, model, 16), time.monotonic()

        with concurrent.futures.ThreadPoolExecutor(size) as pool:
            return list(pool.map(one, range(size)))

    one_wave = 0.0
    for _ in range(3):
        started = time.monotonic()
        one_wave = max(one_wave, max(at for _, at in burst(slots)) - started)
    time.sleep(3)  # past every keep-alive expiry: the burst starts from a clean slate
    with ConnectionWatch(pod["status"]["podIP"]) as watch:
        results = burst(4 * slots)
    assert all(name.startswith("bursty-") for name, _ in results), results
    assert watch.most <= slots + 3, f"{watch.most} connections to a replica with {slots} slots"
    assert slots + 3 < slots + HTTP_THREADS_BEYOND_SLOTS, "a connection could wait for a thread"
    finished = sorted(at for _, at in results)
    spread = finished[-1] - finished[0]
    print(f"burst: spread {spread:.2f}s, one wave {one_wave:.2f}s, {watch.most} connections")
