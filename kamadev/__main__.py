"""`python -m kamadev` (what `make dev` runs): the local stack (control plane, two real
nodes, Temporal) with Kama's processes and a demo model at zero replicas, until Ctrl-C.
Development tooling: Kama itself never imports this package."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from types import FrameType

from kamadev.kama_demo import DEMO_MODEL, DEMO_NAMESPACE, REAL_MODEL, start_kama_demo
from kamadev.stack import LocalStack


def _dev(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print("make dev: building or finding binaries, then starting the local stack…", flush=True)
    started = time.monotonic()
    stack = LocalStack().start()
    demo = None
    try:
        demo = start_kama_demo(stack)
        chat = (
            f"curl -s {demo.gateway_url}/v1/chat/completions -H 'Content-Type: application/json' "
            f"-H 'Authorization: Bearer {demo.api_key}' "
            f"""-d '{{"model":"{DEMO_MODEL}","messages":[{{"role":"user","content":"Hello"}}],"max_tokens":16}}'"""
        )
        complete = (
            f"curl -s {demo.gateway_url}/v1/completions -H 'Content-Type: application/json' "
            f"-H 'Authorization: Bearer {demo.api_key}' "
            f"""-d '{{"model":"{REAL_MODEL}","prompt":"The capital of France is","max_tokens":16}}'"""
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
                    f"  demo models:  {REAL_MODEL} (Gemma 3 270M, a base model: completions)",
                    f"                {DEMO_MODEL} (generated, with a chat template)",
                    "                both at zero replicas: the first request wakes each",
                    f"  API key:      {demo.api_key}  (ModelAccessKey {DEMO_NAMESPACE}/demo)",
                    f"  resources:    kubectl -n {DEMO_NAMESPACE} get ma,md,pods",
                    f"  complete:     {complete}",
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
        print("make dev: stopping…", flush=True)
        if demo is not None:
            demo.stop()
        leftovers = stack.stop()
        stack.remove_workdir()
        if leftovers:
            print(f"make dev: had to kill leftover processes {leftovers}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kamadev", description=__doc__)
    parser.add_argument(
        "--exit-after", type=float, default=None, help="tear down after N seconds (for scripts)"
    )
    return _dev(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
