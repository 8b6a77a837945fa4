"""The `kama` command: one entry point for each of Kama's processes.

`kama worker` (Temporal worker for workflows and control activities), `kama watcher`
(CRD watch → workflow signals), `kama importer` (activity worker next to a cache
volume), `kama gateway` (the OpenAI-compatible front door) and `kama runtime` (serving
pod supervisor). The local stack with a demo model is development tooling:
`python -m kamadev` (what `make dev` runs).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import TYPE_CHECKING, NoReturn

from kama.importer_protocol import TOKEN_ENV
from kamactl.errors import TemporalSetupError
from kamactl.logs import configure_logging

if TYPE_CHECKING:  # imported where used (asyncio too): `kama runtime` starts every
    # serving pod, binds its probe port first thing and needs neither the settings nor
    # the Temporal SDK they bring in
    from kama.config import Settings

QUIET_COMMANDS = frozenset({"status", "version", "access-key"})  # a person reads their stdout


def _settings() -> Settings:
    from kama.config import Settings

    try:
        return Settings.from_env(os.environ)
    except ValueError as exc:  # e.g. a KAMA_CLUSTER that cannot prefix workflow IDs
        print(f"kama: {exc}", file=sys.stderr)
        raise SystemExit(EX_CONFIG) from None


def _worker(args: argparse.Namespace) -> int:
    import asyncio

    from kamactl.worker import run_worker

    asyncio.run(run_worker(_settings()))
    return 0


def _watcher(args: argparse.Namespace) -> int:
    import asyncio

    from kamactl.watcher import run_watcher_process

    asyncio.run(run_watcher_process(_settings()))
    return 0


def _importer(args: argparse.Namespace) -> int:
    import asyncio

    from kamactl.worker import run_importer

    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise SystemExit(f"kama importer: {TOKEN_ENV} is not set (the worker sets it in the pod)")
    asyncio.run(run_importer(_settings(), host=args.host, token=token))
    return 0


def _gateway(args: argparse.Namespace) -> int:
    from gateway.app import create_app
    from gateway.held import GatewayLimits
    from gateway.transport.serve import Listen, run
    from kamactl.clients import connect_temporal, kube_api

    settings = _settings()
    app = create_app(
        settings=settings,
        api_factory=kube_api,
        temporal_factory=lambda: connect_temporal(settings),
        limits=GatewayLimits(
            max_held_bytes=args.max_held_bytes,
            max_upload_bytes=args.max_upload_bytes,
            max_waiting_requests=args.max_waiting_requests,
            max_requests_per_client=args.max_requests_per_client,
            client_write_timeout_s=args.client_write_timeout,
            max_unread_bytes_per_connection=args.max_unread_bytes_per_connection,
            max_unread_bytes=args.max_unread_bytes,
            unread_stall_s=args.unread_stall,
            answer_deadline_s=args.answer_deadline,
            **({} if args.namespace_share is None else {"namespace_share": args.namespace_share}),
        ),
        keda_scaler_host=args.host,
        keda_scaler_port=args.keda_scaler_port,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no log line per request
    run(
        public=app.public,
        ops=app.ops,
        lifespan=app.lifespan,
        listen=Listen(host=args.host, port=args.port),
        ops_listen=Listen(host=args.ops_host or args.host, port=args.ops_port),
    )
    return 0


def _byte_quantity(value: str) -> int:
    """A command-line size as a Kubernetes quantity (`256Mi`), at least one byte."""
    from kama.quantities import parse_bytes

    try:
        size = parse_bytes(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte: {value!r}")
    return size


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value!r}")
    return number


def _share(value: str) -> float:
    share = float(value)
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1: {value!r}")
    return share


def _version(args: argparse.Namespace) -> int:
    from kamactl.version import render_version, version_info

    print(render_version(version_info(env=os.environ), output=args.output))
    return 0


def _status(args: argparse.Namespace) -> int:
    import asyncio

    from kamactl.status_cmd import current_namespace, run_status

    namespace = None if args.all_namespaces else (args.namespace or current_namespace())
    return asyncio.run(run_status(settings=_settings(), namespace=namespace, output=args.output))


def _access_key_create(args: argparse.Namespace) -> int:
    from kamactl.access_key import create_access_key
    from kamactl.status_cmd import current_namespace

    try:
        return create_access_key(
            name=args.name,
            namespace=args.namespace or current_namespace(),
            models=args.model,
            namespaces=args.grant_namespace,
            requests_per_minute=args.requests_per_minute,
            tokens_per_minute=args.tokens_per_minute,
            max_concurrent_requests=args.max_concurrent_requests,
        )
    except ValueError as exc:  # pydantic's ValidationError: a name or limit out of bounds
        print(f"kama access-key create: {exc}", file=sys.stderr)
        return 2


def _runtime(args: argparse.Namespace) -> int:
    # the probe port first, before the supervisor's imports (runtime/probe_socket.py)
    from runtime.probe_socket import listen_for_probes, pod_ip

    listener = listen_for_probes(host=pod_ip())
    from runtime.supervisor import run_runtime

    return run_runtime(listener=listener)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kama", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "worker", help="run the Temporal worker (workflows, Kubernetes activities)"
    ).set_defaults(func=_worker)
    sub.add_parser("watcher", help="watch Kama resources and signal their workflows").set_defaults(
        func=_watcher
    )
    importer = sub.add_parser(
        "importer", help="serve download/hash/publish activities to the worker, next to a volume"
    )
    importer.add_argument(
        "--host",
        default=os.environ.get("POD_IP", "127.0.0.1"),
        help="address to listen on (default: $POD_IP, the pod's own IP)",
    )
    importer.set_defaults(func=_importer)
    gateway = sub.add_parser("gateway", help="serve the OpenAI-compatible gateway")
    gateway.add_argument("--host", default="0.0.0.0", help="address to listen on")
    gateway.add_argument("--port", type=int, default=8000, help="public port (inference, models)")
    gateway.add_argument(
        "--ops-port", type=int, default=9090, help="operational port (/metrics, /healthz, /readyz)"
    )
    gateway.add_argument(
        "--ops-host", default=None, help="address for the operational port (default: --host)"
    )
    gateway.add_argument(
        "--max-held-bytes",
        type=_byte_quantity,
        default="256Mi",
        help="request bytes the gateway holds at most while requests wait for a replica or "
        "a free slot, over all models; past it they get 429 (a quantity: 256Mi, 1Gi)",
    )
    gateway.add_argument(
        "--max-upload-bytes",
        type=_byte_quantity,
        default="256Mi",
        help="bytes of request bodies the gateway receives at once, over all clients; past "
        "it a request gets 429 (a quantity)",
    )
    gateway.add_argument(
        "--namespace-share",
        type=_share,
        default=None,
        help="the most of --max-waiting-requests and --max-held-bytes the requests waiting "
        "for one namespace's models may take (0 < share <= 1, default 0.5; 1: no "
        "per-namespace share)",
    )
    gateway.add_argument(
        "--max-waiting-requests",
        type=_positive_int,
        default=1024,
        help="requests waiting for a replica or a free slot, over all models (each model "
        "also at most its maxQueuedRequests); past it 429",
    )
    gateway.add_argument(
        "--max-requests-per-client",
        type=int,
        default=256,
        help="requests in progress from one client address at once (0: no cap); past it "
        "429. Behind a proxy that hides client addresses, every client shares one",
    )
    gateway.add_argument(
        "--client-write-timeout",
        type=float,
        default=30.0,
        help="seconds a client may leave the gateway's answer unread before its connection "
        "is aborted (TCP_USER_TIMEOUT; 0: the kernel's default)",
    )
    gateway.add_argument(
        "--max-unread-bytes-per-connection",
        type=_byte_quantity,
        default=4 << 20,
        help="bytes of answers one client may have not yet taken: a stream past it waits "
        "for the client (a quantity, default 4Mi)",
    )
    gateway.add_argument(
        "--max-unread-bytes",
        type=_byte_quantity,
        default=256 << 20,
        help="bytes of answers all clients have not yet taken: past it the connections "
        "owing most are aborted (a quantity, default 256Mi)",
    )
    gateway.add_argument(
        "--unread-stall",
        type=float,
        default=60.0,
        help="seconds a stream may wait for its client to take its answer before the "
        "connection is aborted",
    )
    gateway.add_argument(
        "--answer-deadline",
        type=float,
        default=3600.0,
        help="seconds a request may take from its head to its answer's last byte (0: no deadline)",
    )
    gateway.add_argument(
        "--keda-scaler-port",
        type=int,
        default=0,
        help="serve KEDA's external scaler (gRPC, plaintext) on --host at this port; "
        "0 (the default) serves none",
    )
    gateway.set_defaults(func=_gateway)
    sub.add_parser(
        "runtime", help="a serving pod's process: check the artifact, run llama-server, drain"
    ).set_defaults(func=_runtime)
    version = sub.add_parser(
        "version", help="print Kama's version, commit, Python and Temporal SDK versions"
    )
    version.add_argument("-o", "--output", choices=["text", "json"], default="text")
    version.set_defaults(func=_version)
    status = sub.add_parser(
        "status", help="what every Kama resource's workflow is doing (its status query)"
    )
    scope = status.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="the namespace (default: the context's)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    status.add_argument("-o", "--output", choices=["table", "json"], default="table")
    status.set_defaults(func=_status)
    access_key = sub.add_parser(
        "access-key", help="API keys of the gateway (ModelAccessKeys hold their SHA-256)"
    )
    access_sub = access_key.add_subparsers(dest="access_key_command", required=True)
    create = access_sub.add_parser(
        "create",
        help="mint a key: the key on stderr (once), its ModelAccessKey on stdout "
        "(pipe it to `kubectl apply -f -`)",
    )
    create.add_argument("name", help="the ModelAccessKey's name")
    create.add_argument("-n", "--namespace", help="its namespace (default: the context's)")
    create.add_argument(
        "--model",
        action="append",
        default=[],
        help="a model the key may use (repeat; default: every model of the namespace)",
    )
    create.add_argument(
        "--grant-namespace",
        action="append",
        default=[],
        help="another namespace the key may use (repeat; honoured only where the gateway "
        "allows cross-namespace grants)",
    )
    create.add_argument("--requests-per-minute", type=int, default=None)
    create.add_argument("--tokens-per-minute", type=int, default=None)
    create.add_argument("--max-concurrent-requests", type=int, default=None)
    create.set_defaults(func=_access_key_create)
    return parser


EX_CONFIG = 78  # sysexits.h: Temporal (or a setting) is not configured as Kama needs


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:  # one log format for every process (KAMA_LOG_FORMAT, KAMA_LOG_LEVEL)
        configure_logging(
            env=os.environ,
            default_level="WARNING" if args.command in QUIET_COMMANDS else "INFO",
        )
    except ValueError as exc:
        print(f"kama: {exc}", file=sys.stderr)
        return EX_CONFIG
    try:
        code: int = args.func(args)
    except TemporalSetupError as exc:
        print(f"kama {args.command}: {exc}", file=sys.stderr)
        return EX_CONFIG
    return code


def run() -> NoReturn:
    """The `kama` command as a process: `main`, then an exit that skips the
    interpreter's finalization. The Temporal SDK's Rust threads can call into a
    finalizing interpreter, which then aborts or segfaults (temporalio/sdk-python#300;
    here 2 of 100 short client processes), turning a command that did its work into
    a failure. Output and log handlers are flushed first, so nothing is lost."""
    try:
        code = main()
    except SystemExit as exc:  # argparse, or a setting refused before any work
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    end_process(code=code)


def end_process(*, code: int) -> NoReturn:
    """Flush what the process wrote, then end it with `code`, skipping atexit and
    finalization (see `run`)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing can reach it
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
