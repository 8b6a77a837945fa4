"""`python -m kamadev.stack_services`: what a stack of real nodes needs beside its
kubelets, as one process of the stack: the `kama-local` StorageClass's provisioner
(kamadev.provisioner) and the heartbeats of fake GPU nodes (kamadev.fake_nodes)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kamadev.fake_nodes import heartbeat_loop
from kamadev.provisioner import LocalPathProvisioner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--volumes", required=True, type=Path)
    parser.add_argument("--node", action="append", default=[], help="a node volumes may live on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    api = k8s_config.new_client_from_config(config_file=args.kubeconfig)
    core = k8s.CoreV1Api(api)
    nodes: list[str] = list(args.node)
    provisioner = LocalPathProvisioner(
        core=core, storage=k8s.StorageV1Api(api), root=args.volumes, nodes=lambda: nodes
    )
    provisioner.ensure_storage_class()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    heartbeats = threading.Thread(
        target=heartbeat_loop,
        kwargs={"core": core, "coordination": k8s.CoordinationV1Api(api), "stop": stop},
        daemon=True,
    )
    heartbeats.start()
    provisioner.run(stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
