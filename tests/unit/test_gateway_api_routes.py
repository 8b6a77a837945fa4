"""Every inference route llama-server serves is matched, answers errors in its API's
shape, names the model the client asked for (also inside Responses and Messages
stream events), and is refused with a 400 naming the mode when the deployment's
`runtime.mode` does not serve it."""

from __future__ import annotations

import json

import pytest

from gateway.answer_model import EventStreamRenamer, rename_model
from gateway.api_routes import match_inference, serving_mode
from gateway.errors import ErrorShape, GatewayError
from kama.api.deployment_choices import ServingMode

NAME = json.dumps("ns/chat").encode()


@pytest.mark.parametrize(
    ("path", "route", "upstream", "errors"),
    [
        ("/v1/chat/completions", "chat", "/v1/chat/completions", ErrorShape.OPENAI),
        ("/v1/responses", "responses", "/v1/responses", ErrorShape.OPENAI),
        ("/v1/messages", "messages", "/v1/messages", ErrorShape.ANTHROPIC),
        ("/v1/messages/count_tokens", "count_tokens", "/v1/messages/count_tokens", ErrorShape.ANTHROPIC),
        ("/v1/embeddings", "embeddings", "/v1/embeddings", ErrorShape.OPENAI),
        ("/v1/rerank", "rerank", "/v1/rerank", ErrorShape.OPENAI),
        ("/rerank", "rerank", "/rerank", ErrorShape.OPENAI),
        ("/apply-template", "apply-template", "/apply-template", ErrorShape.OPENAI),
        ("/models/ns/m/infill", "infill", "/infill", ErrorShape.OPENAI),
        ("/models/ns/m/detokenize", "detokenize", "/detokenize", ErrorShape.OPENAI),
    ],
)  # fmt: skip
def test_every_inference_route_is_matched(
    path: str, route: str, upstream: str, errors: ErrorShape
) -> None:
    found = match_inference(path)
    assert found is not None
    assert (found.route, found.upstream_path, found.errors) == (route, upstream, errors)


@pytest.mark.parametrize(
    "path", ["/slots", "/props", "/v1/chat/completions/control", "/lora-adapters", "/models/ns/x"]
)
def test_admin_and_unknown_routes_are_not_inference(path: str) -> None:
    assert match_inference(path) is None


def test_anthropic_errors_have_anthropic_shape() -> None:
    error = GatewayError(404, "model 'x' does not exist", code="model_not_found")
    _, body = error.encoded(ErrorShape.ANTHROPIC)
    assert json.loads(body) == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "model 'x' does not exist"},
    }
    _, openai = error.encoded()
    assert json.loads(openai)["error"]["code"] == "model_not_found"
    streamed = GatewayError(502, "replica failed", type="api_error").event(ErrorShape.ANTHROPIC)
    assert streamed.startswith(b"event: error\ndata: ")
    assert json.loads(streamed.split(b"data: ", 1)[1])["error"]["type"] == "api_error"


@pytest.mark.parametrize(
    ("path", "mode", "served"),
    [
        ("/v1/chat/completions", ServingMode.GENERATION, True),
        ("/v1/chat/completions", ServingMode.EMBEDDING, False),
        ("/v1/messages", ServingMode.RERANK, False),
        ("/v1/embeddings", ServingMode.EMBEDDING, True),
        ("/v1/embeddings", ServingMode.GENERATION, False),
        ("/v1/rerank", ServingMode.RERANK, True),
        ("/rerank", ServingMode.EMBEDDING, False),
        ("/tokenize", ServingMode.RERANK, True),
    ],
)
def test_a_route_the_mode_does_not_serve_is_refused_naming_the_mode(
    path: str, mode: ServingMode, served: bool
) -> None:
    route = match_inference(path)
    assert route is not None
    if served:
        route.check_mode(mode=mode, model="ns/m")
        return
    with pytest.raises(GatewayError) as refused:
        route.check_mode(mode=mode, model="ns/m")
    assert refused.value.status == 400 and f"served in {mode} mode" in refused.value.message


def test_serving_mode_of_a_spec() -> None:
    assert serving_mode("Embedding") is ServingMode.EMBEDDING
    assert serving_mode(None) is ServingMode.GENERATION


def test_responses_and_messages_events_name_the_model_asked_for() -> None:
    started = {"type": "message_start", "message": {"id": "m1", "model": "/models/t.gguf"}}
    created = {"type": "response.created", "response": {"id": "r", "model": "/models/t.gguf"}}
    for event, carrier in ((started, "message"), (created, "response")):
        document = json.dumps(event).encode()
        renamed = json.loads(rename_model(document, NAME))
        assert renamed[carrier]["model"] == "ns/chat"
    stream = b"event: message_start\ndata: " + json.dumps(started).encode() + b"\n\n"
    renamer = EventStreamRenamer(name="ns/chat")
    out = renamer.feed(stream[:20]) + renamer.feed(stream[20:]) + renamer.close()
    assert json.loads(out.split(b"data: ")[1])["message"]["model"] == "ns/chat"


def test_only_the_carried_objects_model_is_renamed() -> None:
    for document in (
        {"type": "x", "item": {"model": "keep"}},
        {"choices": [{"message": {"model": "keep"}}]},
        {"message": {"content": {"model": "keep"}}},
    ):
        encoded = json.dumps(document).encode()
        assert rename_model(encoded, NAME) == encoded
