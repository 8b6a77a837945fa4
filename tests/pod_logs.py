"""A stack test's evidence outlives the stack: a serving pod's log (the runtime's and
llama-server's, which it inherits) is gone with the pod, and the stack's work dir with
the stack, so a test that deletes a pod follows its log into a file while it runs, and
the `kept_logs` fixture keeps those files under `test-results/` when the test fails."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kamadev.stack import LocalStack

FOLLOW_STOP_S = 5.0


@contextmanager
def following_pod_log(stack: LocalStack, *, namespace: str, pod: str, into: Path) -> Iterator[Path]:
    """`kubectl logs -f --timestamps` of a running pod's containers into `into/<pod>.log`
    until the block ends (or the pod's containers stop); yields the file."""
    into.mkdir(parents=True, exist_ok=True)
    path = into / f"{pod}.log"
    with path.open("ab") as out:
        follower = subprocess.Popen(
            [str(stack.binaries.kubectl), "logs", "-f", "--timestamps", "--all-containers",
             "-n", namespace, pod],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=stack.kubectl_env(),
        )  # fmt: skip
        try:
            yield path
        finally:
            try:
                follower.wait(timeout=FOLLOW_STOP_S)
            except subprocess.TimeoutExpired:
                follower.terminate()
                follower.wait()
