"""The inference routes, served straight from the gateway's server.

Every proxied request pays for whatever sits on this path, and FastAPI's routing,
dependency solving and middleware stack (or any ASGI round trip) cost more per
request than the proxying itself. So the routes that carry inference (`/v1/chat/completions`,
`/v1/completions`, `/v1/embeddings`, and llama-server's native `/completion`,
`/tokenize`, `/detokenize`, `/infill`, plain or under `/models/<ns>/<name>/`) are
matched here and handed to the proxy; everything else (model list, health,
metrics, and the 403/404 answers for llama-server's admin routes) is FastAPI's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp

from gateway.asgi_bridge import call_asgi
from gateway.errors import GatewayError
from gateway.proxy import Proxy, Relay
from gateway.registry import Model, ModelRegistry
from gateway.responder import Request, Responder

OPENAI_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}
NATIVE_ROUTES = frozenset({"completion", "tokenize", "detokenize", "infill"})
MODEL_HEADER = b"x-kama-model"
CLIENT_CLOSED = "499"  # the client left before an answer started (nginx's code)


@dataclass(frozen=True)
class InferenceRoute:
    route: str  # the metrics label
    upstream_path: str
    model_from_path: str | None = None  # /models/<ns>/<name>/<route>
    model_from_header: bool = False  # native routes: X-Kama-Model


def match_inference(path: str) -> InferenceRoute | None:
    openai = OPENAI_ROUTES.get(path)
    if openai is not None:
        return InferenceRoute(route=openai, upstream_path=path)
    parts = path.split("/")
    if len(parts) == 2 and parts[1] in NATIVE_ROUTES:
        return InferenceRoute(route=parts[1], upstream_path=path, model_from_header=True)
    if len(parts) == 5 and parts[1] == "models" and parts[4] in NATIVE_ROUTES and all(parts[2:4]):
        return InferenceRoute(
            route=parts[4], upstream_path=f"/{parts[4]}", model_from_path=f"{parts[2]}/{parts[3]}"
        )
    return None


def parse_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GatewayError(
            400, f"request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(value, dict):
        raise GatewayError(400, "request body must be a JSON object", code="invalid_json")
    return value


def resolve(registry: ModelRegistry, name: object) -> Model:
    if not isinstance(name, str) or not name:
        raise GatewayError(400, "the 'model' field is required (<namespace>/<name> or an alias)")
    model = registry.resolve(name)
    if model is None:
        raise GatewayError(404, f"model {name!r} does not exist", code="model_not_found")
    return model


async def serve_inference(
    *, proxy: Proxy, route: InferenceRoute, request: Request, responder: Responder
) -> None:
    """Proxy one inference request. If the client disconnects, the server cancels
    this: waiting for a replica at zero, waiting for an answer and relaying a stream
    all stop, and the upstream connection is closed under llama-server."""
    model: Model | None = None
    relay: Relay | None = None
    try:
        fields = parse_object(request.body)
        if route.model_from_path is not None:
            name: object = route.model_from_path
        elif route.model_from_header:
            name = next((v for k, v in request.headers if k == MODEL_HEADER), b"").decode("latin-1")
        else:
            name = fields.get("model")
        model = resolve(proxy.registry, name)
        relay = await proxy.forward(
            model=model,
            method=request.method,
            path=route.upstream_path,
            body=request.body,
            headers=request.headers,
            route=route.route,
        )
        await relay.send_to(responder)
    except GatewayError as exc:
        if model is not None:
            proxy.metrics.count_request(model=model.key, route=route.route, code=str(exc.status))
        headers, body = exc.encoded()
        responder.send_whole(exc.status, headers, body)
    except (asyncio.CancelledError, ConnectionError):
        if not responder.client_gone:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # the client left: what it was waiting for is already undone
        if model is not None and relay is None:  # a relay counts its own answer
            proxy.metrics.count_request(model=model.key, route=route.route, code=CLIENT_CLOSED)


@dataclass
class GatewayHandler:
    """What the server calls per request: inference POSTs go to the proxy, the rest
    to the FastAPI app. The proxy is looked up per request because the app's
    lifespan creates it."""

    app: ASGIApp
    proxy: Callable[[], Proxy]

    async def __call__(self, request: Request, responder: Responder) -> None:
        if request.method == "POST":
            route = match_inference(request.path)
            if route is not None:
                await serve_inference(
                    proxy=self.proxy(), route=route, request=request, responder=responder
                )
                return
        await call_asgi(self.app, request, responder)
