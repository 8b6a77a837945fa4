"""Everything llama-server serves, through Kama: every inference route answers through
the gateway what the replica answers when called straight (status and body, apart
from ids, timestamps, timings and the model, which names what the client asked for),
streamed and not; the real `openai` client speaks Chat and Responses to it and the
real `anthropic` client Messages; embedding and rerank deployments serve their
routes, and a route a deployment's mode does not serve is refused with a 400 naming
the mode, in the route's API's error shape."""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from kama.serving_plan import LLAMA_PORT
from tests.conftest import GatewayProcess, fresh_namespace
from tests.integration.test_gateway import client, serve
from tests.integration.test_observability import sample
from tests.integration.test_serving_plane import routable, serving_pods, wait_ready
from tests.support import access_key, eventually, serving_headers

VARYING = frozenset(
    {"id", "item_id", "created", "created_at", "completed_at", "timings", "system_fingerprint"}
)
"""Fields that differ between two identical requests (and `model`, renamed)."""
ANY_ERROR = -1
MESSAGE_START = "message_start"
GREEDY = {"temperature": 0, "seed": 7, "cache_prompt": False}
MESSAGES: Any = [{"role": "user", "content": "Say something about pandas."}]
"""One user turn (typed loosely: it is sent through the OpenAI and Anthropic clients)."""


def normalized(value: Any) -> Any:
    """`value` without the fields that differ between two identical requests; the
    model's name is kept apart (the gateway renames it on purpose). How much of a
    prompt llama-server found in its cache depends on the slot a request lands on,
    so a usage counts the prompt's tokens whole."""
    if isinstance(value, dict):
        kept = {k: normalized(v) for k, v in value.items() if k not in VARYING and k != "model"}
        if "cache_read_input_tokens" in kept:  # Anthropic: input_tokens is the uncached part
            kept["input_tokens"] = kept.get("input_tokens", 0) + kept.pop("cache_read_input_tokens")
        for details in ("prompt_tokens_details", "input_tokens_details"):
            kept.pop(details, None)  # cached_tokens, the same split
        return kept
    if isinstance(value, list | tuple):
        return [normalized(v) for v in value]
    return value


def models_named(value: Any) -> list[str]:
    """Every "model" string in `value` (the answer's, or the event's carried object's)."""
    if isinstance(value, dict):
        found = [v for k, v in value.items() if k == "model" and isinstance(v, str)]
        return found + [m for v in value.values() for m in models_named(v)]
    if isinstance(value, list):
        return [m for v in value for m in models_named(v)]
    return []


def parsed(response: httpx.Response) -> Any:
    """A JSON answer, or a server-sent event stream as its (event, data) pairs."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        events: list[tuple[str | None, Any]] = []
        name: str | None = None
        for line in response.text.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
                events.append((name, data if data == "[DONE]" else json.loads(data)))
                name = None
        return events
    return response.json()


class Replica:
    """One ready replica of a deployment, called straight and through the gateway."""

    def __init__(self, gw: GatewayProcess, namespace: str, name: str) -> None:
        (self.pod,) = routable(serving_pods(gw.control, namespace, name))
        self.gw, self.model = gw, f"{namespace}/{name}"

    def both(
        self, path: str, body: dict[str, Any], *, native: bool = False
    ) -> tuple[httpx.Response, httpx.Response]:
        ip = self.pod["status"]["podIP"]
        straight = httpx.post(
            f"http://{ip}:{LLAMA_PORT}{path}",
            json=body,
            headers=serving_headers(self.pod),
            timeout=120,
        )
        headers = {"X-Kama-Model": self.model} if native else {}
        through = httpx.post(
            f"{self.gw.url}{path}",
            json={**body, "model": self.model} if not native else body,
            headers=headers,
            timeout=120,
        )
        return straight, through

    def same(
        self, path: str, body: dict[str, Any], *, native: bool = False, status: int = 200
    ) -> Any:
        """Send `body` both ways and check the answers are the same, with `status`
        (ANY_ERROR: whatever error llama-server answers); the gateway's answer. A
        Messages stream the replica began without `message_start` begins with the
        gateway's (`gateway.messages_stream`), then the replica's events."""
        straight, through = self.both(path, body, native=native)
        assert straight.status_code == status or (status < 0 and straight.status_code >= 400), (
            path,
            straight.text,
        )
        assert through.status_code == straight.status_code, (path, through.text, straight.text)
        answer, expected = parsed(through), parsed(straight)
        if (
            path == "/v1/messages"
            and isinstance(expected, list)
            and expected[0][0] != MESSAGE_START
        ):
            opening, *answer = answer  # the gateway's, before the replica's first event
            assert opening[0] == MESSAGE_START and opening[1]["message"]["model"] == self.model
        assert normalized(answer) == normalized(expected), path
        named = models_named(answer)
        assert set(named) <= {self.model}, f"{path} names {named}, not the model asked for"
        return answer


@pytest.fixture(scope="module")
def generation(
    gateway: GatewayProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    """One generation deployment every route test of this module calls."""
    namespaces = fresh_namespace(gateway.control.stack, prefix="routes")
    namespace = next(namespaces)
    serve(
        gateway, namespace, tmp_path_factory.mktemp("routes"), "chat", 91,
        replicas=1, runtime={"contextSize": 2048, "concurrency": 2}, resources={"cpu": "100m"},
    )  # fmt: skip
    wait_ready(gateway.control, namespace, "chat", 1)
    yield Replica(gateway, namespace, "chat")
    next(namespaces, None)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 8, **GREEDY}),
        ("/v1/completions", {"prompt": "Once upon", "max_tokens": 8, **GREEDY}),
        ("/v1/responses", {"input": "Say something.", "max_output_tokens": 8, **GREEDY}),
        ("/v1/messages", {"messages": MESSAGES, "max_tokens": 8, **GREEDY}),
    ],
    ids=["chat", "completions", "responses", "messages"],
)
def test_generation_routes_answer_as_the_replica_does(
    generation: Replica, path: str, body: dict[str, Any], stream: bool
) -> None:
    answer = generation.same(path, {**body, "stream": stream})
    if stream:
        assert len(answer) > 2, "a stream of events"


@pytest.mark.parametrize(
    ("path", "body", "native", "status"),
    [
        ("/v1/messages/count_tokens", {"messages": MESSAGES}, False, 200),
        ("/apply-template", {"messages": MESSAGES}, True, 200),
        # the generated model has no fill-in-the-middle tokens: llama-server's 501
        ("/infill", {"input_prefix": "def f(", "input_suffix": ")", "n_predict": 4}, True, 501),
        ("/tokenize", {"content": "hello pandas"}, True, 200),
        ("/detokenize", {"tokens": [300, 301, 302]}, True, 200),
        ("/completion", {"prompt": "Once upon", "n_predict": 4, **GREEDY}, True, 200),
    ],
    ids=["count_tokens", "apply-template", "infill", "tokenize", "detokenize", "completion"],
)  # fmt: skip
def test_token_and_native_routes_answer_as_the_replica_does(
    generation: Replica, path: str, body: dict[str, Any], native: bool, status: int
) -> None:
    generation.same(path, body, native=native, status=status)


def test_errors_are_the_replicas_or_in_the_apis_shape(generation: Replica) -> None:
    """A request llama-server refuses is refused the same through the gateway; the
    gateway's own refusals of Anthropic routes are Anthropic-shaped."""
    generation.same("/v1/messages", {"max_tokens": 4}, status=ANY_ERROR)  # no messages
    missing = httpx.post(
        f"{generation.gw.url}/v1/messages",
        json={"model": "nowhere/nope", "max_tokens": 4, "messages": MESSAGES},
        timeout=30,
    )
    assert missing.status_code == 404
    assert missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "not_found_error"


def test_the_real_clients_speak_chat_responses_and_messages(generation: Replica) -> None:
    api = client(generation.gw)
    model = generation.model
    chat = api.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6)
    assert chat.model == model and chat.choices[0].message.content
    response = api.responses.create(model=model, input="Say something.", max_output_tokens=6)
    assert response.model == model and response.output_text
    events = list(
        api.responses.create(model=model, input="Say something.", max_output_tokens=6, stream=True)
    )
    assert events[-1].type == "response.completed"
    assert any(e.type == "response.output_text.delta" for e in events)

    claude = anthropic.Anthropic(
        base_url=generation.gw.url, api_key="unused", max_retries=0, timeout=120
    )
    message = claude.messages.create(model=model, max_tokens=6, messages=MESSAGES)
    assert message.model == model and message.content and message.stop_reason
    with claude.messages.stream(model=model, max_tokens=6, messages=MESSAGES) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.model == model and text == "".join(
        block.text for block in final.content if block.type == "text"
    )
    counted = claude.messages.count_tokens(model=model, messages=MESSAGES)
    assert counted.input_tokens > 0
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="nowhere/nope", max_tokens=4, messages=MESSAGES)


def test_a_replica_names_its_model_as_clients_do(generation: Replica) -> None:
    """llama-server runs with its alias set to `<namespace>/<name>`, so its answers name
    the model as clients do (and the gateway relays them as they are)."""
    body = {"messages": MESSAGES, "max_tokens": 2, **GREEDY}
    straight, through = generation.both("/v1/chat/completions", body)
    assert straight.json()["model"] == through.json()["model"] == generation.model


def test_a_messages_stream_opens_with_message_start_even_when_the_replicas_does_not(
    generation: Replica,
) -> None:
    """llama-server sends `message_start` with its first generated token's result, and
    sends no result for a token that leaves a UTF-8 character unfinished: an answer
    that begins so (greedy answers to this prompt, on the test model) streams from
    `content_block_start`, on which the anthropic client's final message fails. The
    gateway's stream opens with `message_start` all the same."""
    prompt: Any = [{"role": "user", "content": "Prompt number 1."}]
    body = {"messages": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    straight, _ = generation.both("/v1/messages", body)
    assert parsed(straight)[0][0] != MESSAGE_START, (
        "llama-server's own stream now opens with message_start: the gateway's opening "
        "(gateway.messages_stream) may go"
    )
    claude = anthropic.Anthropic(
        base_url=generation.gw.url, api_key="unused", max_retries=0, timeout=120
    )
    with claude.messages.stream(
        model=generation.model, max_tokens=4, messages=prompt, extra_body={"temperature": 0}
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.model == generation.model and final.role == "assistant"
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 4
    assert text == "".join(block.text for block in final.content if block.type == "text")


def reported_usage(path: str, answer: Any) -> tuple[int, int]:
    """(prompt, completion) tokens as the answer itself states them, read the way its
    API's clients read them: Chat's usage (a stream's last chunk), Responses' usage
    (a stream's `response.completed`), Messages' usage (a stream's `message_start` for
    the input, its `message_delta` for the output; cached input counted apart)."""
    if isinstance(answer, list):  # a stream's (event, data) pairs
        data = [d for _, d in answer if isinstance(d, dict)]
        if path == "/v1/messages":
            (start,) = [d["message"]["usage"] for d in data if d["type"] == MESSAGE_START]
            (delta,) = [d["usage"] for d in data if d["type"] == "message_delta"]
            prompt = start["input_tokens"] + start.get("cache_read_input_tokens", 0)
            return prompt, delta["output_tokens"]
        if path == "/v1/responses":
            (usage,) = [d["response"]["usage"] for d in data if d["type"] == "response.completed"]
        else:
            usage = [d["usage"] for d in data if d.get("usage")][-1]
    else:
        usage = answer["usage"]
    if "prompt_tokens" in usage:
        return usage["prompt_tokens"], usage["completion_tokens"]
    return usage["input_tokens"] + usage.get("cache_read_input_tokens", 0), usage["output_tokens"]


def key_tokens(gw: GatewayProcess, namespace: str, key: str) -> tuple[float, float]:
    """The key's prompt and completion token counters, from the gateway's metrics."""
    text = httpx.get(f"{gw.ops_url}/metrics", timeout=10).text
    prompt, completion = (
        sample(text, f"kama_gateway_key_{kind}_tokens_total", key=key, key_namespace=namespace)
        or 0.0
        for kind in ("prompt", "completion")
    )
    return prompt, completion


def tokens_gained(
    gw: GatewayProcess, namespace: str, key: str, *, before: tuple[float, float]
) -> tuple[float, float] | None:
    """What the key's counters gained since `before`, once they did (the gateway counts
    as the answer ends, which may be just after the client has read it)."""
    after = key_tokens(gw, namespace, key)
    gained = (after[0] - before[0], after[1] - before[1])
    return gained if gained != (0, 0) else None


def sent_and_counted(
    gw: GatewayProcess, namespace: str, key: tuple[str, str], path: str, body: dict[str, Any]
) -> tuple[httpx.Response, tuple[float, float]]:
    """Send `body` with the key (`(name, key)`) and what the key's counters gained by it."""
    name, secret = key
    before = key_tokens(gw, namespace, name)
    answer = httpx.post(
        f"{gw.url}{path}",
        json=body,
        headers={"authorization": f"Bearer {secret}"},
        timeout=120,
    )
    assert answer.status_code == 200, (path, answer.text)
    gained = eventually(
        functools.partial(tokens_gained, gw, namespace, name, before=before),
        timeout=10,
        what=f"{path} ({'streamed' if body.get('stream') else 'whole'}) to be counted",
    )
    return answer, gained


def test_a_keys_tokens_count_what_every_generation_api_reports(
    generation: Replica, keyed_gateway: GatewayProcess
) -> None:
    """Per-key usage and token budgets count an answer's tokens in its API's own words:
    Chat's prompt and completion tokens, Responses' and Messages' input and output
    tokens (Messages stating the cached part of the prompt apart, and a stream its
    input only in its first event); a Chat stream whose client asked for no usage, by
    llama-server's timings. Once they counted Chat with usage alone: a key's token
    budget did not hold on Responses, Messages or a stream without usage."""
    namespace = generation.model.split("/")[0]
    name = f"meter-{secrets.token_hex(3)}"
    key = name, access_key(generation.gw.control.stack, namespace, name=name)

    def known() -> bool:
        auth = {"authorization": f"Bearer {key[1]}"}
        return httpx.get(f"{keyed_gateway.url}/v1/models", headers=auth, timeout=10).is_success

    eventually(known, timeout=30, what="the gateway to know the new key")
    model = {"model": generation.model}
    chat = {**model, "messages": MESSAGES, "max_tokens": 6, **GREEDY}
    responses = {**model, "input": "Say something.", "max_output_tokens": 6, **GREEDY}
    usage_too = {"stream_options": {"include_usage": True}}
    whole_chat: tuple[int, int] | None = None
    for path, body in (
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", {**chat, **usage_too, "stream": True}),
        ("/v1/responses", responses),
        ("/v1/responses", {**responses, "stream": True}),
        ("/v1/messages", chat),
    ):
        answer, counted = sent_and_counted(keyed_gateway, namespace, key, path, body)
        reported = reported_usage(path, parsed(answer))
        assert min(reported) > 0 and counted == reported, (path, body.get("stream"))
        whole_chat = whole_chat or reported

    # a Chat stream without usage: counted as the same greedy answer whole reports it
    plain = {**chat, "stream": True}
    answer, counted = sent_and_counted(keyed_gateway, namespace, key, "/v1/chat/completions", plain)
    assert '"usage":{' not in answer.text.replace(" ", "") and counted == whole_chat

    # a Messages stream: its input from message_start. Greedy answers of the test model
    # begin with a byte token, for which llama-server sends no message_start (the
    # gateway's own states no count), so this samples until llama-server's own opens one
    for _ in range(5):
        sampled = {**chat, "temperature": 1.0, "stream": True}
        answer, counted = sent_and_counted(keyed_gateway, namespace, key, "/v1/messages", sampled)
        events = parsed(answer)
        opening = events[0][1]["message"]["usage"]
        if "cache_read_input_tokens" in opening:  # llama-server's, not the gateway's
            assert counted == reported_usage("/v1/messages", events)
            break
        assert counted == (0, reported_usage("/v1/messages", events)[1])
    else:
        pytest.fail("5 sampled Messages streams, none opened by llama-server")


def test_embedding_and_rerank_deployments_serve_their_routes_only(
    gateway: GatewayProcess, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    for name, runtime, seed in (
        ("vectors", {"mode": "Embedding", "pooling": "Mean"}, 92),
        ("ranks", {"mode": "Rerank"}, 93),
    ):
        serve(
            gateway, namespace, tmp_path_factory.mktemp(name), name, seed,
            replicas=1, runtime={"contextSize": 1024, **runtime}, resources={"cpu": "100m"},
        )  # fmt: skip
    for name in ("vectors", "ranks"):
        wait_ready(gateway.control, namespace, name, 1)
    vectors, ranks = Replica(gateway, namespace, "vectors"), Replica(gateway, namespace, "ranks")

    embedded = vectors.same("/v1/embeddings", {"input": ["hello pandas", "bears"]})
    assert len(embedded["data"]) == 2 and len(embedded["data"][0]["embedding"]) > 8
    api = client(gateway)
    sdk = api.embeddings.create(model=vectors.model, input="hello pandas")
    assert sdk.model == vectors.model and len(sdk.data[0].embedding) > 8

    query = {"query": "what is a panda", "documents": ["hi", "the giant panda is a bear"]}
    ranked = ranks.same("/v1/rerank", query)
    assert sorted(r["index"] for r in ranked["results"]) == [0, 1]
    ranks.same("/rerank", query, native=True)

    refused = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": vectors.model, "messages": MESSAGES},
        timeout=30,
    )
    assert refused.status_code == 400
    assert "served in Embedding mode" in refused.json()["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="Rerank mode"):
        anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0).messages.create(
            model=ranks.model,
            max_tokens=4,
            messages=MESSAGES,
        )
    with pytest.raises(openai.BadRequestError, match="Rerank mode"):
        api.embeddings.create(model=ranks.model, input="x")
