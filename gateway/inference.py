"""The inference routes, served as bare ASGI in front of FastAPI.

Every proxied request pays for whatever sits on this path, and FastAPI's routing,
dependency solving and middleware stack cost more per request than the rest of
the gateway put together. So the routes that carry inference (`/v1/chat/completions`,
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

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import GatewayError
from gateway.proxy import Proxy, Relay
from gateway.registry import Model, ModelRegistry

MAX_BODY_BYTES = 8 * 1024 * 1024
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


class ClientGone(Exception):
    """The client disconnected while its request body was being read."""


async def read_body(*, receive: Receive, headers: dict[bytes, bytes], limit: int) -> bytes:
    declared = headers.get(b"content-length", b"")
    if declared.isdigit() and int(declared) > limit:
        raise GatewayError(413, f"request body is larger than {limit} bytes", code="body_too_large")
    chunks: list[bytes] = []
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise GatewayError(
                413, f"request body is larger than {limit} bytes", code="body_too_large"
            )
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


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


class ClientWatch:
    """Cancels the request's task if its client disconnects (uvicorn's `send` drops
    writes to a gone client silently), so waiting for a replica at zero, waiting for
    a non-streamed answer, and relaying a stream all stop with the client, and the
    upstream connection is closed under llama-server."""

    def __init__(self, *, receive: Receive) -> None:
        self._receive = receive
        self.client_gone = False
        self._done = False
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None

    def __enter__(self) -> ClientWatch:
        self._task = asyncio.current_task()
        self._watcher = asyncio.create_task(self._watch())
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done = True
        if self._watcher is not None:
            self._watcher.cancel()

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        if not self._done and self._task is not None:
            self.client_gone = True
            self._task.cancel()


async def serve_inference(
    *, proxy: Proxy, route: InferenceRoute, scope: Scope, receive: Receive, send: Send
) -> None:
    raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
    headers = dict(raw_headers)
    model: Model | None = None
    relay: Relay | None = None
    watch = ClientWatch(receive=receive)
    try:
        body = await read_body(receive=receive, headers=headers, limit=MAX_BODY_BYTES)
        fields = parse_object(body)
        if route.model_from_path is not None:
            name: object = route.model_from_path
        elif route.model_from_header:
            name = headers.get(MODEL_HEADER, b"").decode("latin-1")
        else:
            name = fields.get("model")
        model = resolve(proxy.registry, name)
        with watch:
            relay = await proxy.forward(
                model=model,
                method=scope["method"],
                path=route.upstream_path,
                body=body,
                headers=raw_headers,
                route=route.route,
            )
            await relay.send_to(send)
    except ClientGone:
        return
    except GatewayError as exc:
        if model is not None:
            proxy.metrics.requests.labels(model.key, route.route, str(exc.status)).inc()
        await exc.response()(scope, receive, send)
    except asyncio.CancelledError:
        if not watch.client_gone:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # the client left: what it was waiting for is already undone
        if model is not None and relay is None:  # a relay counts its own answer
            proxy.metrics.requests.labels(model.key, route.route, CLIENT_CLOSED).inc()


class InferenceRoutes:
    """ASGI: inference POSTs go to the proxy, everything else to `app`. The proxy
    is looked up per request because the lifespan creates it."""

    def __init__(self, *, app: ASGIApp, proxy: Callable[[], Proxy]) -> None:
        self.app = app
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            route = match_inference(scope["path"])
            if route is not None:
                await serve_inference(
                    proxy=self.proxy(), route=route, scope=scope, receive=receive, send=send
                )
                return
        await self.app(scope, receive, send)
