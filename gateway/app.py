"""`kama gateway`: the one endpoint for every model (DESIGN §6).

Public routes are OpenAI's (`/v1/chat/completions`, `/v1/completions`,
`/v1/embeddings`, `/v1/models`) and llama-server's native inference routes
(`/completion`, `/tokenize`, `/detokenize`, `/infill`, with the model from the
`X-Kama-Model` header or a `/models/<ns>/<name>/...` path). llama-server's admin
and lifecycle routes are refused. The lifespan creates the shared httpx client, the
Temporal client and the watches that keep the model registry, and runs the
backend-load poller and the demand reporter."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from kubernetes import client as k8s
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from temporalio.client import Client

from gateway.backend_load import poll_backend_load
from gateway.demand import report_demand
from gateway.errors import GatewayError
from gateway.inference import GatewayHandler
from gateway.metrics import GatewayMetrics
from gateway.proxy import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, Proxy
from gateway.registry import ModelRegistry
from gateway.upstream import UpstreamTransport
from gateway.wake import Waker
from kama.api import GROUP, VERSION
from kama.config import Settings
from kama.serving_pod import ROLE_LABEL, SERVER_ROLE
from watcher.watch import WatchTarget, as_dicts, run_watch

log = logging.getLogger("kama.gateway")

ADMIN_PATHS = ("/slots", "/props", "/models/load", "/models/unload", "/lora-adapters", "/metrics/")
UPSTREAM_KEEPALIVE_EXPIRY_S = 2.0  # below llama-server's 5 s, so a pooled connection is never stale
UPSTREAM_TIMEOUT = httpx.Timeout(
    connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S, write=30.0, pool=30.0
)


@dataclass
class GatewayState:
    registry: ModelRegistry
    proxy: Proxy
    metrics: GatewayMetrics
    synced: set[str]


def _gateway_state(app: FastAPI) -> GatewayState:
    state: GatewayState = app.state.gateway
    return state


def _state(request: Request) -> GatewayState:
    return _gateway_state(request.app)


def start_watches(
    *, api: k8s.ApiClient, registry: ModelRegistry, synced: set[str], stop: threading.Event
) -> None:
    loop = asyncio.get_running_loop()
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    deployments = WatchTarget(
        name="modeldeployments",
        list_fn=custom.list_cluster_custom_object,
        kwargs={"group": GROUP, "version": VERSION, "plural": "modeldeployments"},
    )
    pods = WatchTarget(
        name="pods",
        list_fn=as_dicts(api, core.list_pod_for_all_namespaces),
        kwargs={"label_selector": f"{ROLE_LABEL}={SERVER_ROLE}"},
    )
    appliers: dict[str, Callable[[str, dict[str, Any]], None]] = {
        "modeldeployments": registry.apply_deployment,
        "pods": registry.apply_pod,
    }
    for target in (deployments, pods):
        apply = appliers[target.name]

        def on_object(
            kind: str, obj: dict[str, Any], apply: Callable[[str, dict[str, Any]], None] = apply
        ) -> None:
            loop.call_soon_threadsafe(apply, kind, obj)

        listing = _marking_synced(
            list_fn=target.list_fn,
            on_object=on_object,
            mark=functools.partial(loop.call_soon_threadsafe, synced.add, target.name),
        )
        threading.Thread(
            target=run_watch,
            kwargs={
                "target": WatchTarget(name=target.name, list_fn=listing, kwargs=target.kwargs),
                "on_object": on_object,
                "stop": stop,
            },
            daemon=True,
        ).start()


def _marking_synced(
    *,
    list_fn: Callable[..., Any],
    on_object: Callable[[str, dict[str, Any]], None],
    mark: Callable[[], object],
) -> Callable[..., Any]:
    """A list call that hands its items over and then marks the collection synced
    (the watch loop hands them over again, which is harmless)."""

    @functools.wraps(list_fn)
    def call(**kwargs: Any) -> Any:
        result = list_fn(**kwargs)
        if not kwargs.get("watch"):
            for item in result.get("items", []):
                on_object("SYNC", item)
            mark()
        return result

    return call


def create_app(*, settings: Settings, api_factory: Callable[[], k8s.ApiClient]) -> GatewayHandler:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        metrics, synced = GatewayMetrics(), set[str]()
        registry = ModelRegistry(on_pod_gone=metrics.forget_pod)
        stop = threading.Event()
        transport = UpstreamTransport(keepalive_expiry=UPSTREAM_KEEPALIVE_EXPIRY_S)
        async with httpx.AsyncClient(transport=transport, timeout=UPSTREAM_TIMEOUT) as http:
            temporal = await Client.connect(
                settings.temporal_address, namespace=settings.temporal_namespace
            )
            waker = Waker(
                client=temporal,
                task_queue=settings.control_queue,
                metrics=metrics,
                registry=registry,
                http=http,
            )
            app.state.gateway = GatewayState(
                registry=registry,
                proxy=Proxy(registry=registry, upstream=transport, waker=waker, metrics=metrics),
                metrics=metrics,
                synced=synced,
            )
            start_watches(api=api_factory(), registry=registry, synced=synced, stop=stop)
            background = [
                asyncio.create_task(poll_backend_load(registry=registry, http=http)),
                asyncio.create_task(report_demand(registry=registry, client=temporal)),
            ]
            try:
                yield
            finally:
                stop.set()
                for task in background:
                    task.cancel()

    app = FastAPI(title="Kama gateway", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.exception_handler(GatewayError)
    async def gateway_error(_request: Request, exc: GatewayError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if request.url.path.startswith(ADMIN_PATHS) or request.url.path == "/props":
            return GatewayError(
                403, "llama-server admin routes are not served by the gateway", code="forbidden"
            ).response()
        message = f"no route {request.method} {request.url.path}"
        return GatewayError(exc.status_code, message, code="not_found").response()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        synced = _state(request).synced
        ready = {"modeldeployments", "pods"} <= synced
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(
            generate_latest(_state(request).metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        models = sorted(_state(request).registry.models.values(), key=lambda m: m.key)
        return {
            "object": "list",
            "data": [
                {
                    "id": m.key,
                    "object": "model",
                    "created": m.created,
                    "owned_by": "kama",
                    "aliases": list(m.aliases),
                    "ready": bool(m.endpoints),
                }
                for m in models
            ],
        }

    return GatewayHandler(app=app, proxy=lambda: _gateway_state(app).proxy)
