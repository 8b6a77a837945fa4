"""A stack test's evidence outlives the stack: a serving pod's log (the runtime's and
llama-server's, which it inherits) is gone with the pod, and the stack's work dir with
the stack, so a test that deletes a pod follows its log into a file while it runs, and
the `kept_logs` fixture keeps those files under `test-results/` when the test fails.
Every failed test with a `namespace` also keeps that namespace's pods, events and pod
logs and the stack's Kama process logs (`keep_namespace_evidence`)."""

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


EVIDENCE_LOG_LINES = 5000  # per container: the end of a pod's log is where it failed
PROCESS_LOG_TAIL_BYTES = 2 << 20  # of each of the stack's Kama processes' logs
EVIDENCE_TIMEOUT_S = 30


def keep_namespace_evidence(stack: LocalStack, *, namespace: str, into: Path) -> Path:
    """What a failed stack test leaves to read after the stack is gone: the namespace's
    pods (wide), events and every pod's log (the end of each container's), and the end
    of the stack's own process logs (worker, watcher, gateway). Bounded in lines, bytes
    and time; what could not be read says why in its file."""
    into.mkdir(parents=True, exist_ok=True)

    def kubectl_into(name: str, *args: str) -> str:
        """`kubectl <args>` into `into/<name>`; its output ("" when it did not answer)."""
        try:
            done = subprocess.run(
                [str(stack.binaries.kubectl), *args],
                capture_output=True,
                text=True,
                env=stack.kubectl_env(),
                timeout=EVIDENCE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            (into / name).write_text(
                f"kubectl {' '.join(args)}: no answer in {EVIDENCE_TIMEOUT_S} s\n"
            )
            return ""
        (into / name).write_text(done.stdout + done.stderr)
        return done.stdout

    kubectl_into("pods.txt", "get", "pods", "-o", "wide", "-n", namespace)
    kubectl_into("events.txt", "get", "events", "--sort-by=.lastTimestamp", "-n", namespace)
    names = kubectl_into("pod-names.txt", "get", "pods", "-o", "name", "-n", namespace)
    for pod in names.split():
        short = pod.removeprefix("pod/")
        kubectl_into(
            f"pod-{short}.log", "logs", "--all-containers", "--timestamps", "--prefix",
            f"--tail={EVIDENCE_LOG_LINES}", "-n", namespace, short,
        )  # fmt: skip
    for log in sorted((stack.workdir / "logs").glob("kama-*.log")):
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - PROCESS_LOG_TAIL_BYTES))
            (into / log.name).write_bytes(f.read())
    return into
