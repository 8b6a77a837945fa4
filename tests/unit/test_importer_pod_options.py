"""Importer pod settings an operator gives the chart (resources, proxy environment, a
CA bundle for the model source): checked when the worker starts, with the variable
named, and present in every importer pod the worker creates."""

from __future__ import annotations

import json
from typing import Any

import pytest

from activities.kube import ImporterSettings
from kama.config import Settings
from kama.contracts import ObjectRef
from kama.importer_pod import CA_MOUNT, DEFAULT_RESOURCES, ImporterMounts, ImporterPodOptions
from kama.importer_protocol import IMPORTER_PORT, TOKEN_ENV

CACHE_ONLY = ImporterMounts(cache_claim="cache")


def created_importer_pod(
    options: ImporterPodOptions,
    *,
    mounts: ImporterMounts = CACHE_ONLY,
) -> dict[str, Any]:
    """The pod body the worker sends the API server for one import."""
    settings = ImporterSettings(image="kama:dev", options=options)
    ref = ObjectRef(namespace="team-a", name="llama", uid="u-1")
    return settings.pod_manifest(
        name="llama-import-1", owner=ref, operation_id="op-1", mounts=mounts
    )


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_resources_proxy_env_and_ca_bundle_reach_the_importer_pod() -> None:
    settings = Settings.from_env(
        {
            "KAMA_IMPORTER_RESOURCES": json.dumps(
                {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": 2}}
            ),
            "KAMA_IMPORTER_ENV": json.dumps(
                [
                    {"name": "HTTPS_PROXY", "value": "http://proxy.corp:3128"},
                    {
                        "name": "NO_PROXY",
                        "valueFrom": {"configMapKeyRef": {"name": "p", "key": "n"}},
                    },
                ]
            ),
            "KAMA_IMPORTER_CA_CONFIGMAP": "corp-ca",
            "KAMA_IMPORTER_CA_KEY": "bundle.pem",
        }
    )
    pod = created_importer_pod(settings.importer_pod)
    [container] = pod["spec"]["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "250m", "memory": "512Mi"},
        "limits": {"memory": "2"},
    }
    env = env_of(container)
    assert env["HTTPS_PROXY"] == "http://proxy.corp:3128"
    assert env["NO_PROXY"] == {"configMapKeyRef": {"name": "p", "key": "n"}}
    assert env["SSL_CERT_FILE"] == f"{CA_MOUNT}/ca.crt"
    assert env["KAMA_HF_ENDPOINT"] == "https://huggingface.co", "Kama's own entries are kept"
    [volume] = [v for v in pod["spec"]["volumes"] if "configMap" in v]
    assert volume["configMap"] == {
        "name": "corp-ca",
        "items": [{"key": "bundle.pem", "path": "ca.crt"}],
    }
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount == {"name": volume["name"], "mountPath": CA_MOUNT, "readOnly": True}


def test_without_options_the_importer_pod_requests_default_resources() -> None:
    pod = created_importer_pod(ImporterPodOptions())
    [container] = pod["spec"]["containers"]
    assert container["resources"] == DEFAULT_RESOURCES
    assert container["resources"]["requests"]["memory"] and container["resources"]["limits"]
    assert "SSL_CERT_FILE" not in env_of(container)
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["cache"]


def test_the_importer_pod_meets_the_restricted_pod_security_level() -> None:
    """What `pod-security.kubernetes.io/enforce: restricted` admits (runAsNonRoot,
    seccomp RuntimeDefault or Localhost, no privilege escalation, ALL capabilities
    dropped, only restricted volume types) and no service-account token."""
    pod = created_importer_pod(
        ImporterPodOptions(),
        mounts=ImporterMounts(
            cache_claim="cache", source_claim="src", token_secret="hf", token_key="token"
        ),
    )
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    [container] = spec["containers"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not any(k in spec for k in ("hostNetwork", "hostPID", "hostIPC"))
    kinds = {next(k for k in volume if k != "name") for volume in spec["volumes"]}
    assert kinds == {"persistentVolumeClaim", "secret"}
    [source] = [v for v in spec["volumes"] if v["name"] == "source"]
    assert source["persistentVolumeClaim"] == {"claimName": "src", "readOnly": True}
    [token] = [v for v in spec["volumes"] if v["name"] == "hf-token"]
    assert token["secret"]["secretName"] == "hf"
    assert token["secret"]["items"] == [{"key": "token", "path": "token"}]


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("KAMA_IMPORTER_RESOURCES", "{cpu: 1}", "KAMA_IMPORTER_RESOURCES is not JSON"),
        ("KAMA_IMPORTER_RESOURCES", '{"request": {}}', "unknown key 'request'"),
        ("KAMA_IMPORTER_RESOURCES", '{"limits": {"cpu": true}}', "KAMA_IMPORTER_RESOURCES.limits"),
        ("KAMA_IMPORTER_ENV", '{"HTTPS_PROXY": "x"}', "KAMA_IMPORTER_ENV must be a list"),
        ("KAMA_IMPORTER_ENV", '[{"value": "x"}]', "KAMA_IMPORTER_ENV[0] must be an object"),
        ("KAMA_IMPORTER_ENV", '[{"name": "A B", "value": "x"}]', "not an environment variable"),
        ("KAMA_IMPORTER_ENV", '[{"name": "TEMPORAL_ADDRESS", "value": "x"}]', "set by Kama"),
        ("KAMA_IMPORTER_ENV", '[{"name": "SSL_CERT_FILE", "value": "/x"}]', "set by Kama"),
        ("KAMA_IMPORTER_ENV", '[{"name": "P"}]', "exactly one of value, valueFrom"),
        ("KAMA_IMPORTER_ENV", '[{"name": "P", "value": 3}]', "value must be a string"),
    ],
)
def test_a_bad_setting_stops_the_worker_naming_the_variable(
    variable: str, value: str, named: str
) -> None:
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("(", r"\(")):
        Settings.from_env({variable: value})


def test_an_importer_pod_holds_no_temporal_credential_only_its_own_token() -> None:
    """Importers run in tenants' namespaces: nothing in the pod reaches Kama's
    Temporal namespace (no address, certificate or API key, no Secret of Kama's); it
    serves the worker on its pod IP and answers only the token in its own spec, a
    new one for every pod."""
    first, second = (created_importer_pod(ImporterPodOptions()) for _ in range(2))
    [container] = first["spec"]["containers"]
    env = env_of(container)
    assert container["args"] == ["importer"]
    assert not [name for name in env if name.startswith("TEMPORAL_")]
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert container["ports"] == [{"name": "importer", "containerPort": IMPORTER_PORT}]
    token = env[TOKEN_ENV]
    assert len(token) >= 40 and token != env_of(second["spec"]["containers"][0])[TOKEN_ENV]
    assert [v["name"] for v in first["spec"]["volumes"]] == ["cache"]
