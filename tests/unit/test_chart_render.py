"""The Helm chart as `helm template` renders it (Helm built from helm.sh/helm/v4 by
deploy/local/build-helm.sh): CRDs that are the generated ones and survive uninstall, a
schema that fails typos, hardened pods, the gateway's drain order, least-privilege
RBAC in both modes, Temporal settings in every process and the evaluation mode."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.auth_limits import KeyCeilings, LimitValues
from kama.config import Settings
from kama.importer_pod import IMPORTER_ROLE
from kama.serving_pod import MANAGED_BY_LABEL, ROLE_LABEL, SERVER_ROLE
from kamadev.binaries import REPO_ROOT, ensure_helm
from tests.unit.test_importer_pod import created_importer_pod

CHART = REPO_ROOT / "deploy" / "chart" / "kama"
EVAL = ("--set", "temporal.evaluation.enabled=true")
GATEWAY_DRAIN_S = 25  # gateway/transport/serve.py STOP_GRACE_S

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    home = tmp_path_factory.mktemp("helm")
    env = {
        "PATH": "/usr/bin:/bin",
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    yield ensure_helm(), env


def _template(helm: tuple[Path, dict[str, str]], *args: str) -> subprocess.CompletedProcess[str]:
    binary, env = helm
    return subprocess.run(
        [str(binary), "template", "kama", str(CHART), "--namespace", "kama-system", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def render(helm: tuple[Path, dict[str, str]], *args: str) -> list[Doc]:
    result = _template(helm, *args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def refused(helm: tuple[Path, dict[str, str]], *args: str) -> str:
    result = _template(helm, *args)
    assert result.returncode != 0, f"helm template {args} should fail"
    return result.stderr


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    return next(d for d in of_kind(docs, kind) if d["metadata"]["name"] == name)


def env_of(container: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def plain_env(container: Doc) -> dict[str, str]:
    """The env entries with a value (not from a Secret or the downward API), as
    `Settings.from_env` reads them."""
    return {k: v for k, v in env_of(container).items() if isinstance(v, str)}


def test_crds_are_the_generated_ones_kept_on_uninstall(helm: tuple[Path, dict[str, str]]) -> None:
    crds = {
        d["metadata"]["name"]: d for d in of_kind(render(helm, *EVAL), "CustomResourceDefinition")
    }
    generated = {
        d["metadata"]["name"]: d
        for path in sorted((REPO_ROOT / "deploy" / "crds").glob("*.yaml"))
        for d in [yaml.safe_load(path.read_text())]
    }
    assert (
        set(crds)
        == set(generated)
        == {
            "modelaccesskeys.kama.dev",
            "modelartifacts.kama.dev",
            "modelcaches.kama.dev",
            "modeldeployments.kama.dev",
        }
    )
    for name, crd in crds.items():
        assert crd["spec"] == generated[name]["spec"]
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["labels"]["app.kubernetes.io/part-of"] == "kama"
    assert not of_kind(
        render(helm, *EVAL, "--set", "crds.install=false"), "CustomResourceDefinition"
    )


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("--set", "gateway.replica=2"), "additional properties 'replica' not allowed"),
        (("--set", "imagess.kama.tag=x"), "additional properties 'imagess' not allowed"),
        (("--set", "temporal.address=temporal"), "does not match pattern"),
        (("--set", "watchNamespaces={a,a}"), "are equal"),
        (("--set", "images.kama.digest=sha256:nothex"), "does not match pattern"),
        (("--set", "gateway.port=0"), "minimum"),
        (("--set", "image.pullPolicy=Sometimes"), "value must be one of"),
        (("--set", "clusterName=prod:eu"), "does not match pattern"),
    ],
)
def test_schema_fails_a_typo_at_install(
    helm: tuple[Path, dict[str, str]], args: tuple[str, ...], why: str
) -> None:
    assert why in refused(helm, *EVAL, *args)


def test_temporal_is_required_unless_evaluation_mode(helm: tuple[Path, dict[str, str]]) -> None:
    assert "temporal.address is required" in refused(helm)
    docs = render(helm, "--set", "temporal.address=temporal.example:7233")
    assert not [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "kama-temporal"]


def test_every_pod_is_non_root_read_only_and_pinned(helm: tuple[Path, dict[str, str]]) -> None:
    digest = "sha256:" + "ab" * 32
    docs = render(
        helm, *EVAL, "--set", f"images.kama.digest={digest}", "--set", "image.pullSecrets={regcred}"
    )
    deployments = of_kind(docs, "Deployment")
    assert {d["metadata"]["name"] for d in deployments} == {
        "kama-worker",
        "kama-watcher",
        "kama-gateway",
        "kama-temporal",
    }
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 65532
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            if deployment["metadata"]["name"] != "kama-temporal":
                assert container["image"] == f"ghcr.io/kama-dev/kama@{digest}"
    for name in ("kama-worker", "kama-watcher", "kama-gateway"):
        container = named(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        env = env_of(container)  # the watcher picks the runtime image, the worker the importer's
        assert env["KAMA_IMPORTER_IMAGE"] == f"ghcr.io/kama-dev/kama@{digest}"
        assert env["KAMA_RUNTIME_IMAGE"] == "ghcr.io/kama-dev/kama-llama-server:0.1.0"


def test_gateway_leaves_the_endpoints_before_it_stops(helm: tuple[Path, dict[str, str]]) -> None:
    docs = render(helm, *EVAL)
    pod = named(docs, "Deployment", "kama-gateway")["spec"]["template"]["spec"]
    gateway = pod["containers"][0]
    pre_stop = gateway["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop >= 5
    assert pod["terminationGracePeriodSeconds"] > pre_stop + GATEWAY_DRAIN_S
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": ports["ops"]}
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": ports["ops"]}
    assert gateway["args"][:1] == ["gateway"] and f"--ops-port={ports['ops']}" in gateway["args"]
    service = named(docs, "Service", "kama-gateway")
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http"}]
    assert named(docs, "PodDisruptionBudget", "kama-gateway")["spec"]["minAvailable"] == 1
    watcher = named(docs, "Deployment", "kama-watcher")["spec"]["template"]["spec"]
    probe = watcher["containers"][0]["readinessProbe"]["httpGet"]
    assert probe == {"path": "/readyz", "port": 8081}
    assert env_of(watcher["containers"][0])["KAMA_HEALTH_PORT"] == "8081"


def rules_by_component(docs: list[Doc]) -> dict[str, list[tuple[str, Doc]]]:
    """component → [(scope, rule)], scope a namespace or "cluster"."""
    found: dict[str, list[tuple[str, Doc]]] = {}
    for doc in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"):
        component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
        scope = doc["metadata"].get("namespace", "cluster") if doc["kind"] == "Role" else "cluster"
        found.setdefault(component, []).extend((scope, r) for r in doc["rules"])
    return found


def verbs_on(rules: list[tuple[str, Doc]], resource: str) -> set[str]:
    return {v for _, r in rules if resource in r["resources"] for v in r["verbs"]}


SERVING_KEY_RULES = [
    ("kama-system", {"apiGroups": [""], "resources": ["secrets"],
                     "resourceNames": ["kama-serving-key"], "verbs": ["get"]}),
    ("kama-system", {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}),
]  # fmt: skip


def test_rbac_is_least_privilege_in_both_modes(helm: tuple[Path, dict[str, str]]) -> None:
    cluster = rules_by_component(render(helm, *EVAL))
    namespaced = rules_by_component(render(helm, *EVAL, "--set", "watchNamespaces={team-a}"))
    for rules in (cluster, namespaced):
        assert set(rules) == {"worker", "watcher", "gateway"}
        for component, component_rules in rules.items():
            for scope, rule in component_rules:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"], component
                if "secrets" in rule["resources"]:  # the serving key's, in Kama's namespace
                    assert component == "worker" and (scope, rule) in SERVING_KEY_RULES, rule
                assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
        # the worker's rules in its own namespace are the serving key's alone
        assert [(s, r) for s, r in rules["worker"] if s == "kama-system"] == SERVING_KEY_RULES
        assert verbs_on(rules["worker"], "pods") == {"create", "delete", "get", "list", "patch"}
        assert verbs_on(rules["worker"], "nodes") == {"list"}
        assert verbs_on(rules["watcher"], "pods") == {"list", "watch"}
        assert verbs_on(rules["watcher"], "modelartifacts") == {"list", "watch", "patch"}
        assert verbs_on(rules["gateway"], "pods") == {"list", "watch"}
        assert verbs_on(rules["gateway"], "modeldeployments") == {"list", "watch"}
        # API keys as hashes (ModelAccessKeys), never Secrets (checked above)
        assert verbs_on(rules["gateway"], "modelaccesskeys") == {"list", "watch"}
        # its one write: Warning Events on keys whose hash two objects hold
        assert verbs_on(rules["gateway"], "events") == {"create"}
        assert not verbs_on(rules["gateway"], "modelartifacts")
    assert {scope for c in cluster.values() for scope, _ in c} == {"cluster", "kama-system"}
    # namespaced: Roles in the served namespace; cluster-wide only the worker's reads of
    # cluster-scoped objects (Nodes, PersistentVolumes, StorageClasses)
    cluster_scoped = (["nodes"], ["persistentvolumes"], ["storageclasses"])
    assert {s for s, _ in namespaced["watcher"]} == {"team-a"}
    assert {s for s, _ in namespaced["gateway"]} == {"team-a"}
    worker = [(s, r) for s, r in namespaced["worker"] if (s, r) not in SERVING_KEY_RULES]
    assert {s for s, r in worker if r["resources"] not in cluster_scoped} == {"team-a"}
    assert {s for s, r in worker if r["resources"] in cluster_scoped} == {"cluster"}
    for resource in ("persistentvolumes", "storageclasses"):
        assert verbs_on(worker, resource) == {"get"}


def test_namespaced_mode_sets_the_watch_namespaces(helm: tuple[Path, dict[str, str]]) -> None:
    docs = render(helm, *EVAL, "--set", "watchNamespaces={team-a,team-b}")
    for name in ("kama-worker", "kama-watcher", "kama-gateway"):
        container = named(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        assert env_of(container)["KAMA_WATCH_NAMESPACE"] == "team-a,team-b"
        settings = Settings.from_env(plain_env(container))
        assert settings.tenancy.watch_namespaces == ("team-a", "team-b")
    worker_roles = [
        doc["metadata"]["namespace"]
        for doc in of_kind(docs, "Role")
        if doc["metadata"]["name"] == "kama-worker"
    ]
    assert sorted(worker_roles) == ["team-a", "team-b"]


def test_temporal_connection_reaches_every_process(helm: tuple[Path, dict[str, str]]) -> None:
    docs = render(
        helm,
        "--set", "temporal.address=acme.tmprl.cloud:7233",
        "--set", "temporal.namespace=acme.kama",
        "--set", "temporal.tls.enabled=true",
        "--set", "temporal.tls.secretName=temporal-mtls",
        "--set", "temporal.apiKey.secretName=temporal-key",
    )  # fmt: skip
    for name in ("kama-worker", "kama-watcher", "kama-gateway"):
        pod = named(docs, "Deployment", name)["spec"]["template"]["spec"]
        env = env_of(pod["containers"][0])
        assert env["TEMPORAL_ADDRESS"] == env["KAMA_TEMPORAL_ADDRESS"] == "acme.tmprl.cloud:7233"
        assert env["TEMPORAL_NAMESPACE"] == env["KAMA_TEMPORAL_NAMESPACE"] == "acme.kama"
        assert env["TEMPORAL_TLS"] == "true"
        assert env["TEMPORAL_TLS_CLIENT_CERT_PATH"] == "/etc/kama/temporal-tls/tls.crt"
        assert env["TEMPORAL_API_KEY"] == {
            "secretKeyRef": {"name": "temporal-key", "key": "api-key"}
        }
        assert {
            "name": "temporal-tls",
            "secret": {"secretName": "temporal-mtls", "optional": False},
        } in pod["volumes"]


def test_evaluation_mode_runs_a_dev_server_with_kamas_search_attributes(
    helm: tuple[Path, dict[str, str]],
) -> None:
    docs = render(helm, *EVAL)
    temporal = named(docs, "Deployment", "kama-temporal")
    assert temporal["spec"]["strategy"] == {"type": "Recreate"}
    args = temporal["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["server", "start-dev"]
    assert "--db-filename=/data/temporal.sqlite" in args
    for attribute in ("KamaKind", "KamaNamespace", "KamaName"):
        assert f"--search-attribute={attribute}=Keyword" in args
    # activities come back with the workflow task that scheduled them
    assert "--dynamic-config-value=system.enableActivityEagerExecution=true" in args
    assert named(docs, "PersistentVolumeClaim", "kama-temporal")["spec"]["resources"] == {
        "requests": {"storage": "1Gi"}
    }
    worker = named(docs, "Deployment", "kama-worker")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(worker)["KAMA_TEMPORAL_ADDRESS"] == "kama-temporal.kama-system.svc:7233"


def test_optional_monitors_and_network_policies(helm: tuple[Path, dict[str, str]]) -> None:
    plain = render(helm, *EVAL)
    assert not of_kind(plain, "ServiceMonitor")
    docs = render(
        helm, *EVAL, "--set", "watchNamespaces={team-a}", "--set", "networkPolicy.enabled=true",
        "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true",
    )  # fmt: skip
    policies = {
        (d["metadata"]["namespace"], d["metadata"]["name"]) for d in of_kind(docs, "NetworkPolicy")
    }
    assert ("team-a", "kama-serving-pods") in policies
    assert ("kama-system", "kama-gateway") in policies
    assert of_kind(docs, "ServiceMonitor") and of_kind(docs, "PodMonitor")


def test_worker_and_watcher_expose_metrics_and_monitors_scrape_them(
    helm: tuple[Path, dict[str, str]],
) -> None:
    docs = render(
        helm, *EVAL, "--set", "logFormat=json", "--set", "networkPolicy.enabled=true",
        "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true",
    )  # fmt: skip
    for component in ("worker", "watcher"):
        pod = named(docs, "Deployment", f"kama-{component}")["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = env_of(container)
        assert env["KAMA_METRICS_PORT"] == "9090" and env["KAMA_TEMPORAL_METRICS_PORT"] == "9091"
        assert env["KAMA_LOG_FORMAT"] == "json"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == 9090 and ports["sdk-metrics"] == 9091
        monitor = named(docs, "PodMonitor", f"kama-{component}")
        assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == [
            "metrics",
            "sdk-metrics",
        ]
        assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == (
            component
        )
        service = named(docs, "Service", f"kama-{component}-metrics")
        assert {p["targetPort"] for p in service["spec"]["ports"]} == {"metrics", "sdk-metrics"}
        assert named(docs, "ServiceMonitor", f"kama-{component}")["spec"]["endpoints"]
        policy = named(docs, "NetworkPolicy", f"kama-{component}")
        allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        assert {"metrics", "sdk-metrics"} <= allowed
    gateway = named(docs, "Deployment", "kama-gateway")["spec"]["template"]["spec"]
    assert env_of(gateway["containers"][0])["KAMA_LOG_FORMAT"] == "json"


def test_metrics_ports_can_be_turned_off(helm: tuple[Path, dict[str, str]]) -> None:
    docs = render(
        helm, *EVAL, "--set", "worker.metricsPort=0", "--set", "worker.temporalMetricsPort=0",
        "--set", "metrics.podMonitor.enabled=true", "--set", "networkPolicy.enabled=true",
    )  # fmt: skip
    worker = named(docs, "Deployment", "kama-worker")["spec"]["template"]["spec"]
    assert "ports" not in worker["containers"][0]
    assert env_of(worker["containers"][0])["KAMA_METRICS_PORT"] == "0"
    assert not [d for d in of_kind(docs, "PodMonitor") if d["metadata"]["name"] == "kama-worker"]
    assert named(docs, "NetworkPolicy", "kama-worker")["spec"]["ingress"] == []
    assert "logFormat" in refused(helm, *EVAL, "--set", "logFormat=yaml")


def test_the_cluster_name_reaches_every_process_and_importers_get_no_temporal_settings(
    helm: tuple[Path, dict[str, str]],
) -> None:
    docs = render(helm, *EVAL, "--set", "clusterName=prod-eu")
    for name in ("kama-worker", "kama-watcher", "kama-gateway"):
        container = named(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        assert env_of(container)["KAMA_CLUSTER"] == "prod-eu"
    worker = named(docs, "Deployment", "kama-worker")["spec"]["template"]["spec"]["containers"][0]
    assert not [name for name in env_of(worker) if name.startswith("KAMA_IMPORTER_TEMPORAL")]
    unnamed = named(render(helm, *EVAL), "Deployment", "kama-worker")
    assert env_of(unnamed["spec"]["template"]["spec"]["containers"][0])["KAMA_CLUSTER"] == ""
    assert "importerSecretName" in refused(
        helm, *EVAL, "--set", "temporal.importerSecretName=kama-t"
    )


def test_importer_values_reach_the_importer_pods_the_worker_creates(
    helm: tuple[Path, dict[str, str]],
) -> None:
    """What `helm install` sets for importer pods is what the worker, reading its own
    environment as rendered, puts into them."""
    docs = render(
        helm, *EVAL,
        "--set", "importer.resources.requests.cpu=300m",
        "--set", "importer.resources.limits.memory=1Gi",
        "--set", "importer.env[0].name=HTTPS_PROXY",
        "--set", "importer.env[0].value=http://proxy:3128",
        "--set", "importer.caBundle.configMapName=corp-ca",
    )  # fmt: skip
    worker = named(docs, "Deployment", "kama-worker")["spec"]["template"]["spec"]["containers"][0]
    plain = {k: v for k, v in env_of(worker).items() if isinstance(v, str)}
    pod = created_importer_pod(Settings.from_env(plain).importer_pod)
    [container] = pod["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "300m"}, "limits": {"memory": "1Gi"}}
    assert env_of(container)["HTTPS_PROXY"] == "http://proxy:3128"
    assert env_of(container)["SSL_CERT_FILE"] == "/etc/kama/source-ca/ca.crt"
    assert any(v.get("configMap", {}).get("name") == "corp-ca" for v in pod["spec"]["volumes"])
    typo = refused(
        helm, *EVAL, "--set", "importer.env[0].name=X", "--set", "importer.env[0].vaule=y"
    )
    assert "/importer/env/0" in typo and "vaule" in typo, typo


def test_keda_mode_serves_the_scaler_and_lets_the_worker_write_scaled_objects(
    helm: tuple[Path, dict[str, str]],
) -> None:
    """keda.enabled: every gateway serves KEDA's external scaler on its Service, the
    worker gets that Service's address (which Settings reads) and may write
    ScaledObjects; off (the default), none of it."""
    for namespaced in ((), ("--set", "watchNamespaces={team-a}")):
        docs = render(helm, *EVAL, *namespaced, "--set", "keda.enabled=true")
        gateway = named(docs, "Deployment", "kama-gateway")["spec"]["template"]["spec"]
        (container,) = gateway["containers"]
        assert "--keda-scaler-port=9091" in container["args"]
        assert {"name": "keda-scaler", "containerPort": 9091} in container["ports"]
        service = named(docs, "Service", "kama-gateway")["spec"]["ports"]
        assert any(p["name"] == "keda-scaler" and p["port"] == 9091 for p in service)
        worker = named(docs, "Deployment", "kama-worker")["spec"]["template"]["spec"]
        env = env_of(worker["containers"][0])
        address = "kama-gateway.kama-system.svc:9091"
        assert env["KAMA_KEDA_SCALER_ADDRESS"] == address
        assert Settings.from_env(plain_env(worker["containers"][0])).keda_scaler_address == address
        rules = rules_by_component(docs)
        assert verbs_on(rules["worker"], "scaledobjects") == {"create", "delete", "get", "patch"}
        assert not verbs_on(rules["gateway"], "scaledobjects")
    docs = render(helm, *EVAL)
    worker = named(docs, "Deployment", "kama-worker")["spec"]["template"]["spec"]
    assert "KAMA_KEDA_SCALER_ADDRESS" not in env_of(worker["containers"][0])
    assert not verbs_on(rules_by_component(docs)["worker"], "scaledobjects")
    gateway = named(docs, "Deployment", "kama-gateway")["spec"]["template"]["spec"]
    assert not any("keda" in arg for arg in gateway["containers"][0]["args"])


# --- defence in depth: the worker's pods, and who reaches what ------------------------

WORKER_USER = "system:serviceaccount:kama-system:kama-worker"


def admission_policy(docs: list[Doc]) -> tuple[Doc, Doc]:
    """The worker-pods ValidatingAdmissionPolicy and its binding."""
    [policy] = of_kind(docs, "ValidatingAdmissionPolicy")
    [binding] = of_kind(docs, "ValidatingAdmissionPolicyBinding")
    return policy, binding


def rule_for(policy: Doc, words: str) -> Doc:
    """The validation whose message contains `words`."""
    found: list[Doc] = [v for v in policy["spec"]["validations"] if words in v["message"]]
    assert len(found) == 1, (words, found)
    return found[0]


def test_admission_policy_fences_the_workers_pods(helm: tuple[Path, dict[str, str]]) -> None:
    """On by default: it matches only requests of the worker's ServiceAccount on pods,
    denies, allows exactly the images the worker is configured with, and names each rule
    in its message."""
    digest = "sha256:" + "cd" * 32
    docs = render(helm, *EVAL, "--set", f"images.llamaServer.digest={digest}")
    policy, binding = admission_policy(docs)
    assert policy["metadata"]["name"] == "kama-kama-system-worker-pods"
    assert binding["spec"] == {"policyName": "kama-kama-system-worker-pods",
                               "validationActions": ["Deny"]}  # fmt: skip
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert set(rule["resources"]) == {"pods", "pods/ephemeralcontainers"}
    [condition] = spec["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{WORKER_USER}'"
    # the images the worker puts into importer and serving pods, and no other
    worker = named(docs, "Deployment", "kama-worker")["spec"]["template"]["spec"]["containers"][0]
    env = env_of(worker)
    images = next(v for v in spec["variables"] if v["name"] == "images")["expression"]
    assert json.loads(images) == [env["KAMA_IMPORTER_IMAGE"], env["KAMA_RUNTIME_IMAGE"]]
    assert env["KAMA_RUNTIME_IMAGE"] == f"ghcr.io/kama-dev/kama-llama-server@{digest}"
    messages = [v["message"] for v in spec["validations"]]
    assert all(m.startswith("Kama worker pods ") for m in messages), messages
    for words, fields in [
        ("hostPath", ["hostPath"]),
        ("network, PID or IPC", ["hostNetwork", "hostPID", "hostIPC"]),
        ("privileged", ["privileged"]),
        ("capabilities", ["capabilities.add"]),
        ("carry a service-account token", ["automountServiceAccountToken"]),
        ("entrypoint", ["command"]),
        ("host ports", ["hostPort"]),
    ]:
        expression = rule_for(policy, words)["expression"]
        assert all(f in expression for f in fields), (words, expression)
    # every container rule covers init and ephemeral containers too
    for words in ("images", "privileged", "capabilities", "host ports", "entrypoint"):
        expression = rule_for(policy, words)["expression"]
        for field in ("object.spec.containers", "initContainers", "ephemeralContainers"):
            assert field in expression, (words, field)
    # the labels every pod the worker creates carries
    labels = rule_for(policy, "labels")["expression"]
    for text in (MANAGED_BY_LABEL, "'kama'", ROLE_LABEL, f"'{SERVER_ROLE}'", f"'{IMPORTER_ROLE}'"):
        assert text in labels, (text, labels)
    # cluster-wide: no namespace rule
    assert not [m for m in messages if "watched namespaces" in m]
    assert not of_kind(
        render(helm, *EVAL, "--set", "admissionPolicy.enabled=false"), "ValidatingAdmissionPolicy"
    )


def test_admission_policy_keeps_the_worker_in_its_namespaces_and_images(
    helm: tuple[Path, dict[str, str]],
) -> None:
    docs = render(
        helm, *EVAL, "--namespace", "kama-ops", "--set", "watchNamespaces={team-a}",
        "--set", "admissionPolicy.extraImages={registry.example/kama-llama-server:0.0.9}",
    )  # fmt: skip
    policy, _ = admission_policy(docs)
    assert policy["metadata"]["name"] == "kama-kama-ops-worker-pods"
    [condition] = policy["spec"]["matchConditions"]
    assert "'system:serviceaccount:kama-ops:kama-worker'" in condition["expression"]
    namespaces = rule_for(policy, "watched namespaces")
    assert namespaces["expression"] == 'request.namespace in ["team-a"]'
    assert "team-a" in namespaces["message"]
    images = next(v for v in policy["spec"]["variables"] if v["name"] == "images")
    assert json.loads(images["expression"]) == [
        "ghcr.io/kama-dev/kama:0.1.0",
        "ghcr.io/kama-dev/kama-llama-server:0.1.0",
        "registry.example/kama-llama-server:0.0.9",
    ]
    assert "registry.example/kama-llama-server:0.0.9" in rule_for(policy, "images")["message"]


def peers_on(policy: Doc, port: str) -> list[Doc] | None:
    """The `from` peers of the ingress rule for `port`; None if no rule opens it."""
    for rule in policy["spec"]["ingress"]:
        if {"port": port} in rule.get("ports", []):
            return list(rule.get("from", []))
    return None


def test_network_policies_are_on_by_default(helm: tuple[Path, dict[str, str]]) -> None:
    """Temporal's frontend only from the release's worker, watcher and gateway (no
    importer, no tenant pod); its Web UI from no pod; in every watched namespace the
    serving pods only from the gateway and the worker, the importer pods only from the
    worker."""
    docs = render(helm, *EVAL)
    policies = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d
        for d in of_kind(docs, "NetworkPolicy")
    }
    assert set(policies) == {
        ("kama-system", f"kama-{c}") for c in ("gateway", "watcher", "worker", "temporal")
    }
    temporal = policies[("kama-system", "kama-temporal")]
    assert peers_on(temporal, "ui") is None
    [components] = peers_on(temporal, "grpc") or []
    assert "namespaceSelector" not in components  # the release namespace only
    assert components["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "kama"
    assert components["podSelector"]["matchExpressions"] == [
        {"key": "app.kubernetes.io/component", "operator": "In",
         "values": ["gateway", "watcher", "worker"]}
    ]  # fmt: skip

    docs = render(helm, *EVAL, "--set", "watchNamespaces={team-a,team-b}")
    tenant = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d
        for d in of_kind(docs, "NetworkPolicy")
        if d["metadata"]["namespace"] != "kama-system"
    }
    assert set(tenant) == {
        (ns, f"kama-{pods}-pods") for ns in ("team-a", "team-b") for pods in ("serving", "importer")
    }
    from_release = {"matchLabels": {"kubernetes.io/metadata.name": "kama-system"}}
    serving = tenant[("team-a", "kama-serving-pods")]["spec"]
    assert serving["podSelector"] == {"matchLabels": {ROLE_LABEL: SERVER_ROLE}}
    [rule] = serving["ingress"]
    [peer] = rule["from"]
    assert peer["namespaceSelector"] == from_release
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "kama"
    assert peer["podSelector"]["matchExpressions"][0]["values"] == ["gateway", "worker"]
    importer = tenant[("team-b", "kama-importer-pods")]["spec"]
    assert importer["podSelector"] == {"matchLabels": {ROLE_LABEL: IMPORTER_ROLE}}
    [rule] = importer["ingress"]
    [peer] = rule["from"]
    assert peer["namespaceSelector"] == from_release
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "kama"
    # serving pods reach nothing (llama-server fetches no URL); importers reach their source
    assert serving["policyTypes"] == ["Ingress", "Egress"] and serving["egress"] == []
    assert importer["policyTypes"] == ["Ingress"]


def test_the_worker_fences_tenant_pods_in_the_cluster_wide_mode(
    helm: tuple[Path, dict[str, str]],
) -> None:
    """Issue #41: in the cluster-wide mode the chart cannot know the tenant namespaces,
    so their serving and importer pods were open to every pod. The worker gets the very
    policies the namespaced mode renders (KAMA_TENANT_NETWORK_POLICIES) and the right to
    create NetworkPolicies, which it needs only then."""

    def worker_env(docs: list[Doc]) -> dict[str, str]:
        return plain_env(named(docs, "Deployment", "kama-worker")["spec"]["template"]["spec"]
                         ["containers"][0])  # fmt: skip

    cluster_wide = render(helm, *EVAL)
    handed = json.loads(worker_env(cluster_wide)["KAMA_TENANT_NETWORK_POLICIES"])
    namespaced = render(helm, *EVAL, "--set", "watchNamespaces={team-a}")
    rendered = [
        {"name": d["metadata"]["name"], "spec": d["spec"]}
        for d in of_kind(namespaced, "NetworkPolicy")
        if d["metadata"]["namespace"] == "team-a"
    ]
    assert sorted(handed, key=str) == sorted(rendered, key=str)
    assert [p["name"] for p in handed] == ["kama-serving-pods", "kama-importer-pods"]
    assert Settings.from_env(worker_env(cluster_wide)).tenant_network_policies == tuple(handed)
    assert "KAMA_TENANT_NETWORK_POLICIES" not in worker_env(namespaced)
    assert verbs_on(rules_by_component(cluster_wide)["worker"], "networkpolicies") == {"create"}
    assert not verbs_on(rules_by_component(namespaced)["worker"], "networkpolicies")
    off = render(helm, *EVAL, "--set", "networkPolicy.enabled=false")
    assert "KAMA_TENANT_NETWORK_POLICIES" not in worker_env(off)
    assert not verbs_on(rules_by_component(off)["worker"], "networkpolicies")


def test_network_policy_values(helm: tuple[Path, dict[str, str]]) -> None:
    """servingNamespaces fences Kama's pods in the cluster-wide mode (once per
    namespace), the UI opens to named peers only, and the whole thing turns off."""

    def fenced(docs: list[Doc]) -> list[str]:
        return sorted(
            d["metadata"]["namespace"]
            for d in of_kind(docs, "NetworkPolicy")
            if d["metadata"]["name"] == "kama-serving-pods"
        )

    docs = render(
        helm, *EVAL, "--set", "watchNamespaces={team-a}",
        "--set", "networkPolicy.servingNamespaces={team-a,team-b}",
        "--set", "networkPolicy.temporalUIFrom[0].podSelector.matchLabels.role=ops",
    )  # fmt: skip
    assert fenced(docs) == ["team-a", "team-b"]
    temporal = named(docs, "NetworkPolicy", "kama-temporal")
    assert peers_on(temporal, "ui") == [{"podSelector": {"matchLabels": {"role": "ops"}}}]
    assert fenced(render(helm, *EVAL, "--set", "networkPolicy.servingNamespaces={team-c}")) == [
        "team-c"
    ]
    assert not of_kind(render(helm, *EVAL, "--set", "networkPolicy.enabled=false"), "NetworkPolicy")
    assert "pattern" in refused(helm, *EVAL, "--set", "networkPolicy.servingNamespaces={Team_A}")


def test_the_serving_key_reaches_the_worker_and_gateway_only(
    helm: tuple[Path, dict[str, str]],
) -> None:
    """The master key of llama-server's API keys (kama/serving_key.py): the chart
    renders no key, so two renders are the same (`helm template` under Argo CD or Flux
    once rendered a new key each time and locked the gateway out of running replicas,
    #41); the worker reads the Secret, creating it when missing (with a Role for that
    one Secret in its own namespace), the gateway reads it from its env, the watcher
    never; `servingKey.existingSecret` names your own, which Kama never creates."""
    docs = render(helm, *EVAL)
    assert docs == render(helm, *EVAL), "two renders differ"
    assert not [s for s in of_kind(docs, "Secret") if "serving-key" in s["metadata"]["name"]]
    reference = {"secretKeyRef": {"name": "kama-serving-key", "key": "serving-key"}}
    worker = named(docs, "Deployment", "kama-worker")["spec"]["template"]["spec"]
    gateway = named(docs, "Deployment", "kama-gateway")["spec"]["template"]["spec"]
    watcher = named(docs, "Deployment", "kama-watcher")["spec"]["template"]["spec"]
    assert env_of(gateway["containers"][0]).get("KAMA_SERVING_KEY") == reference
    assert "KAMA_SERVING_KEY" not in env_of(watcher["containers"][0])
    assert not [k for k in env_of(watcher["containers"][0]) if k.startswith("KAMA_SERVING")]
    worker_env = env_of(worker["containers"][0])
    assert "KAMA_SERVING_KEY" not in worker_env
    assert worker_env["KAMA_SERVING_KEY_SECRET"] == "kama-system/kama-serving-key"
    assert worker_env["KAMA_SERVING_KEY_FIELD"] == "serving-key"
    assert worker_env["KAMA_SERVING_KEY_GENERATE"] == "true"
    role = named(docs, "Role", "kama-worker-serving-key")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["kama-serving-key"],
         "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]  # fmt: skip
    binding = named(docs, "RoleBinding", "kama-worker-serving-key")
    assert binding["subjects"][0]["name"] == worker["serviceAccountName"]

    own = render(
        helm, *EVAL, "--set", "servingKey.existingSecret=mine", "--set", "servingKey.key=k"
    )
    assert not [s for s in of_kind(own, "Secret") if "serving-key" in s["metadata"]["name"]]
    gateway = named(own, "Deployment", "kama-gateway")["spec"]["template"]["spec"]
    assert env_of(gateway["containers"][0])["KAMA_SERVING_KEY"] == {
        "secretKeyRef": {"name": "mine", "key": "k"}
    }
    worker_env = env_of(named(own, "Deployment", "kama-worker")["spec"]["template"]["spec"]
                        ["containers"][0])  # fmt: skip
    assert worker_env["KAMA_SERVING_KEY_SECRET"] == "kama-system/mine"
    assert worker_env["KAMA_SERVING_KEY_GENERATE"] == "false"
    assert named(own, "Role", "kama-worker-serving-key")["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mine"], "verbs": ["get"]}
    ]


def test_the_operators_key_ceilings_reach_the_gateway(helm: tuple[Path, dict[str, str]]) -> None:
    """`gateway.auth.keyCeilings` as the gateway reads it, and refused by the schema
    when a ceiling is not a positive integer."""
    ceilings = ["--set", "gateway.auth.keyCeilings.default.maxConcurrentRequests=8",
                "--set", "gateway.auth.keyCeilings.namespaces.team-a.tokensPerMinute=5000"]  # fmt: skip
    for args, expected in (([], {}), (ceilings, None)):
        docs = render(helm, *EVAL, *args)
        gateway = named(docs, "Deployment", "kama-gateway")["spec"]["template"]["spec"]
        settings = Settings.from_env(plain_env(gateway["containers"][0]))
        parsed = KeyCeilings.parse(settings.gateway_key_ceilings)
        if expected is not None:
            assert settings.gateway_key_ceilings == expected
            continue
        assert parsed.default == LimitValues(concurrent=8)
        assert parsed.namespaces == {"team-a": LimitValues(tokens_per_minute=5000)}
    assert "keyCeilings" in refused(
        helm, *EVAL, "--set", "gateway.auth.keyCeilings.default.maxConcurrentRequests=0"
    )
