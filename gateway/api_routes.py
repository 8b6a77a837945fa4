"""The inference routes the gateway serves: llama-server's, as the pinned llama.cpp
registers them (`tools/server/server.cpp`), each with where its model is named, the
error shape its clients expect, and the serving modes that answer it.

OpenAI-shaped routes (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
`/v1/responses`, `/v1/rerank`) and Anthropic's (`/v1/messages`,
`/v1/messages/count_tokens`) name the model in the body; llama-server's native
routes (`/completion`, `/infill`, `/tokenize`, `/detokenize`, `/apply-template`,
`/rerank`) in the `X-Kama-Model` header or the path (`/models/<ns>/<name>/<route>`).
A route the deployment's `runtime.mode` does not serve is refused here, naming the
mode, instead of reaching a llama-server that would answer 501."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import ErrorShape, GatewayError
from kama.api.deployment_choices import ServingMode

GENERATION = frozenset({ServingMode.GENERATION})
MESSAGES_ROUTE = "messages"  # Anthropic Messages: its stream opens with message_start
EVERY_MODE = frozenset(ServingMode)

BODY_ROUTES: dict[str, tuple[str, frozenset[ServingMode]]] = {
    "/v1/chat/completions": ("chat", GENERATION),
    "/v1/completions": ("completions", GENERATION),
    "/v1/responses": ("responses", GENERATION),
    "/v1/messages": (MESSAGES_ROUTE, GENERATION),
    "/v1/messages/count_tokens": ("count_tokens", GENERATION),
    "/v1/embeddings": ("embeddings", frozenset({ServingMode.EMBEDDING})),
    "/v1/rerank": ("rerank", frozenset({ServingMode.RERANK})),
}
"""Path → (metrics label, the modes that serve it), the model named in the body."""
NATIVE_ROUTES: dict[str, frozenset[ServingMode]] = {
    "completion": GENERATION,
    "infill": GENERATION,
    "apply-template": GENERATION,
    "tokenize": EVERY_MODE,
    "detokenize": EVERY_MODE,
    "rerank": frozenset({ServingMode.RERANK}),
}
"""llama-server's native routes (the model in the header or the path) → the modes."""
ANTHROPIC_ROUTES = frozenset({MESSAGES_ROUTE, "count_tokens"})


@dataclass(frozen=True)
class InferenceRoute:
    route: str  # the metrics label
    upstream_path: str
    modes: frozenset[ServingMode]  # the serving modes that answer it
    model_from_path: str | None = None  # /models/<ns>/<name>/<route>
    model_from_header: bool = False  # native routes: X-Kama-Model

    @property
    def errors(self) -> ErrorShape:
        return ErrorShape.ANTHROPIC if self.route in ANTHROPIC_ROUTES else ErrorShape.OPENAI

    def check_mode(self, *, mode: ServingMode, model: str) -> None:
        """GatewayError 400 naming the mode when `model`, served in `mode`, does not
        answer this route."""
        if mode not in self.modes:
            served = " or ".join(sorted(self.modes))
            raise GatewayError(
                400,
                f"model {model!r} is served in {mode} mode (spec.runtime.mode), which does "
                f"not answer {self.upstream_path} (served in {served} mode)",
                code="unsupported_for_mode",
            )


def match_inference(path: str) -> InferenceRoute | None:
    body = BODY_ROUTES.get(path)
    if body is not None:
        return InferenceRoute(route=body[0], upstream_path=path, modes=body[1])
    parts = path.split("/")
    if len(parts) == 2 and parts[1] in NATIVE_ROUTES:
        return InferenceRoute(
            route=parts[1],
            upstream_path=path,
            modes=NATIVE_ROUTES[parts[1]],
            model_from_header=True,
        )
    if len(parts) == 5 and parts[1] == "models" and parts[4] in NATIVE_ROUTES and all(parts[2:4]):
        return InferenceRoute(
            route=parts[4],
            upstream_path=f"/{parts[4]}",
            modes=NATIVE_ROUTES[parts[4]],
            model_from_path=f"{parts[2]}/{parts[3]}",
        )
    return None


def serving_mode(value: object) -> ServingMode:
    """`spec.runtime.mode` as written (the schema admits only the enum's values)."""
    return next((mode for mode in ServingMode if mode.value == value), ServingMode.GENERATION)
