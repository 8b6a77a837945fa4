"""Scale-out reaction: from the moment a model's demand rises above its target (two
streams on one replica of one slot, target 100 %) until the second replica is Ready
and routable, through the whole control plane (gateway demand report, the
DeploymentWorkflow's decision after its scale-up window, `/scale`, the rollout, the
node starting the pod, the runtime verifying the artifact and starting llama-server,
the readiness probe, the status reaching the API server).

The baseline, measured in the same run on the same model file: llama-server's own
load time (process start until `/health` answers 200), started directly with the
replicas' flags. What is left
after the baseline and the configured scale-up window is the control plane's share
(the issue's goal: at most 2 s). Written to bench-results/scale_out.json with each
phase's share of the median trial.

The replicas run llama-server with one thread (`runtime.threads: 1`): the load is two
endless streams, and a llama-server generating with its default threads spins on
every core of this 2-core machine, which also runs the whole control plane being
measured (API server, etcd, Temporal, Kama, both kubelets and containerds). On a
cluster the control plane does not share the serving replica's cores."""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client as k8s

from kama.api import GROUP, VERSION
from kama.contracts import DEPLOYMENTS
from kama.serving_plan import ServingPlan
from kamadev.gguf_factory import ModelShape, write_model
from tests.bench.bench_gateway import llama_start_to_healthy, record, runtime_started_at
from tests.conftest import GatewayProcess
from tests.integration.test_artifact_plane import cache, hf_artifact, wait_condition
from tests.integration.test_serving_plane import deployment, serving_pods, wait_ready
from tests.support import apply, eventually, kubectl

TRIALS = 3
CONTEXT = 2048
SCALE_UP_WINDOW_S = 1.0
POLL_S = 0.02
SHAPE = ModelShape(n_layer=2, n_ctx=CONTEXT, seed=97)
THREADS = 1  # llama-server's compute threads (module docstring: why one)


@contextmanager
def streams(url: str, model: str, count: int) -> Iterator[None]:
    """`count` long streams in flight until the block ends."""
    stop = threading.Event()

    def one() -> None:
        with (
            httpx.Client(timeout=120) as client,
            client.stream(
                "POST",
                f"{url}/v1/completions",
                json={"model": model, "prompt": "go", "max_tokens": CONTEXT - 16,
                      "stream": True, "ignore_eos": True},
            ) as response,
        ):  # fmt: skip
            for _ in response.iter_bytes():
                if stop.is_set():
                    return

    threads = [threading.Thread(target=one, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)


def ready_at(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def one_trial(gw: GatewayProcess, namespace: str, name: str) -> dict[str, float]:
    """Phase times (seconds after the load began) of one scale-out 1 -> 2."""
    core = gw.control.stack.core()
    selector = f"kama.dev/deployment={name}"
    custom = k8s.CustomObjectsApi(gw.control.stack.api_client())
    before = {
        p.metadata.name for p in core.list_namespaced_pod(namespace, label_selector=selector).items
    }
    seen: dict[str, float] = {}
    new_pod = ""
    with streams(gw.url, f"{namespace}/{name}", 2):
        started, wall = time.perf_counter(), time.time()
        while "ready" not in seen:
            now = time.perf_counter() - started
            assert now < 120, f"no second replica within 120 s: {seen}"
            if "scaled" not in seen and desired_replicas(custom, namespace, name) >= 2:
                seen["scaled"] = now
            pods = [
                p for p in core.list_namespaced_pod(namespace, label_selector=selector).items
                if p.metadata.name not in before
            ]  # fmt: skip
            if pods and "created" not in seen:
                seen["created"], new_pod = now, pods[0].metadata.name
            if pods and "running" not in seen and pods[0].status.phase == "Running":
                seen["running"] = now
            if pods and ready_at(pods[0]):
                seen["ready"] = now
            time.sleep(POLL_S)
    started_llama = runtime_started_at(gw.control, namespace, {"metadata": {"name": new_pod}})
    seen["llama_started"] = started_llama - wall
    return seen


def desired_replicas(custom: k8s.CustomObjectsApi, namespace: str, name: str) -> int:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, DEPLOYMENTS, name)
    return int(obj["spec"].get("replicas", 0))


def test_scale_out_reaction(gateway: GatewayProcess, namespace: str, tmp_path: Path) -> None:
    gw, control = gateway, gateway.control
    model_file = write_model(tmp_path / "m.gguf", shape=SHAPE)
    repo = f"acme/scale-out-{uuid.uuid4().hex[:6]}"
    control.hub.add_repo(repo, {"model.gguf": model_file})
    apply(
        control.stack,
        cache(namespace),
        hf_artifact(namespace, "scaler-model", repo, ["model.gguf"]),
    )
    wait_condition(control, namespace, "scaler-model", "Ready")
    # llama-server started directly with the replicas' own flags
    plan = ServingPlan(
        entrypoint=model_file.name,
        manifest_digest="0" * 64,
        ctx_total=CONTEXT,
        concurrency=1,
        threads=THREADS,
    )
    trials: list[dict[str, float]] = []
    baselines: list[float] = []
    for number in range(TRIALS):  # a fresh deployment each: no demand left from before
        name = f"scaler-{number}"
        apply(
            control.stack,
            deployment(
                namespace, name, "scaler-model", replicas=1,
                runtime={"contextSize": CONTEXT, "concurrency": 1, "threads": THREADS},
                resources={"cpu": "100m"},
                scaling={"minReplicas": 1, "maxReplicas": 2, "targetUtilizationPercent": 100,
                         "scaleUpWindow": f"{SCALE_UP_WINDOW_S:g}s", "scaleDownWindow": "1h",
                         "idleTimeout": "1h", "drainTimeout": "5s"},
            ),
        )  # fmt: skip
        wait_ready(control, namespace, name, 1)
        baselines.append(
            llama_start_to_healthy(control.stack.binaries.llama_server, model_file, plan)
        )
        trials.append(one_trial(gw, namespace, name))
        kubectl(control.stack, "delete", "modeldeployment", name, "-n", namespace, "--wait=false")
        eventually(
            lambda n=name: not serving_pods(control, namespace, n),  # type: ignore[misc]
            timeout=180,
            what=f"{name}'s pods gone",
        )
    median = sorted(trials, key=lambda t: t["ready"])[len(trials) // 2]
    baseline = statistics.median(baselines)
    share = median["ready"] - SCALE_UP_WINDOW_S - baseline
    record(
        "scale_out",
        {
            "trials": [{k: round(v, 3) for k, v in t.items()} for t in trials],
            "llama_server_load_s": [round(b, 3) for b in baselines],
            "scale_up_window_s": SCALE_UP_WINDOW_S,
            "median": {
                "demand_to_ready_s": round(median["ready"], 3),
                "demand_to_scale_decision_s": round(median["scaled"], 3),
                "decision_to_pod_created_s": round(median["created"] - median["scaled"], 3),
                "created_to_running_s": round(median["running"] - median["created"], 3),
                "running_to_llama_started_s": round(median["llama_started"] - median["running"], 3),
                "llama_started_to_ready_s": round(median["ready"] - median["llama_started"], 3),
                "llama_server_load_s": round(baseline, 3),
                "control_plane_share_s": round(share, 3),
                "ready_over_baseline_ratio": round(median["ready"] / baseline, 2),
            },
            "goal_control_plane_share_s": 2.0,
        },
    )
