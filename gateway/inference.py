"""The inference routes, the gateway's lean path.

Every proxied request pays for whatever sits on its path, and FastAPI's routing,
validation and middleware cost more per request than the proxying itself. So the
routes that carry inference (`gateway.api_routes`: OpenAI's, Anthropic's Messages
and llama-server's native ones, plain or under `/models/<ns>/<name>/`) are matched
here and handed to the proxy by the server front; everything else (the model list
and the refusals of unknown and llama-server admin routes) is FastAPI's. Errors
answer in the route's API's shape (Anthropic's on the Messages routes).

Before a request is parsed: its API key (`gateway.auth`: 401), its content type
(JSON only, 415: a browser page can send `text/plain` or a form to any origin
without asking, never `application/json`) and its key's limits (429). After: the
model, which the key must be allowed to use (403, or 404 for another tenant's). The
answer's token count is read as it passes (`gateway.auth_usage`) and charged to
the key when the request ends."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from gateway.adapters import lora_field, split_adapter, with_lora
from gateway.affinity import affinity_key
from gateway.api_routes import InferenceRoute, match_inference
from gateway.auth import AccessControl, Caller, check_model, resolve_for
from gateway.auth_usage import MeteredReply
from gateway.errors import ErrorShape, GatewayError
from gateway.media_urls import remote_media_url
from gateway.metrics import GatewayMetrics
from gateway.proxy import Proxy
from gateway.registry import Model, ModelRegistry
from gateway.token_reservation import tokens_to_reserve
from gateway.transport.exchange import Handler, HeaderLookup, HeadVerdict, Reply, Request

MODEL_HEADER = "x-kama-model"
CLIENT_CLOSED = "499"  # the client left before an answer started (nginx's code)
# an answer listing tokens (`/tokenize` with pieces) is about 12 times its input: the
# input of these routes is capped so that their answers stay near 12 MiB
TOKEN_LIST_ROUTES = frozenset({"tokenize", "detokenize"})
MAX_TOKEN_LIST_BODY_BYTES = 1 << 20


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


def model_name(name: object) -> str:
    """The model the client asked for, as it named it."""
    if not isinstance(name, str) or not name:
        raise GatewayError(400, "the 'model' field is required (<namespace>/<name> or an alias)")
    return name


def resolve(registry: ModelRegistry, name: str, caller: Caller | None = None) -> Model:
    """The model `name` routes to for `caller` (None: authentication is disabled),
    or the refusal: 404 if there is none the caller may know of, 403 if its key may
    not use it."""
    model = resolve_for(registry, name, caller)
    if model is None:
        raise GatewayError(404, f"model {name!r} does not exist", code="model_not_found")
    check_model(caller, model, asked_as=name)
    return model


def resolve_selected(
    registry: ModelRegistry, name: str, caller: Caller | None
) -> tuple[Model, str | None]:
    """The model `name` routes to and the adapter it selects: a name that routes as it
    is selects none; else `<model>:<adapter>` (`gateway.adapters`)."""
    split = split_adapter(name)
    if resolve_for(registry, name, caller) is not None or split is None:
        return resolve(registry, name, caller), None
    base, adapter = split
    if resolve_for(registry, base, caller) is None:
        return resolve(registry, name, caller), None  # the 404 names what was asked
    return resolve(registry, base, caller), adapter


def is_json(content_type: object) -> bool:
    """`application/json` or a `+json` type, parameters aside (case-insensitive)."""
    if not isinstance(content_type, str):
        return False
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def require_json(request: Request) -> None:
    if not is_json(request.headers.get("content-type")):
        raise GatewayError(
            415,
            "the request body must be JSON: send 'Content-Type: application/json'",
            code="unsupported_media_type",
        )


async def serve_inference(
    *,
    proxy: Proxy,
    metrics: GatewayMetrics,
    route: InferenceRoute,
    request: Request,
    reply: Reply,
    access: AccessControl,
) -> None:
    """Proxy one inference request and count its answer. If the client disconnects,
    the front cancels this: waiting for a replica at zero, waiting for an answer and
    relaying a stream all stop, and the upstream connection is closed under
    llama-server."""
    model: Model | None = None
    caller: Caller | None = None
    metered: MeteredReply | None = None
    reserved = 0
    try:
        if request.head_checked:  # authenticated and admitted from the head (`head`)
            caller = cast("Caller | None", request.principal)
        else:
            caller = access.authenticate(request.headers)
            access.admit(caller)
        require_json(request)
        if route.route in TOKEN_LIST_ROUTES and len(request.body) > MAX_TOKEN_LIST_BODY_BYTES:
            raise GatewayError(
                413,
                f"a {route.route} request body may have at most {MAX_TOKEN_LIST_BODY_BYTES} "
                "bytes (its answer lists every token)",
            )
        if caller is not None:
            reply = metered = MeteredReply(reply)
        fields = parse_object(request.body)
        if route.model_from_path is not None:
            name = route.model_from_path
        elif route.model_from_header:
            name = model_name(request.headers.get(MODEL_HEADER, ""))
        else:
            name = model_name(fields.get("model"))
        model, adapter = resolve_selected(proxy.registry, name, caller)
        route.check_mode(mode=model.mode, model=name)
        if not model.remote_media and (url := remote_media_url(fields)) is not None:
            raise GatewayError(
                400,
                f"model {name!r} takes images only as data: URLs, not {url[:64]!r} "
                "(the serving pod would fetch it; spec.routing.allowRemoteMediaUrls lets it)",
                code="remote_media_not_allowed",
            )
        reserved = access.reserve(
            caller,
            tokens_to_reserve(
                route=route.route,
                fields=fields,
                body_bytes=len(request.body),
                context=model.context,
            ),
        )
        affinity = affinity_key(fields) if model.prefix_affinity else None
        body = request.body
        if adapter is not None:
            lora = lora_field(adapters=model.adapters, adapter=adapter, model=model.key)
            body = with_lora(fields, lora)
        # only the raw body is kept while the request waits or is forwarded: the
        # held-bytes budget counts it, and parsed JSON can cost many times its size
        del fields
        await proxy.forward(
            model=model,
            affinity=affinity,
            method=request.method,
            path=route.upstream_path,
            body=body,
            headers=request.headers,
            route=route.route,
            reply=reply,
            asked_as=name,
            errors=route.errors,
        )
    except GatewayError as exc:
        headers, body = exc.encoded(route.errors)
        reply.send(exc.status, headers, body)
    finally:
        if metered is not None:
            prompt, completion = metered.tokens()
            access.settle(
                caller,
                reserved=reserved,
                prompt_tokens=prompt,
                completion_tokens=completion,
                # it may have used them: answered (a stream cut short states nothing)
                # or left while its replica worked
                keep_reservation=reply.client_gone or 200 <= reply.status < 300,
            )
        if not request.head_checked:
            access.leave(caller)  # admitted here, above
        if model is not None:
            if reply.status:
                code = str(reply.status)
            else:  # no answer yet: the client left, or the front answers the failure
                code = CLIENT_CLOSED if reply.client_gone else "500"
            metrics.count_request(model=model.key, route=route.route, code=code)


@dataclass(frozen=True)
class InferenceRoutes:
    """The front's `LeanRoutes`: inference POSTs get a handler, the rest None. The
    proxy and the access control are looked up per request because the lifespan
    creates them."""

    proxy: Callable[[], Proxy]
    access: Callable[[], AccessControl]

    def __call__(self, method: str, path: str) -> Handler | None:
        if method != "POST":
            return None
        route = match_inference(path)
        if route is None:
            return None

        async def handle(request: Request, reply: Reply) -> None:
            proxy = self.proxy()
            await serve_inference(
                proxy=proxy,
                metrics=proxy.registry.metrics,
                route=route,
                request=request,
                reply=reply,
                access=self.access(),
            )

        return handle

    def head(self, method: str, path: str, headers: HeaderLookup) -> HeadVerdict:
        """The front's `HeadCheck`: every request on the public port needs a known key
        (when keys are on), and an inference request is counted against its key's
        request limit, all before a byte of its body is read or counted. Refused in
        the route's error shape."""
        access = self.access()
        route = match_inference(path) if method == "POST" else None
        try:
            caller = access.authenticate(headers)
            if route is not None:
                access.admit(caller)
        except GatewayError as exc:
            style = route.errors if route is not None else ErrorShape.OPENAI
            answer_headers, body = exc.encoded(style)
            return HeadVerdict(refusal=(exc.status, answer_headers, body))
        if caller is None:
            return HeadVerdict()
        requester = f"{caller.key.namespace}/{caller.key.name}"
        if route is None:
            return HeadVerdict(principal=caller, requester=requester)
        return HeadVerdict(
            principal=caller,
            requester=requester,
            release=functools.partial(access.leave, caller),
        )
