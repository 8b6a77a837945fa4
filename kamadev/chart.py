"""Kama's Helm chart on the local stack: `make dev` installs Kama with it, and the
chart's stack test installs it the same way. What differs from a real cluster is only
what the process node needs: images are names in its image map (`kamadev/stack.py`),
and pods share this machine's network, so Kama's servers bind their pod's own
loopback address and the watcher's health port is a free one."""

from __future__ import annotations

import subprocess
from typing import Any

from kamadev.binaries import REPO_ROOT, ensure_helm
from kamadev.processes import free_port
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
        "listenOnPodIP": True,
        "huggingFace": {"endpoint": hub_url},
        # 0.0.0.0:8081 would take the serving pods' supervisor port on this node
        "watcher": {"healthPort": free_port()},
    }
