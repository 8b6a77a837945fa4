"""Kama's Grafana dashboard (deploy/chart/kama/files/dashboards/kama.json): the chart
ships it in a ConfigMap for Grafana's sidecar only when asked, every panel queries
something, and every metric it queries is one that Kama's code defines or that the
pinned llama-server exports, so a renamed or removed metric fails here instead of
leaving a panel empty. The extractor that reads PromQL (kamadev/dashboard.py) is
tested on expressions of its own. The stack's scrape of the same names:
tests/integration/test_dashboard.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.metrics import GatewayMetrics
from informer.watch import WatchHealth
from kama.serving_pod import MANAGED_BY_LABEL, ROLE_LABEL, SERVER_ROLE
from kamactl.workflow_counts import WorkflowCounts
from kamadev.binaries import ensure_binaries
from kamadev.dashboard import (
    DASHBOARD,
    dashboard_metric_names,
    exposed_names,
    expressions,
    llama_metric_names,
    metric_names,
    panels,
    registry_sample_names,
)
from tests.unit.test_chart_render import EVAL, helm, named, of_kind, refused, render
from watcher.metrics import WatcherMetrics

__all__ = ["helm"]  # the fixture, shared with the chart's render tests

Doc = dict[str, Any]
Helm = tuple[Path, dict[str, str]]


def dashboard() -> Doc:
    loaded: Doc = json.loads(DASHBOARD.read_text())
    return loaded


def kama_metric_names() -> set[str]:
    """Every sample name Kama's processes can expose: the gateway's, the watcher's
    (with its watch health) and the worker's (after a count, so the refresh
    timestamp is there)."""
    counts = WorkflowCounts()
    counts.replace({})
    families = [
        *GatewayMetrics().registry.collect(),
        *WatcherMetrics(health=WatchHealth()).registry.collect(),
        *counts.collect(),
    ]
    return registry_sample_names(families)


def pinned_llama_metric_names() -> set[str]:
    """The `llamacpp:*` names of the pinned llama-server, from its source (built or
    found cached by deploy/local/build-llama.sh, as test_serving_flags reads arg.cpp)."""
    src = ensure_binaries().llama_bin.parent / "src"
    sources = sorted(src.glob("*/tools/server/*.cpp"))
    assert sources, f"no llama-server source under {src}"
    names = llama_metric_names("\n".join(p.read_text(errors="replace") for p in sources))
    assert {"llamacpp:requests_processing", "llamacpp:requests_deferred"} <= names, (
        "the gateway's backend load reads these; the source parser found none"
    )
    return names


# the chart ----------------------------------------------------------------------------


def test_the_chart_ships_the_dashboard_only_when_enabled(helm: Helm) -> None:
    assert not [
        d for d in of_kind(render(helm, *EVAL), "ConfigMap") if "dashboard" in d["metadata"]["name"]
    ]
    docs = render(helm, *EVAL, "--set", "dashboards.enabled=true")
    config_map = named(docs, "ConfigMap", "kama-dashboards")
    assert config_map["metadata"]["namespace"] == "kama-system"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["kama.json"]) == dashboard(), "the file, unchanged"


def test_the_sidecar_label_namespace_and_folder_are_configurable(helm: Helm) -> None:
    docs = render(
        helm, *EVAL, "--set", "dashboards.enabled=true",
        "--set", "dashboards.label=example.com/dashboard", "--set", "dashboards.labelValue=kama",
        "--set", "dashboards.namespace=monitoring",
        "--set", "dashboards.annotations.grafana_folder=Kama",
    )  # fmt: skip
    meta = named(docs, "ConfigMap", "kama-dashboards")["metadata"]
    assert meta["labels"]["example.com/dashboard"] == "kama"
    assert "grafana_dashboard" not in meta["labels"]
    assert meta["namespace"] == "monitoring"
    assert meta["annotations"] == {"grafana_folder": "Kama"}
    assert "additional properties" in refused(helm, *EVAL, "--set", "dashboards.enable=true")
    assert "pattern" in refused(helm, *EVAL, "--set", "dashboards.labelValue=not a value")


def test_a_pod_monitor_scrapes_llama_server_on_the_serving_pods(helm: Helm) -> None:
    assert not [
        d
        for d in of_kind(
            render(helm, *EVAL, "--set", "metrics.podMonitor.enabled=true"), "PodMonitor"
        )
        if d["metadata"]["name"] == "kama-serving"
    ], "off by default, and not part of the components' monitors"
    docs = render(
        helm, *EVAL, "--set", "metrics.servingPodMonitor.enabled=true",
        "--set", "watchNamespaces={team-a}", "--set", "networkPolicy.servingNamespaces={team-b}",
        "--set", "metrics.servingPodMonitor.labels.release=prometheus",
    )  # fmt: skip
    monitor = named(docs, "PodMonitor", "kama-serving")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    spec = monitor["spec"]
    assert spec["selector"] == {"matchLabels": {MANAGED_BY_LABEL: "kama", ROLE_LABEL: SERVER_ROLE}}
    assert spec["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    [endpoint] = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("supervisor", "/metrics")  # the relay
    [model] = endpoint["relabelings"]
    assert model["targetLabel"] == "model" and model["separator"] == "/"
    assert model["sourceLabels"] == [
        "__meta_kubernetes_namespace",
        "__meta_kubernetes_pod_label_kama_dev_deployment",  # kama.serving_pod.DEPLOYMENT_LABEL
    ]
    cluster_wide = render(helm, *EVAL, "--set", "metrics.servingPodMonitor.enabled=true")
    assert named(cluster_wide, "PodMonitor", "kama-serving")["spec"]["namespaceSelector"] == {
        "any": True
    }


# the dashboard ------------------------------------------------------------------------


def test_every_panel_queries_the_datasource_variable() -> None:
    board = dashboard()
    shown = list(panels(board))
    assert len(shown) >= 20
    assert len({p["id"] for p in shown}) == len(shown), "panel ids are unique"
    for panel in shown:
        assert panel["targets"], f"{panel['title']} has no query"
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "model"} <= set(variables)
    titles = {p["title"] for p in shown}
    for wanted in ("Prompt tokens/s", "Generated tokens/s", "Replica queue", "Prompt cache",
                   "Requests", "Request duration", "Errors", "Held requests", "Wakes",
                   "Cold start duration"):  # fmt: skip
        assert wanted in titles


def test_every_metric_the_dashboard_queries_exists() -> None:
    used = dashboard_metric_names(dashboard())
    known = kama_metric_names() | pinned_llama_metric_names()
    assert used - known == set(), "the dashboard queries metrics nothing defines"
    assert any(n.startswith("kama_gateway_") for n in used)
    assert any(n.startswith("llamacpp:") for n in used)
    assert any(n.startswith("kama_watcher_") for n in used)


def test_a_renamed_metric_is_caught() -> None:
    board = dashboard()
    first = next(iter(panels(board)))
    first["targets"][0]["expr"] = 'sum(rate(kama_gateway_requestz_total{model=~"$model"}[5m]))'
    known = kama_metric_names() | pinned_llama_metric_names()
    assert dashboard_metric_names(board) - known == {"kama_gateway_requestz_total"}
    board["templating"]["list"].append(
        {
            "type": "query",
            "name": "x",
            "query": "label_values(llamacpp:kv_cache_usage_ratio, model)",
        }
    )
    assert "llamacpp:kv_cache_usage_ratio" in dashboard_metric_names(board) - known


def test_a_counter_needs_its_total_suffix() -> None:
    known = kama_metric_names()
    assert "kama_gateway_requests_total" in known
    assert "kama_gateway_requests" not in known
    assert {
        "kama_gateway_cold_start_seconds_bucket",
        "kama_gateway_cold_start_seconds_count",
    } <= known


# the extractor ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        (
            'sum by (model) (rate(a_total{model=~"$model", code!~"2.."}[$__rate_interval]))',
            {"a_total"},
        ),
        ("sum(rate(a_total[5m])) by (le, model)", {"a_total"}),
        (
            'histogram_quantile(0.95, sum by (le) (rate(lat_seconds_bucket{x="y"}[5m])))',
            {"lat_seconds_bucket"},
        ),
        ("rate(d_sum[1m]) / rate(d_count[1m])", {"d_sum", "d_count"}),
        (
            "llamacpp:prompt_tokens_total / ignoring(pod) group_left(model) b",
            {"llamacpp:prompt_tokens_total", "b"},
        ),
        ("max_over_time(rate(c_total[5m])[1h:5m]) offset 1d", {"c_total"}),
        ('label_replace(g, "dst", "$1", "src", "(.*)")', {"g"}),
        ("time() - max(t_timestamp_seconds)", {"t_timestamp_seconds"}),
        ("a > bool 2 and on (x) b unless c", {"a", "b", "c"}),
        ("topk(5, sum without (pod) (g2)) * 1e3", {"g2"}),
        ('{__name__="only"}', {"only"}),
        ('count({__name__=~"one|llamacpp:two"})', {"one", "llamacpp:two"}),
        ('label_values(q_total{namespace=~"$namespace"}, model)', {"q_total"}),
        ('label_values({__name__=~"x1|x2"}, model)', {"x1", "x2"}),
        ("label_values(namespace)", set()),
        ("query_result(topk(3, z))", {"z"}),
        ("vector(1) + scalar(s)", {"s"}),
    ],
)
def test_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_a_name_regex_that_cannot_be_listed_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot enumerate"):
        metric_names('{__name__=~"kama_.*"}')


def test_expressions_include_the_variable_queries() -> None:
    board = dashboard()
    found = expressions(board)
    assert any(e.startswith("label_values(") for e in found)
    assert len(found) > len(list(panels(board)))


def test_exposed_names_of_a_scrape() -> None:
    text = "\n".join(
        [
            "# HELP llamacpp:n_tokens_max Largest observed sequence length",
            "# TYPE llamacpp:n_tokens_max counter",
            "llamacpp:n_tokens_max 12",
            "# TYPE kama_gateway_upstream_errors_total counter",  # declared, no series yet
            "# TYPE kama_gateway_queue_wait_seconds histogram",
            'kama_gateway_requests_total{model="a/b",route="chat",code="200"} 3.0',
            "kama_gateway_held_bytes 0.0",
        ]
    )
    assert exposed_names(text) == {
        "llamacpp:n_tokens_max",
        "kama_gateway_upstream_errors_total",
        "kama_gateway_queue_wait_seconds_bucket",
        "kama_gateway_queue_wait_seconds_sum",
        "kama_gateway_queue_wait_seconds_count",
        "kama_gateway_requests_total",
        "kama_gateway_held_bytes",
    }


def test_llama_metric_names_of_a_source() -> None:
    source = """
    std::string server_task_result_metrics::to_metrics() {
        const std::vector<metric_item> counters = {
            { "prompt_tokens_total", "Number of prompt tokens {processed}", (double) 1 },
        };
        const std::vector<metric_item> gauges = {{"requests_deferred", "Deferred", 0.0}};
        prometheus << "# TYPE llamacpp:labelled_total counter\\n";
        return prometheus.str();
    }
    static void other() { std::vector<metric_item> x = {{"not_a_metric", "no", 0}}; }
    """
    assert llama_metric_names(source) == {
        "llamacpp:prompt_tokens_total",
        "llamacpp:requests_deferred",
        "llamacpp:labelled_total",
    }
