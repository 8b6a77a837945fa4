"""Stopping a stack leaves no process behind: control plane, Temporal, the process
node and the containers it runs are all gone, found by the stack's marker."""

from __future__ import annotations

from kamadev.processes import processes_with_marker
from kamadev.stack import SHELL_IMAGE, LocalStack
from tests.support import apply, eventually, get_json


def test_stop_leaves_no_process_behind() -> None:
    own = LocalStack(with_temporal=True).start()
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper", "namespace": "default"},
            "spec": {
                "containers": [
                    {"name": "main", "image": SHELL_IMAGE, "command": ["sh", "-c", "sleep 3600"]}
                ]
            },
        }
        apply(own, pod)
        eventually(
            lambda: get_json(own, "pod", "sleeper").get("status", {}).get("phase") == "Running",
            timeout=60,
            what="the sleeper pod to run",
        )
        running = processes_with_marker(stack_id=own.stack_id)
        # etcd, apiserver, scheduler, controller-manager, Temporal, process node, the container
        assert len(running) >= 7
    finally:
        swept = own.stop()
        own.remove_workdir()
    assert processes_with_marker(stack_id=own.stack_id) == []
    assert swept == [], "stop() itself must end everything, not the last-resort sweep"
