"""Runs a runbook's shell blocks (docs/runbooks, `kamadev.runbooks`) as an operator's
shell would: `bash -euo pipefail`, with kubectl, the temporal CLI, Helm and the kama
CLI on PATH, KUBECONFIG, Helm's directories and TEMPORAL_ADDRESS set for the stack.
Shared by the stack tests that bring about a runbook's situation (test_runbooks.py,
and the chart, node-loss and outage tests, whose situations only they can stage)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from kamadev.binaries import ensure_helm
from kamadev.runbooks import runbook_steps
from kamadev.stack import LocalStack

DOCS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
RUNBOOKS = {
    "artifact": "artifact-recovery.md",
    "serving": "model-serving.md",
    "tenants": "tenant-onboarding.md",
    "upgrade": "upgrade-and-rollback.md",
    "outages": "outages.md",
}


def run_runbook(
    stack: LocalStack,
    runbook: str,
    situation: str,
    env: Mapping[str, str],
    *,
    timeout: float = 900,
    temporal_address: str | None = None,
) -> str:
    """Run `situation`'s blocks of `runbook` in order (each must succeed), with `env`
    (the runbook's variables: NS, NAME, ...) in their environment; their output
    (stdout, then stderr, of each block: what the operator's terminal shows), joined.
    `temporal_address` defaults to the stack's Temporal."""
    steps = runbook_steps((DOCS / runbook).read_text())[situation]
    tools = (
        stack.binaries.kubectl.parent,
        stack.binaries.temporal.parent,
        ensure_helm().parent,
        Path(sys.executable).parent,  # the kama CLI (`uv tool install .` puts it on PATH)
    )
    shell_env = {
        **stack.helm_env(),
        "PATH": ":".join([*(str(path) for path in tools), "/usr/bin", "/bin"]),
        "TEMPORAL_ADDRESS": temporal_address or stack.temporal.address,
        "HOME": str(stack.workdir),
        **env,
    }
    output = []
    for step in steps:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", step],
            env=shell_env, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"{runbook} {situation} step failed:\n{step}\n{done.stdout}\n{done.stderr}"
        )
        output.append(done.stdout + done.stderr)
    return "".join(output)
