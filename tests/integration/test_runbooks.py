"""The runbooks' commands, run against the situations they describe (docs/runbooks):
a corrupted cache is found by re-verifying and healed by re-downloading; an import
whose source keeps failing shows its attempts and last failure; an import refused for
a wrong checksum is replaced by one that expects the right digest; a deployment that
fits nowhere serves once its context is lowered; a deployment whose replicas keep
failing serves once the setting that broke them is put back; a team onboarded with a
namespace, rights, a quota and a key uses its model within its key's limit, and a
deployment over the quota serves once the quota is raised. Each runbook block runs as
an operator's shell would (tests/integration/runbook_shell.py). The situations only
a disruptive or chart test can stage are run there (SITUATIONS_RUN_ELSEWHERE)."""

from __future__ import annotations

import hashlib
import re
import uuid
from pathlib import Path
from typing import Any

import httpx

from kamadev.gguf_factory import ModelShape, write_model
from kamadev.hub import Fault
from tests.conftest import GatewayProcess, KamaControl
from tests.integration.runbook_shell import RUNBOOKS, run_runbook
from tests.integration.test_artifact_plane import (
    cache,
    cache_dir,
    condition,
    hf_artifact,
    publish_model,
    wait_condition,
)
from tests.integration.test_serving_plane import (
    deployment,
    md,
    ready_artifact,
    wait_md_condition,
    wait_ready,
)
from tests.support import apply, eventually, get_json, kubectl

SITUATIONS_RUN = {
    ("artifact-recovery.md", "corrupted-cache"),
    ("artifact-recovery.md", "wrong-checksum"),
    ("artifact-recovery.md", "stuck-import"),
    ("model-serving.md", "fit-failed"),
    ("model-serving.md", "runtime-failed"),
    ("model-serving.md", "oom-killed"),
    ("model-serving.md", "slow-cold-start"),
    ("tenant-onboarding.md", "onboard-tenant"),
    ("tenant-onboarding.md", "check-key"),
    ("tenant-onboarding.md", "over-quota"),
}
"""What the stack tests run (tests/unit/test_runbook_blocks.py checks it is every
situation of every runbook): this module, and the modules named with theirs below."""
SITUATIONS_RUN_ELSEWHERE = {
    ("upgrade-and-rollback.md", "upgrade"): "test_chart.py",
    ("upgrade-and-rollback.md", "rollback"): "test_chart.py",
    ("model-serving.md", "lost-node"): "test_node_loss.py",
    ("outages.md", "temporal-down"): "test_temporal_outages.py",
    ("outages.md", "temporal-back"): "test_temporal_outages.py",
    ("outages.md", "apiserver-back"): "test_control_plane_outages.py",
}


def run(control: KamaControl, runbook: str, situation: str, **env: str) -> str:
    """`run_runbook` on the session stack, with Kama's processes checked alive first."""
    control.worker.check_alive()
    return run_runbook(control.stack, RUNBOOKS[runbook], situation, env)


def wait_runtime_reason(
    control: KamaControl, namespace: str, name: str, reason: str, *, timeout: float
) -> dict[str, Any]:
    """The ModelDeployment once its `RuntimeReady` condition has `reason`."""

    def reached() -> dict[str, Any] | None:
        obj = md(control, namespace, name)
        return obj if (condition(obj, "RuntimeReady") or {}).get("reason") == reason else None

    found: dict[str, Any] = eventually(reached, timeout=timeout, what=f"{name} {reason}")
    return found


def test_artifact_recovery_heals_a_corrupted_cache(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    repo, model, _ = publish_model(control, tmp_path, seed=71)
    apply(control.stack, cache(namespace), hf_artifact(namespace, "kept", repo, ["tiny.gguf"]))
    status = wait_condition(control, namespace, "kept", "Ready")["status"]
    published = cache_dir(control, namespace) / status["servingLocation"]["subPath"]
    data = bytearray((published / "tiny.gguf").read_bytes())
    data[-1] ^= 0xFF  # the situation: a bit flipped on the volume
    (published / "tiny.gguf").write_bytes(bytes(data))

    said = run(control, "artifact", "corrupted-cache", NS=namespace, NAME="kept")
    assert "tiny.gguf" in said, "the mismatch message names the file"
    assert (published / "tiny.gguf").read_bytes() == model.read_bytes(), "downloaded again"


def test_artifact_recovery_finds_why_an_import_does_not_move(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    repo, model, _ = publish_model(control, tmp_path, seed=76)
    failing = Fault(status=503, times=1000)  # the situation: the source keeps failing
    control.hub.inject(repo, "tiny.gguf", failing)
    apply(control.stack, cache(namespace), hf_artifact(namespace, "stuck", repo, ["tiny.gguf"]))
    eventually(lambda: failing.times <= 997, timeout=120, what="three failed downloads")

    said = run(control, "artifact", "stuck-import", NS=namespace, NAME="stuck")
    assert said.startswith("Importing"), said
    assert re.search(r"attempt [3-9]\d* last failure: .*503", said), said
    failing.status = None  # the source answers again: the import goes on by itself
    obj = wait_condition(control, namespace, "stuck", "Ready")
    assert obj["status"]["files"][0]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()


def test_artifact_recovery_replaces_a_wrong_checksum(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    repo, model, _ = publish_model(control, tmp_path, seed=72)
    wrong = hf_artifact(namespace, "typo", repo, ["tiny.gguf"])
    wrong["spec"]["expectedSHA256"] = "0" * 64
    apply(control.stack, cache(namespace), wrong)
    wait_condition(control, namespace, "typo", "ChecksumMismatch")

    right = hashlib.sha256(model.read_bytes()).hexdigest()
    said = run(control, "artifact", "wrong-checksum", NS=namespace, NAME="typo", SHA256=right)
    assert "0" * 64 in said, "the diagnosis shows the digest that was expected"
    obj = get_json(control.stack, "modelartifact", "typo", "-n", namespace)
    assert obj["spec"]["expectedSHA256"] == right
    assert condition(obj, "Ready")["status"] == "True"  # type: ignore[index]


def test_model_serving_fit_failed_serves_after_asking_for_less(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    ready_artifact(control, namespace, tmp_path, name="fits", seed=73)
    apply(
        control.stack,
        deployment(
            namespace, "greedy", "fits", replicas=1, resources={"cpu": "100m"},
            runtime={"contextSize": 1 << 22, "concurrency": 64},  # terabytes of KV
        ),
    )  # fmt: skip

    def fit_failed() -> dict[str, Any] | None:
        obj = md(control, namespace, "greedy")
        return obj if (condition(obj, "FitFailed") or {}).get("status") == "True" else None

    eventually(fit_failed, timeout=120, what="greedy FitFailed")
    said = run(control, "serving", "fit-failed", NS=namespace, NAME="greedy", CONTEXT="512")
    assert "GiB" in said, "the diagnosis says what was needed"
    wait_ready(control, namespace, "greedy", 1)


def test_model_serving_runtime_failed_serves_after_the_setting_is_put_back(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    ready_artifact(control, namespace, tmp_path, name="heads16", seed=74)
    # the generated model's heads are 16 wide; a q8_0 block is 32: llama-server exits
    apply(
        control.stack,
        deployment(
            namespace, "broken", "heads16", replicas=1, resources={"cpu": "100m"},
            runtime={"contextSize": 512, "kvCache": {"keyType": "q8_0"}},
        ),
    )  # fmt: skip

    wait_runtime_reason(control, namespace, "broken", "RuntimeFailed", timeout=300)
    said = run(control, "serving", "runtime-failed", NS=namespace, NAME="broken")
    assert "RuntimeFailed" in said and "q8_0" in said
    wait_ready(control, namespace, "broken", 1)


def test_model_serving_oom_killed_serves_once_given_the_estimate(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    # 128k tokens of f16 KV, 2 KiB each: 256 MiB, which a 160 MiB limit cannot hold
    shape = ModelShape(n_layer=2, n_embd=256, n_head=4, n_head_kv=4, n_ctx=1 << 17, seed=77)
    repo = f"acme/long-{uuid.uuid4().hex[:6]}"
    control.hub.add_repo(repo, {"long.gguf": write_model(tmp_path / "long.gguf", shape=shape)})
    apply(control.stack, cache(namespace), hf_artifact(namespace, "long", repo, ["long.gguf"]))
    wait_condition(control, namespace, "long", "Ready")
    apply(
        control.stack,
        deployment(
            namespace, "squeezed", "long", replicas=1,
            runtime={"contextSize": 1 << 17},
            resources={"cpu": "100m", "memory": "96Mi", "memoryLimit": "160Mi"},
        ),
    )  # fmt: skip

    wait_runtime_reason(control, namespace, "squeezed", "RuntimeFailed", timeout=300)
    said = run(control, "serving", "oom-killed", NS=namespace, NAME="squeezed")
    assert "OOMKilled" in said and "160Mi" in said, said
    estimated = int(re.search(r"estimated RAM bytes: (\d+)", said).group(1))  # type: ignore[union-attr]
    assert estimated > 256 << 20, "the estimate counts the KV cache the limit could not hold"
    wait_ready(control, namespace, "squeezed", 1)


def test_model_serving_a_cold_start_is_broken_down(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    control = gateway.control
    ready_artifact(control, namespace, tmp_path, name="sleepy", seed=78)
    apply(
        control.stack,
        deployment(
            namespace, "sleepy", "sleepy", resources={"cpu": "100m"},
            runtime={"contextSize": 512}, scaling={"idleTimeout": "1h"},
        ),
    )  # fmt: skip
    wait_md_condition(control, namespace, "sleepy", "ScaledToZero")
    chat = {"model": f"{namespace}/sleepy", "messages": [{"role": "user", "content": "hi"}]}

    def answered() -> bool:
        return (
            httpx.post(f"{gateway.url}/v1/chat/completions", json=chat, timeout=180).status_code
            == 200
        )

    eventually(answered, timeout=240, what="the first request, answered from zero")
    said = run(control, "serving", "slow-cold-start", NS=namespace, NAME="sleepy")
    for part in ("last wake: 2", "PodScheduled", "Ready", "starting llama-server"):
        assert part in said, f"{part!r} missing from the breakdown:\n{said}"
    assert re.search(r"llama-server ready \d+\.\d+ s after its start", said), said


def test_tenant_onboarding_gives_a_team_a_quota_and_a_key_that_work(
    kama_control: KamaControl, keyed_gateway: GatewayProcess, tmp_path: Path
) -> None:
    control, tenant = kama_control, f"team-{uuid.uuid4().hex[:6]}"
    try:
        said = run(control, "tenants", "onboard-tenant",
            NS=tenant, TEAM_GROUP=f"{tenant}-people", APP="first-app",
        )  # fmt: skip
        assert re.search(r"^yes\n^no\n", said, re.M), "the team may create deployments, not pods"
        key = re.search(r"^kama_[a-z0-9-]+_[a-z0-9.-]+_[A-Za-z0-9_-]{43}$", said, re.M)
        assert key, "the runbook shows the minted key once"

        ready_artifact(control, tenant, tmp_path, name="chat", seed=75, shared=True)
        apply(
            control.stack,
            deployment(
                tenant,
                "chat",
                "chat",
                replicas=1,
                resources={"cpu": "400m"},
                scaling={"maxReplicas": 3},
            ),
        )
        wait_ready(control, tenant, "chat", 1)
        checked = run(control, "tenants", "check-key",
            GATEWAY=keyed_gateway.url, KEY=key.group(0), MODEL=f"{tenant}/chat",
        )  # fmt: skip
        assert f'"id":"{tenant}/chat"' in checked, checked
        assert checked.rstrip().endswith("200 200 200 429"), "the key's limit holds"

        # three replicas of 400m ask for more than the quota's one CPU
        kubectl(control.stack, "patch", "md", "chat", "-n", tenant, "--type", "merge",
                "-p", '{"spec":{"replicas":3}}')  # fmt: skip

        wait_runtime_reason(control, tenant, "chat", "Forbidden", timeout=180)
        diagnosed = run(control, "tenants", "over-quota", NS=tenant, NAME="chat")
        assert "exceeded quota" in diagnosed, diagnosed
        wait_ready(control, tenant, "chat", 3)
    finally:
        kubectl(control.stack, "delete", "namespace", tenant, "--wait=false", check=False)
