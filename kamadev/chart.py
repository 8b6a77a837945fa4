"""Kama's Helm chart on the local stack: `make dev` installs Kama with it, and the
chart's stack test installs it the same way. What differs from a real cluster is only
where images come from: the stack imports them into every node's containerd under
`kama.dev/<image>:dev` (`kamadev/stack.py`), and nothing is pulled."""

from __future__ import annotations

import subprocess
from typing import Any

from kamadev.binaries import REPO_ROOT, ensure_helm
from kamadev.stack import LocalStack

CHART = REPO_ROOT / "deploy" / "chart" / "kama"
RELEASE = "kama"
HELM_TIMEOUT_S = 300


def helm(stack: LocalStack, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run Helm (built from its Go module) against the stack; raises with Helm's own
    message when `check` and it fails."""
    result = subprocess.run(
        [str(ensure_helm()), *args],
        capture_output=True,
        text=True,
        env=stack.helm_env(),
        timeout=HELM_TIMEOUT_S,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


def local_stack_values(*, hub_url: str) -> dict[str, Any]:
    """The chart values every install on the local stack needs (see the docstring)."""
    return {
        "image": {"registry": "kama.dev"},
        "images": {k: {"tag": "dev"} for k in ("kama", "llamaServer", "temporalDev")},
        "huggingFace": {"endpoint": hub_url},
    }
