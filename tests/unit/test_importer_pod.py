"""The importer pod, built as data (`kama.importer_pod`): what it mounts and how (the
cache read-write, the source claim, the token Secret and a CA bundle read-only, each
only from the artifact's own spec), the security a `restricted` namespace demands, its
owner and labels, and no credential in plain text but its own token. And the settings
an operator gives the chart (resources, proxy environment, a CA bundle for the model
source): checked when the worker starts, with the variable named, and present in
every importer pod the worker creates."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kama.config import Settings
from kama.contracts import ObjectRef
from kama.importer_pod import (
    CA_MOUNT,
    CACHE_MOUNT,
    DEFAULT_RESOURCES,
    IMPORTER_ROLE,
    IMPORTER_USER,
    SOURCE_MOUNT,
    TOKEN_MOUNT,
    ImporterMounts,
    ImporterPodOptions,
    ImporterTemplate,
    artifact_mounts,
    importer_pod_manifest,
    importer_pod_name,
)
from kama.importer_protocol import IMPORTER_PORT, TOKEN_ENV

CACHE_ONLY = ImporterMounts(cache_claim="cache")
EVERY_MOUNT = ImporterMounts(
    cache_claim="cache", source_claim="src", token_secret="hf", token_key="token"
)
OWNER = ObjectRef(namespace="team-a", name="llama", uid="u-1")
TOKEN = "t" * 43
NO_OPTIONS = ImporterPodOptions()


def created_importer_pod(
    options: ImporterPodOptions = NO_OPTIONS,
    *,
    mounts: ImporterMounts = CACHE_ONLY,
    token: str = TOKEN,
) -> dict[str, Any]:
    """The pod body the worker sends the API server for one import."""
    return importer_pod_manifest(
        template=ImporterTemplate(image="kama:dev", options=options),
        name=importer_pod_name(OWNER.name, "op-1"),
        owner=OWNER,
        operation_id="op-1",
        token=token,
        mounts=mounts,
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
    pod = created_importer_pod()
    [container] = pod["spec"]["containers"]
    assert container["resources"] == DEFAULT_RESOURCES
    assert container["resources"]["requests"]["memory"] and container["resources"]["limits"]
    assert "SSL_CERT_FILE" not in env_of(container)
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["cache"]


def test_the_importer_pod_meets_the_restricted_pod_security_level() -> None:
    """What `pod-security.kubernetes.io/enforce: restricted` admits (runAsNonRoot,
    seccomp RuntimeDefault or Localhost, no privilege escalation, ALL capabilities
    dropped, only restricted volume types) and no service-account token."""
    pod = created_importer_pod(mounts=EVERY_MOUNT)
    spec = pod["spec"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": IMPORTER_USER,
        "runAsGroup": IMPORTER_USER,
        "fsGroup": IMPORTER_USER,  # the claims' files are the importer's to write
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False, "no other Service's address in its env"
    [container] = spec["containers"]
    assert container["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["image"] == "kama:dev"
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
    first = created_importer_pod()
    [container] = first["spec"]["containers"]
    env = env_of(container)
    assert container["args"] == ["importer"]
    assert not [name for name in env if name.startswith("TEMPORAL_")]
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert container["ports"] == [{"name": "importer", "containerPort": IMPORTER_PORT}]
    assert env[TOKEN_ENV] == TOKEN, "the token the worker made for this pod, and no other"
    assert [v["name"] for v in first["spec"]["volumes"]] == ["cache"]


def test_the_importer_pod_is_owned_by_its_artifact_and_labelled_as_kamas_importer() -> None:
    """Deleting the artifact deletes its importer pods (the controller owner
    reference), and the labels are what the worker checks before it deletes a pod or
    relays an import to it (`activities.provenance.kama_pod`)."""
    metadata = created_importer_pod()["metadata"]
    assert metadata["name"] == importer_pod_name(OWNER.name, "op-1")
    assert metadata["namespace"] == OWNER.namespace, "in the artifact's own namespace"
    assert metadata["labels"] == {
        "app.kubernetes.io/managed-by": "kama",
        "kama.dev/role": IMPORTER_ROLE,
        "kama.dev/artifact": OWNER.name,
        "kama.dev/operation": "op-1",
    }
    assert metadata["ownerReferences"] == [
        {
            "apiVersion": "kama.dev/v1alpha1",
            "kind": "ModelArtifact",
            "name": OWNER.name,
            "uid": OWNER.uid,
            "controller": True,
        }
    ]


def test_only_the_cache_is_mounted_writable() -> None:
    """The importer writes the cache; the tenant's source claim, the Hugging Face
    token and the CA bundle it only reads (the source claim read-only twice: on the
    volume and on the mount)."""
    pod = created_importer_pod(ImporterPodOptions(ca_configmap="corp-ca"), mounts=EVERY_MOUNT)
    [container] = pod["spec"]["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts == {
        "cache": {"name": "cache", "mountPath": CACHE_MOUNT},
        "source": {"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True},
        "hf-token": {"name": "hf-token", "mountPath": TOKEN_MOUNT, "readOnly": True},
        "source-ca": {"name": "source-ca", "mountPath": CA_MOUNT, "readOnly": True},
    }
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["cache"]["persistentVolumeClaim"] == {"claimName": "cache"}
    assert volumes["source"]["persistentVolumeClaim"]["readOnly"] is True


def test_the_hugging_face_token_is_a_file_never_an_environment_value() -> None:
    """The token Secret is mounted with only its one key, readable by the importer's
    group alone; no env entry reads a Secret (which `kubectl describe` and a crash
    dump would show), and the spec holds no value of it."""
    pod = created_importer_pod(mounts=EVERY_MOUNT)
    [container] = pod["spec"]["containers"]
    [token] = [v for v in pod["spec"]["volumes"] if v["name"] == "hf-token"]
    assert token["secret"] == {
        "secretName": "hf",
        "items": [{"key": "token", "path": "token"}],
        "defaultMode": 0o440,
    }
    assert "envFrom" not in container
    assert not [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    plain = {e["name"] for e in container["env"] if "value" in e}
    assert plain == {TOKEN_ENV, "KAMA_HF_ENDPOINT"}, "its own token and the Hub, no more"


ARTIFACT_SPEC: dict[str, Any] = {
    "cacheRef": {"name": "models"},
    "source": {
        "huggingFace": {
            "repo": "acme/llama",
            "files": ["llama.gguf"],
            "tokenSecretRef": {"name": "hf", "key": "token"},
        },
        "persistentVolumeClaim": {"claimName": "tenant-models", "path": "llama.gguf"},
    },
}


def test_the_pod_mounts_what_the_artifacts_spec_names_and_the_operation_uses() -> None:
    assert artifact_mounts(
        ARTIFACT_SPEC, cache_claim="kama-cache-models", source=True, token=True
    ) == ImporterMounts(
        cache_claim="kama-cache-models",
        source_claim="tenant-models",
        token_secret="hf",
        token_key="token",
    )
    assert artifact_mounts(
        ARTIFACT_SPEC, cache_claim="kama-cache-models", source=False, token=False
    ) == ImporterMounts(cache_claim="kama-cache-models"), "only what the operation uses"
    assert artifact_mounts({}, cache_claim=None, source=True, token=True) == ImporterMounts()


def test_an_importer_pod_name_is_a_dns_label_of_one_operation() -> None:
    long = importer_pod_name("A" * 80, "0f3c2a1b-g1-a1-0123456789ab")
    assert len(long) <= 63 and long == long.lower()
    assert long.endswith("-import-0123456789ab")
    assert importer_pod_name("llama", "op-1") != importer_pod_name("llama", "op-2")
