"""Stopping a stack leaves no process behind: control plane, Temporal, the nodes'
daemons (found by the stack's marker) and the containers they run (found by the
nodes' cgroups) are all gone."""

from __future__ import annotations

from kamadev.processes import processes_with_marker
from kamadev.realnode.cgroups import processes_below
from kamadev.stack import SHELL_IMAGE, LocalStack
from tests.support import apply, eventually, get_json, pid_alive


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
        # etcd, apiserver, scheduler, controller-manager, Temporal and its relay, the stack's
        # services, and per node: init, containerd, kubelet, kube-proxy, runc shims
        assert len(running) >= 15
        containers = [
            p for n in own.nodes.nodes for p in processes_below(n.cgroup_root) if p not in running
        ]
        assert containers, "the sleeper's processes, in its node's cgroups"
    finally:
        swept = own.stop()
        own.remove_workdir()
    assert processes_with_marker(stack_id=own.stack_id) == []
    assert not any(pid_alive(pid) for pid in containers)
    assert swept == [], "stop() itself must end everything, not the last-resort sweep"
