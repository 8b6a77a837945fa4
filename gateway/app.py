"""`kama gateway`: the one endpoint for every model (DESIGN §6).

Public routes are `/v1/models` and every inference route llama-server serves
(`gateway.api_routes`: OpenAI's, Anthropic's Messages, and llama-server's native
ones with the model from the `X-Kama-Model` header or a `/models/<ns>/<name>/...`
path). llama-server's admin and lifecycle routes are refused. Inference takes the lean path
(`gateway.inference`); the model list and every refusal are a FastAPI app.

Every public route but the refusals needs an API key (`gateway.auth`: a
ModelAccessKey's hash, watched like the models), unless the gateway was started with
KAMA_GATEWAY_AUTH=disabled; `/v1/models` lists what the key may use.

Operational routes (`/metrics`, `/healthz`, `/readyz`) are a second FastAPI app on a
port of their own, so pod names and model keys are not served to clients. The
public port has no health route: Kubernetes probes and load-balancer health checks
can name the operational port, and the gateway's liveness does not depend on which
port answers (a listener that dies ends the process). Neither app serves OpenAPI
documents or redirects a missing slash (a redirect's Location would be built from
the client's Host).

The lifespan connects the clients it is handed factories for (Kubernetes, Temporal),
creates the upstream pool, starts the watches that keep the model registry, and runs
the backend-load poller and the demand reporter."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from kubernetes import client as k8s
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from temporalio.client import Client

from gateway.adapters import SEPARATOR
from gateway.auth import AccessControl, aliases_for, visible_models
from gateway.auth_limits import KeyCeilings
from gateway.backend_load import poll_backend_load
from gateway.demand import gateway_identity, report_demand
from gateway.drain_reports import report_drains
from gateway.errors import GatewayError, server_refusal
from gateway.held import DEFAULT_LIMITS, GatewayLimits
from gateway.inference import InferenceRoutes
from gateway.keda_demand import GatewayDemandSource
from gateway.keda_scaler import KedaExternalScaler, serve_keda_scaler, stop_keda_scaler
from gateway.key_warnings import KeyEventRecorder
from gateway.metrics import GatewayMetrics
from gateway.proxy import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, Proxy
from gateway.registry import ModelRegistry
from gateway.transport.front import PublicFront
from gateway.transport.upstream import UpstreamTransport
from gateway.wake import Waker
from informer.watch import (
    WatchHealth,
    WatchTarget,
    in_namespaces,
    kama_objects,
    labelled_pods,
    start_watch,
)
from kama.api import GROUP, MODELACCESSKEY_PLURAL, VERSION
from kama.config import Settings
from kama.contracts import DEPLOYMENTS
from kama.serving_pod import ROLE_LABEL, SERVER_ROLE

log = logging.getLogger("kama.gateway")

ADMIN_PATHS = ("/slots", "/props", "/models/load", "/models/unload", "/lora-adapters", "/metrics")
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
    access: AccessControl


class GatewayHolder:
    """The state the lifespan creates (clients, registry, proxy), for the routes of
    both apps: one state behind two ports, where one app would keep it on `app.state`."""

    def __init__(self) -> None:
        self.current: GatewayState | None = None

    @property
    def state(self) -> GatewayState:
        if self.current is None:
            raise RuntimeError("the gateway's lifespan has not started")
        return self.current


@dataclass(frozen=True)
class GatewayApp:
    """What the server runs: the public port's front, the operational port's app,
    and the lifespan around both."""

    public: PublicFront
    ops: FastAPI
    lifespan: Callable[[], AbstractAsyncContextManager[None]]
    holder: GatewayHolder


def start_watches(
    *,
    api: k8s.ApiClient,
    registry: ModelRegistry,
    access: AccessControl,
    health: WatchHealth,
    stop: threading.Event,
    namespaces: tuple[str, ...],
) -> None:
    """The registry's two informers, ModelDeployments and serving pods, and the API
    keys' (ModelAccessKeys, unless authentication is disabled), in the watched
    namespaces or all, applied on the event loop (a re-list after an outage also
    reports what vanished meanwhile). Readiness waits for every one to list, so the
    gateway does not refuse keys it has not read yet."""
    loop = asyncio.get_running_loop()
    custom = k8s.CustomObjectsApi(api)

    def custom_objects(plural: str) -> list[WatchTarget]:
        return in_namespaces(
            lambda namespace: kama_objects(
                custom=custom, group=GROUP, version=VERSION, plural=plural, namespace=namespace
            ),
            namespaces=namespaces,
        )

    pods = in_namespaces(
        lambda namespace: labelled_pods(
            api=api, selector=f"{ROLE_LABEL}={SERVER_ROLE}", namespace=namespace
        ),
        namespaces=namespaces,
    )
    informers: list[tuple[WatchTarget, Callable[[str, dict[str, Any]], None]]] = [
        *((target, registry.apply_deployment) for target in custom_objects(DEPLOYMENTS)),
        *((target, registry.apply_pod) for target in pods),
    ]
    if access.enabled:
        informers += [
            (target, access.apply_key) for target in custom_objects(MODELACCESSKEY_PLURAL)
        ]
    for target, apply in informers:

        def on_object(
            kind: str, obj: dict[str, Any], apply: Callable[[str, dict[str, Any]], None] = apply
        ) -> None:
            loop.call_soon_threadsafe(apply, kind, obj)

        start_watch(target=target, on_object=on_object, stop=stop, health=health)


def _refusals(app: FastAPI, *, admin_paths: tuple[str, ...]) -> None:
    """Every answer FastAPI gives on its own (404, 405) in the OpenAI shape, and a
    403 for llama-server's admin routes (`admin_paths`)."""

    @app.exception_handler(GatewayError)
    async def gateway_error(_request: Request, exc: GatewayError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if admin_paths and request.url.path.startswith(admin_paths):
            return GatewayError(
                403, "llama-server admin routes are not served by the gateway", code="forbidden"
            ).response()
        message = f"no route {request.method} {request.url.path}"
        return GatewayError(exc.status_code, message, code="not_found").response()


def _fastapi(title: str, *, admin_paths: tuple[str, ...] = ()) -> FastAPI:
    app = FastAPI(
        title=title, docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False
    )
    _refusals(app, admin_paths=admin_paths)
    return app


def public_app(holder: GatewayHolder) -> FastAPI:
    """The public port's routes besides inference."""
    app = _fastapi("Kama gateway", admin_paths=ADMIN_PATHS)

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        state = holder.state
        registry = state.registry
        caller = state.access.authenticate(request.headers)
        data = []
        for m in visible_models(registry, caller):
            owned, lost = aliases_for(registry, m, caller)
            data.append(
                {
                    "id": m.key,
                    "object": "model",
                    "created": m.created,
                    "owned_by": "kama",
                    "aliases": owned,  # the aliases that route here
                    "aliases_owned_elsewhere": lost,  # claimed, owned by an older model
                    "ready": bool(m.endpoints),
                }
            )
            data += [
                {
                    "id": f"{m.key}{SEPARATOR}{adapter}",
                    "object": "model",
                    "created": m.created,
                    "owned_by": "kama",
                    "adapter_of": m.key,  # a LoRA adapter, applied to that model
                    "ready": bool(m.endpoints),
                }
                for adapter, _ in m.adapters
            ]
        return {"object": "list", "data": data}

    return app


def ops_app(holder: GatewayHolder) -> FastAPI:
    """The operational port: liveness (every watch alive), readiness (every watch
    listed once and alive: a watch failing now leaves the gateway routing from its last
    listing, ready, with how long each has failed in `/readyz` and on the metrics) and
    metrics."""
    app = _fastapi("Kama gateway operations")

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        alive = holder.state.health.alive()
        return JSONResponse({"status": "ok" if alive else "watch died"}, 200 if alive else 503)

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        health = holder.state.health
        ready = health.listed()
        return JSONResponse(
            {"ready": ready, "watches": health.report()}, status_code=200 if ready else 503
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        state = holder.state
        for name, watch in state.health.report().items():
            state.metrics.watch_failing.labels(name).set(watch["failingForSeconds"] or 0.0)
        return Response(
            generate_latest(holder.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    return app


def create_app(
    *,
    settings: Settings,
    api_factory: Callable[[], k8s.ApiClient],
    temporal_factory: Callable[[], Awaitable[Client]],
    limits: GatewayLimits = DEFAULT_LIMITS,
    keda_scaler_host: str = "0.0.0.0",
    keda_scaler_port: int = 0,  # 0: KEDA's external scaler is not served
) -> GatewayApp:
    holder = GatewayHolder()

    @asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        metrics, health = GatewayMetrics(), WatchHealth()
        registry = ModelRegistry(metrics=metrics, serving_key=settings.serving_key)
        api = api_factory()
        key_events = KeyEventRecorder(api=api)
        access = AccessControl(
            metrics=metrics,
            mode=settings.gateway_auth,
            cross_namespace_grants=settings.gateway_cross_namespace_grants,
            warn=key_events,
            ceilings=KeyCeilings.parse(settings.gateway_key_ceilings),
        )
        if not access.enabled:
            log.warning("KAMA_GATEWAY_AUTH=disabled: every client may use every model")
        stop = threading.Event()
        transport = UpstreamTransport(keepalive_expiry=UPSTREAM_KEEPALIVE_EXPIRY_S)
        async with httpx.AsyncClient(transport=transport, timeout=UPSTREAM_TIMEOUT) as http:
            temporal = await temporal_factory()
            waker = Waker(
                client=temporal,
                task_queue=settings.control_task_queue,
                cluster=settings.cluster,
                metrics=metrics,
                registry=registry,
                http=http,
            )
            holder.current = GatewayState(
                registry=registry,
                proxy=Proxy(
                    registry=registry,
                    upstream=transport,
                    waker=waker,
                    max_held_bytes=limits.max_held_bytes,
                    max_waiting_requests=limits.max_waiting_requests,
                    namespace_share=limits.namespace_share,
                ),
                metrics=metrics,
                health=health,
                access=access,
            )
            start_watches(
                api=api,
                registry=registry,
                access=access,
                health=health,
                stop=stop,
                namespaces=settings.tenancy.watch_namespaces,
            )
            me = gateway_identity()
            background = [
                asyncio.create_task(poll_backend_load(registry=registry, http=http)),
                asyncio.create_task(
                    report_demand(
                        registry=registry, client=temporal, cluster=settings.cluster, gateway=me
                    )
                ),
                asyncio.create_task(
                    report_drains(
                        registry=registry, client=temporal, cluster=settings.cluster, gateway=me
                    )
                ),
            ]
            keda = None
            try:
                if keda_scaler_port:
                    source = GatewayDemandSource(
                        registry=registry, client=temporal, cluster=settings.cluster
                    )
                    keda = await serve_keda_scaler(
                        scaler=KedaExternalScaler(source=source),
                        host=keda_scaler_host,
                        port=keda_scaler_port,
                    )
                yield
            finally:
                stop.set()
                for task in background:
                    task.cancel()
                await key_events.close()
                if keda is not None:
                    await stop_keda_scaler(keda)

    public, ops = build_apps(holder, limits=limits)
    return GatewayApp(public=public, ops=ops, lifespan=lifespan, holder=holder)


def build_apps(
    holder: GatewayHolder,
    *,
    limits: GatewayLimits = DEFAULT_LIMITS,
) -> tuple[PublicFront, FastAPI]:
    """The public port's front and the operational port's app, over one state."""
    routes = InferenceRoutes(proxy=lambda: holder.state.proxy, access=lambda: holder.state.access)
    public = PublicFront(
        max_upload_bytes=limits.max_upload_bytes,
        max_requests_per_client=limits.max_requests_per_client,
        client_write_timeout_s=limits.client_write_timeout_s,
        unread=limits.unread(),
        answer_deadline_s=limits.answer_deadline_s,
        lean=routes,
        head_check=routes.head,
        app=public_app(holder),
        refusal=server_refusal,
    )
    return public, ops_app(holder)
