"""The `kama` command: one entry point for Kama's processes and operator commands.

Implemented: `kama worker` (Temporal worker for workflows and control activities),
`kama watcher` (CRD watch → workflow signals), `kama importer` (activity worker next
to a cache volume), `kama runtime` (serving pod supervisor) and `kama dev` (the
local stack with a demo model). The gateway arrives with its issue.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType

from kama.config import Settings


def _dev(args: argparse.Namespace) -> int:
    # imported lazily: the local stack is development tooling, not part of Kama's runtime
    from localstack.kama_demo import DEMO_MODEL, DEMO_NAMESPACE, start_kama_demo
    from localstack.stack import LocalStack

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print("kama dev: building or finding binaries, then starting the local stack…", flush=True)
    started = time.monotonic()
    stack = LocalStack().start()
    demo = None
    try:
        demo = start_kama_demo(stack)
        chat = (
            f"curl -s {demo.gateway_url}/v1/chat/completions -H 'Content-Type: application/json' "
            f"""-d '{{"model":"{DEMO_MODEL}","messages":[{{"role":"user","content":"Hello"}}],"max_tokens":16}}'"""
        )
        print(
            "\n".join(
                [
                    "",
                    f"Kama is up on the local stack ({time.monotonic() - started:.1f}s).",
                    f"  export KUBECONFIG={stack.kubeconfig}",
                    f"  kubectl:      {stack.binaries.kubectl}",
                    f"  Temporal:     {stack.temporal.address}  (UI {stack.temporal.ui_url})",
                    f"  gateway:      {demo.gateway_url}  (OpenAI base URL {demo.gateway_url}/v1)",
                    f"  demo model:   {DEMO_MODEL} (at zero replicas: the first request wakes it)",
                    f"  resources:    kubectl -n {DEMO_NAMESPACE} get ma,md,pods",
                    f"  chat:         {chat}",
                    f"  logs:         {stack.workdir / 'logs'}",
                    "",
                    "Ctrl-C tears everything down.",
                ]
            ),
            flush=True,
        )
        if args.exit_after is not None:
            stop.wait(args.exit_after)
        else:
            stop.wait()
    finally:
        print("kama dev: stopping…", flush=True)
        if demo is not None:
            demo.stop()
        leftovers = stack.stop()
        stack.remove_workdir()
        if leftovers:
            print(f"kama dev: had to kill leftover processes {leftovers}", file=sys.stderr)
    return 0


def _settings() -> Settings:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return Settings.from_env(os.environ)


def _worker(args: argparse.Namespace) -> int:
    from activities.workers import run_worker

    asyncio.run(run_worker(_settings()))
    return 0


def _watcher(args: argparse.Namespace) -> int:
    from watcher.main import run_watcher_process

    asyncio.run(run_watcher_process(_settings()))
    return 0


def _importer(args: argparse.Namespace) -> int:
    from activities.workers import run_importer

    asyncio.run(run_importer(_settings(), task_queue=args.task_queue))
    return 0


def _gateway(args: argparse.Namespace) -> int:
    from activities.workers import kube_api
    from gateway.app import create_app
    from gateway.run import run_gateway

    handler = create_app(settings=_settings(), api_factory=kube_api)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no log line per request
    run_gateway(handler, host=args.host, port=args.port)
    return 0


def _runtime(args: argparse.Namespace) -> int:
    from runtime.supervisor import run_runtime

    return run_runtime()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kama", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    dev = sub.add_parser(
        "dev", help="run the local stack (cluster, process node, Temporal) with a demo model"
    )
    dev.add_argument(
        "--exit-after", type=float, default=None, help="tear down after N seconds (for scripts)"
    )
    dev.set_defaults(func=_dev)
    sub.add_parser(
        "worker", help="run the Temporal worker (workflows, Kubernetes activities)"
    ).set_defaults(func=_worker)
    sub.add_parser("watcher", help="watch Kama resources and signal their workflows").set_defaults(
        func=_watcher
    )
    importer = sub.add_parser(
        "importer", help="run download/hash/publish activities next to a cache volume"
    )
    importer.add_argument(
        "--task-queue", required=True, help="the per-operation task queue to poll"
    )
    importer.set_defaults(func=_importer)
    gateway = sub.add_parser("gateway", help="serve the OpenAI-compatible gateway")
    gateway.add_argument("--host", default="0.0.0.0", help="address to listen on")
    gateway.add_argument("--port", type=int, default=8000, help="port to listen on")
    gateway.set_defaults(func=_gateway)
    sub.add_parser(
        "runtime", help="PID 1 of a serving pod: check the artifact, run llama-server, drain"
    ).set_defaults(func=_runtime)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
