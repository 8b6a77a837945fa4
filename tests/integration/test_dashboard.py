"""Every metric Kama's Grafana dashboard queries (deploy/chart/kama/files/dashboards/
kama.json) is one a running Kama exposes: the gateway's ops port, the worker's and the
watcher's `metrics` ports, and a serving replica's llama-server `/metrics`, scraped
after a chat request went through the gateway (so the per-model series exist). A
family declared without series yet (upstream errors, cold starts on a warm model,
per-key usage with keys off) counts: its `# TYPE` line names it. The names are the
ones tests/unit/test_dashboard.py checks against the code and the pinned source;
this checks them against what the processes really answer. llama-server's
`/metrics` needs the deployment's key where Kama has a master key, so the chart's
servingPodMonitor scrapes the runtime's relay on the supervisor port, without a key,
and gets what llama-server answers with it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from kama.serving_plan import LLAMA_PORT, SUPERVISOR_PORT
from kama.serving_pod import DEPLOYMENT_LABEL
from kamadev.dashboard import DASHBOARD, dashboard_metric_names, exposed_names
from tests.conftest import GatewayProcess
from tests.integration.test_gateway import serve
from tests.integration.test_llama_routes import Replica
from tests.integration.test_observability import COUNT_TIMEOUT_S, sample, scrape
from tests.integration.test_serving_plane import wait_ready
from tests.support import eventually, serving_headers


def unlabelled(text: str, name: str) -> float:
    """The value of a series without labels (llama-server's are all such)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the scrape")


def test_every_dashboard_metric_is_exposed_by_a_running_kama(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    gw = gateway
    serve(
        gw, namespace, tmp_path, "dash", 93,
        replicas=1, runtime={"contextSize": 2048, "concurrency": 2}, resources={"cpu": "100m"},
    )  # fmt: skip
    wait_ready(gw.control, namespace, "dash", 1)
    replica = Replica(gw, namespace, "dash")
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    straight, through = replica.both("/v1/chat/completions", chat)
    assert straight.status_code == through.status_code == 200, (straight.text, through.text)

    gateway_text = httpx.get(f"{gw.ops_url}/metrics", timeout=5).text
    assert (sample(gateway_text, "kama_gateway_requests_total", model=replica.model) or 0) >= 1

    pod = replica.pod
    url = f"http://{pod['status']['podIP']}:{LLAMA_PORT}/metrics"
    if serving_headers(pod):  # llama-server's /metrics is not public
        assert httpx.get(url, timeout=5).status_code == 401
    relayed = httpx.get(f"http://{pod['status']['podIP']}:{SUPERVISOR_PORT}/metrics", timeout=5)
    assert relayed.status_code == 200, relayed.text  # what the servingPodMonitor scrapes
    llama_text = relayed.text
    assert unlabelled(llama_text, "llamacpp:tokens_predicted_total") > 0
    # the servingPodMonitor's relabeling makes model="<namespace>/<deployment>" of the
    # pod's namespace and label: the gateway's name for the same model
    labels = pod["metadata"]["labels"]
    assert f"{pod['metadata']['namespace']}/{labels[DEPLOYMENT_LABEL]}" == replica.model

    control = gw.control
    watcher_text = scrape(control.watcher, "KAMA_METRICS_PORT")
    worker_text = ""

    def counted() -> bool:
        nonlocal worker_text
        worker_text = scrape(control.worker, "KAMA_METRICS_PORT")
        return "kama_workflows_refreshed_timestamp_seconds" in worker_text

    eventually(counted, timeout=COUNT_TIMEOUT_S, what="the worker's first workflow count")

    exposed = set().union(
        *(exposed_names(t) for t in (gateway_text, llama_text, watcher_text, worker_text))
    )
    used = dashboard_metric_names(json.loads(DASHBOARD.read_text()))
    assert used - exposed == set(), "the dashboard queries metrics no process answers"
