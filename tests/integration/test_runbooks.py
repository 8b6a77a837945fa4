"""The runbooks' commands, run against the situations they describe (docs/runbooks):
a corrupted cache is found by re-verifying and healed by re-downloading; an import
refused for a wrong checksum is replaced by one that expects the right digest; a
deployment that fits nowhere serves once its context is lowered; a deployment whose
replicas keep failing serves once the setting that broke them is put back. Each
runbook block runs as an operator's shell would (`bash -euo pipefail`, kubectl and
the temporal CLI on PATH, KUBECONFIG and TEMPORAL_ADDRESS set)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

from kamadev.runbooks import runbook_steps
from tests.conftest import KamaControl
from tests.integration.test_artifact_plane import (
    cache,
    condition,
    hf_artifact,
    publish_model,
    wait_condition,
)
from tests.integration.test_serving_plane import deployment, md, ready_artifact, wait_ready
from tests.support import apply, eventually, get_json

DOCS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
RUNBOOKS = {"artifact": "artifact-recovery.md", "serving": "model-serving.md"}
SITUATIONS_RUN = {
    ("artifact-recovery.md", "wrong-checksum"),
    ("model-serving.md", "fit-failed"),
    ("model-serving.md", "runtime-failed"),
}
"""What this module runs (tests/unit/test_runbook_blocks.py checks it is everything)."""


def run_runbook(
    control: KamaControl, runbook: str, situation: str, *, timeout: float = 900, **env: str
) -> str:
    """Run `situation`'s blocks of `runbook` in order; their output, joined."""
    steps = runbook_steps((DOCS / runbook).read_text())[situation]
    stack = control.stack
    shell_env = {
        **stack.kubectl_env(),
        "PATH": f"{stack.binaries.kubectl.parent}:{stack.binaries.temporal.parent}:/usr/bin:/bin",
        "TEMPORAL_ADDRESS": stack.temporal.address,
        "HOME": str(stack.workdir),
        **env,
    }
    output = []
    for step in steps:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", step],
            env=shell_env, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{runbook} {situation} step failed:\n{step}\n{done.stderr}"
        output.append(done.stdout)
    return "".join(output)


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
    said = run_runbook(
        control, RUNBOOKS["artifact"], "wrong-checksum", NS=namespace, NAME="typo", SHA256=right
    )
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
    said = run_runbook(
        control, RUNBOOKS["serving"], "fit-failed", NS=namespace, NAME="greedy", CONTEXT="512"
    )
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

    def runtime_failed() -> dict[str, Any] | None:
        obj = md(control, namespace, "broken")
        ready = condition(obj, "RuntimeReady") or {}
        return obj if ready.get("reason") == "RuntimeFailed" else None

    eventually(runtime_failed, timeout=300, what="broken RuntimeFailed")
    said = run_runbook(control, RUNBOOKS["serving"], "runtime-failed", NS=namespace, NAME="broken")
    assert "RuntimeFailed" in said and "q8_0" in said
    wait_ready(control, namespace, "broken", 1)
