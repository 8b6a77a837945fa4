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
from kama.contracts import DEPLOYMENTS
from kama.serving_pod import ROLE_LABEL, SERVER_ROLE
from watcher.watch import WatchHealth, WatchTarget, as_dicts, start_watch

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
    health: WatchHealth


def _gateway_state(app: FastAPI) -> GatewayState:
    state: GatewayState = app.state.gateway
    return state


def _state(request: Request) -> GatewayState:
    return _gateway_state(request.app)


def start_watches(
    *, api: k8s.ApiClient, registry: ModelRegistry, health: WatchHealth, stop: threading.Event
) -> None:
    """The registry's two informers: ModelDeployments and serving pods, applied on the
    event loop (a re-list after an outage also reports what vanished meanwhile)."""
    loop = asyncio.get_running_loop()
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    deployments = WatchTarget(
        name=DEPLOYMENTS,
        list_fn=custom.list_cluster_custom_object,
        kwargs={"group": GROUP, "version": VERSION, "plural": DEPLOYMENTS},
    )
    pods = WatchTarget(
        name="pods",
        list_fn=as_dicts(api, core.list_pod_for_all_namespaces),
        kwargs={"label_selector": f"{ROLE_LABEL}={SERVER_ROLE}"},
    )
    for target, apply in (
        (deployments, registry.apply_deployment),
        (pods, registry.apply_pod),
    ):

        def on_object(
            kind: str, obj: dict[str, Any], apply: Callable[[str, dict[str, Any]], None] = apply
        ) -> None:
            loop.call_soon_threadsafe(apply, kind, obj)

        start_watch(target=target, on_object=on_object, stop=stop, health=health)


def create_app(*, settings: Settings, api_factory: Callable[[], k8s.ApiClient]) -> GatewayHandler:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        metrics, health = GatewayMetrics(), WatchHealth()
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
                health=health,
            )
            start_watches(api=api_factory(), registry=registry, health=health, stop=stop)
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
    async def healthz(request: Request) -> JSONResponse:
        alive = _state(request).health.alive()
        return JSONResponse({"status": "ok" if alive else "watch died"}, 200 if alive else 503)

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        health = _state(request).health
        ready = health.ready()
        return JSONResponse(
            {"ready": ready, "watches": health.report()}, status_code=200 if ready else 503
        )

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
