"""API keys on the public port, as clients see them over real sockets (the gateway of
`test_gateway_http`, started with `auth="apikey"`): 401 without a known key, 404 for
another tenant's model and 403 for a model the key leaves out, `/v1/models` per key,
415 for a body that is not JSON, 429 with Retry-After for a key over its requests
or tokens per minute, per-key usage on the operational port, rotation without a
restart. Plus the sliding window's arithmetic, the settings and the CRD's model."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import httpx
import pytest
import yaml
from pydantic import ValidationError

from gateway.auth import AccessControl
from gateway.auth_limits import KeyCeilings, SlidingWindow
from gateway.auth_usage import HEAD_BYTES, TAIL_BYTES, MeteredReply, tokens_in
from gateway.held import DEFAULT_LIMITS, GatewayLimits
from gateway.metrics import GatewayMetrics
from gateway.token_reservation import tokens_to_reserve
from gateway.transport import front
from kama.api import ModelAccessKeySpec, key_object, key_sha256, minted_key
from kama.config import Settings
from kamactl.access_key import create_access_key
from tests.unit import test_gateway_http
from tests.unit.gateway_support import deployment
from tests.unit.test_gateway_http import (
    MODEL,
    Gateway,
    Replica,
    _chunk,
    eventually,
    running_gateway,
)

pytestmark = pytest.mark.timeout(30)

SECRET = "s" * 43


def key_for(namespace: str, name: str, secret: str = SECRET) -> str:
    return minted_key(namespace=namespace, name=name, secret=secret)


KEY = key_for("ns", "app")
OTHER_KEY = key_for("team-b", "b")
USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


class CountingReplica(Replica):
    """A replica that also reports token usage: `usage` (a whole OpenAI answer),
    `usage-stream` (events, the last with usage) and `native` (llama-server's
    `/completion` counts)."""

    async def answer(
        self, mode: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if mode in ("usage", "native"):
            document: dict[str, Any] = {"choices": [{"text": 'say "usage": {"x": 1}'}]}
            if mode == "usage":
                document["usage"] = USAGE
            else:
                document |= {"content": "hi", "tokens_evaluated": 3, "tokens_predicted": 4}
            body = json.dumps(document).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            return True
        if mode == "usage-stream":
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            for event in (
                {"choices": [{"delta": {"content": "a"}}], "usage": None},
                {"choices": [], "usage": USAGE},
            ):
                writer.write(_chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
                await writer.drain()
            writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            return True
        return await super().answer(mode, reader, writer)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def access_key(
    name: str, *, key: str | None = None, namespace: str = "ns", uid: str | None = None, **spec: Any
) -> dict[str, Any]:
    """ModelAccessKey `namespace`/`name` holding the hash of `key` (by default its own
    key with `SECRET`)."""
    key = key_for(namespace, name) if key is None else key
    return {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": uid or f"uid-{namespace}-{name}",
            "creationTimestamp": spec.pop("created", "2026-01-01T00:00:00Z"),
        },
        "spec": {"keySHA256": key_sha256(key), **spec},
    }


@asynccontextmanager
async def auth_gateway(
    monkeypatch: pytest.MonkeyPatch,
    *,
    cross_namespace: bool = False,
    limits: GatewayLimits = DEFAULT_LIMITS,
) -> AsyncIterator[tuple[Gateway, Clock, httpx.AsyncClient]]:
    """A gateway that needs keys, over `CountingReplica`, with `ns/chat` (aliases
    `shared`, `chat`) and `team-b/secret` (owns `shared`: it is older)."""
    monkeypatch.setattr(test_gateway_http, "Replica", CountingReplica)
    clock = Clock()
    async with running_gateway(auth="apikey", limits=limits) as gw, httpx.AsyncClient() as http:
        access = gw.state.access
        access.clock = clock
        access.cross_namespace_grants = cross_namespace
        registry = gw.state.registry
        registry.apply_deployment(
            "MODIFIED",
            deployment("chat", aliases=["shared", "chat"], created="2026-02-01T00:00:00Z"),
        )
        registry.apply_deployment(
            "ADDED",
            deployment(
                "secret",
                namespace="team-b",
                uid="u2",
                aliases=["shared"],
                created="2026-01-01T00:00:00Z",
            ),
        )
        yield gw, clock, http


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def body(model: str = MODEL, mode: str = "whole") -> dict[str, object]:
    return {"model": model, "prompt": "hi", "mode": mode}


async def metrics_text(gw: Gateway) -> str:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{gw.ops_url}/metrics")).text


def error_of(answer: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


MiB = 1024 * 1024
ANSWERED_S = 5.0  # a refusal from the head comes at once; the body would take 30 s


async def announce(
    gw: Gateway, *, length: int, key: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection that announces a `length`-byte completion, sends its first
    byte and no more."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    auth = b"" if key is None else b"authorization: Bearer %s\r\n" % key.encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"%scontent-length: %d\r\n\r\n{" % (auth, length)
    )
    await writer.drain()
    return reader, writer


async def answer_head(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str]]:
    """The status line and header fields the gateway answered with (before the body it
    announced has come)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ANSWERED_S)
    status, *fields = head.decode().split("\r\n")
    pairs = (f.split(":", 1) for f in fields if ":" in f)
    return status.encode(), {name.lower(): value.strip() for name, value in pairs}


async def test_a_request_without_a_known_key_spends_no_upload_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Key-less bodies announced and never sent once took the gateway's whole upload
    budget (every other client's POST then 429): the key is checked from the head,
    before a body byte is read or counted."""
    async with auth_gateway(monkeypatch, limits=GatewayLimits(max_upload_bytes=MiB)) as (
        gw, _, http,
    ):  # fmt: skip
        gw.state.access.apply_key("ADDED", access_key("app"))
        announcers = [
            await announce(gw, length=900 * 1024),
            await announce(gw, length=900 * 1024, key=key_for("ns", "app", "x" * 43)),
        ]
        for reader, _ in announcers:
            status, _ = await answer_head(reader)
            assert status.startswith(b"HTTP/1.1 401"), status
        assert gw.front.uploading == 0, "nothing of a refused body counted"
        big = body() | {"prompt": "b" * (200 * 1024)}
        url = f"{gw.url}/v1/completions"
        assert (await http.post(url, json=big, headers=bearer(KEY))).status_code == 200
        for _, writer in announcers:
            writer.close()


async def test_a_key_over_its_request_limit_is_refused_before_its_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with auth_gateway(monkeypatch, limits=GatewayLimits(max_upload_bytes=MiB)) as (
        gw, _, http,
    ):  # fmt: skip
        gw.state.access.apply_key("ADDED", access_key("app", requestsPerMinute=1))
        url = f"{gw.url}/v1/completions"
        assert (await http.post(url, json=body(), headers=bearer(KEY))).status_code == 200
        reader, writer = await announce(gw, length=900 * 1024, key=KEY)
        status, fields = await answer_head(reader)
        assert status.startswith(b"HTTP/1.1 429"), status
        assert int(fields["retry-after"]) > 0
        assert gw.front.uploading == 0
        writer.close()


async def test_refused_bodies_are_drained_only_within_their_own_allowance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refused request's body is read and dropped so its client reads the answer,
    but key-less clients get a small allowance of such drains of their own: past it,
    the refusal closes the connection instead of reading on."""
    monkeypatch.setattr(front, "REFUSED_DRAINS", 2)
    async with auth_gateway(monkeypatch) as (gw, _, _http):
        announcers = [await announce(gw, length=MiB) for _ in range(4)]
        closes = []
        for reader, _ in announcers:
            status, fields = await answer_head(reader)
            assert status.startswith(b"HTTP/1.1 401"), status
            closes.append(fields.get("connection") == "close")
        assert closes == [False, False, True, True], "two drained, the rest closed"
        assert gw.front.draining_refused <= 2
        for _, writer in announcers:
            writer.close()


async def test_requests_need_a_known_key(monkeypatch: pytest.MonkeyPatch) -> None:
    async with auth_gateway(monkeypatch) as (gw, _, http):
        gw.state.access.apply_key("ADDED", access_key("app"))
        url = f"{gw.url}/v1/completions"
        for headers in (
            {},
            bearer(key_for("ns", "app", "w" * 43)),  # a wrong secret
            bearer(key_for("ns", "absent")),  # no such object
            bearer(KEY.removeprefix("kama_")),  # not in the minted format
            {"authorization": f"Basic {KEY}"},
            {"authorization": "Bearer"},
            bearer("x" * 10_000),
        ):
            refused = await http.post(url, json=body(), headers=headers)
            assert refused.status_code == 401, headers
            assert error_of(refused)["code"] == "invalid_api_key"
            assert refused.headers["www-authenticate"].startswith("Bearer")
        models = await http.get(f"{gw.url}/v1/models")
        assert models.status_code == 401 and error_of(models)["code"] == "invalid_api_key"
        assert (await http.post(url, json=body(), headers=bearer(KEY))).status_code == 200
        assert (await http.post(url, json=body(), headers={"x-api-key": KEY})).status_code == 200
        gw.state.access.apply_key("MODIFIED", access_key("app", disabled=True))
        assert (await http.post(url, json=body(), headers=bearer(KEY))).status_code == 401
        assert len(gw.replica.requests) == 2  # refusals never reach a replica


async def test_a_key_is_rotated_without_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    old, new, newer = key_for("ns", "v1"), key_for("ns", "v2"), key_for("ns", "v2", "n" * 43)
    async with auth_gateway(monkeypatch) as (gw, _, http):
        access, url = gw.state.access, f"{gw.url}/v1/completions"
        access.apply_key("ADDED", access_key("v1"))
        access.apply_key("ADDED", access_key("v2"))
        for key in (old, new):  # both work while clients switch
            assert (await http.post(url, json=body(), headers=bearer(key))).status_code == 200
        access.apply_key("DELETED", access_key("v1"))
        assert (await http.post(url, json=body(), headers=bearer(old))).status_code == 401
        assert (await http.post(url, json=body(), headers=bearer(new))).status_code == 200
        # a key object whose hash changed answers to the new key only
        access.apply_key("MODIFIED", access_key("v2", key=newer))
        assert (await http.post(url, json=body(), headers=bearer(new))).status_code == 401
        assert (await http.post(url, json=body(), headers=bearer(newer))).status_code == 200
        text = await metrics_text(gw)
    assert 'kama_gateway_key_requests_total{key="v2",key_namespace="ns"}' in text
    assert 'key="v1"' not in text  # a deleted key's series (and limits) are gone


async def test_a_key_sees_and_uses_only_what_it_grants(monkeypatch: pytest.MonkeyPatch) -> None:
    async with auth_gateway(monkeypatch) as (gw, _, http):
        access, url = gw.state.access, f"{gw.url}/v1/completions"
        access.apply_key("ADDED", access_key("app"))
        access.apply_key("ADDED", access_key("b", key=OTHER_KEY, namespace="team-b"))
        listed = (await http.get(f"{gw.url}/v1/models", headers=bearer(KEY))).json()["data"]
        assert [m["id"] for m in listed] == [MODEL]
        # `shared` is team-b's (older); for this key it routes to the model it may use,
        # and nothing names the other tenant's model
        assert listed[0]["aliases"] == ["shared", "chat"]
        assert listed[0]["aliases_owned_elsewhere"] == {}
        shared = await http.post(url, json=body("shared", "named"), headers=bearer(KEY))
        assert shared.status_code == 200 and shared.headers["x-kama-model"] == MODEL
        # another namespace's model: the same answer as a model that does not exist
        for name in ("team-b/secret", "team-b/nothing"):
            hidden = await http.post(url, json=body(name), headers=bearer(KEY))
            assert hidden.status_code == 404 and error_of(hidden)["code"] == "model_not_found"
        native = await http.post(
            f"{gw.url}/models/team-b/secret/completion", json={"prompt": "x"}, headers=bearer(KEY)
        )
        assert native.status_code == 404
        # team-b's key lists its own model and does not reach ns/chat
        other = await http.get(f"{gw.url}/v1/models", headers=bearer(OTHER_KEY))
        assert [m["id"] for m in other.json()["data"]] == ["team-b/secret"]
        assert (await http.post(url, json=body(), headers=bearer(OTHER_KEY))).status_code == 404
        # a key limited to other models of its namespace: 403 for this one, and unlisted
        access.apply_key("MODIFIED", access_key("app", models=["embed"]))
        forbidden = await http.post(url, json=body(), headers=bearer(KEY))
        assert forbidden.status_code == 403
        assert error_of(forbidden)["code"] == "model_not_allowed"
        listed = (await http.get(f"{gw.url}/v1/models", headers=bearer(KEY))).json()["data"]
        assert listed == []
        assert gw.replica.requests == [body("shared", "named")]


async def test_cross_namespace_grants_need_the_operators_consent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grant = access_key("app", namespaces=["team-b"], models=["chat", "team-b/secret"])
    async with auth_gateway(monkeypatch) as (gw, _, http):
        gw.state.access.apply_key("ADDED", grant)
        listed = (await http.get(f"{gw.url}/v1/models", headers=bearer(KEY))).json()["data"]
        assert [m["id"] for m in listed] == [MODEL]  # the grant is ignored
    async with auth_gateway(monkeypatch, cross_namespace=True) as (gw, _, http):
        gw.state.access.apply_key("ADDED", grant)
        listed = (await http.get(f"{gw.url}/v1/models", headers=bearer(KEY))).json()["data"]
        assert [m["id"] for m in listed] == [MODEL, "team-b/secret"]


async def test_a_copied_hash_grants_nothing_and_refuses_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """team-b copies ns's key hash into its namespace. Before, the older object won, so
    deleting ns's object handed ns's key to team-b's models: now a key is checked
    against the one object it names, and a hash two objects hold is no key at all (a
    Warning Event on each), until one of them goes."""
    warned: list[tuple[str, str]] = []
    async with auth_gateway(monkeypatch) as (gw, _, http):
        access = gw.state.access
        access.warn = lambda key, reason, message: warned.append((key.key, reason))
        access.apply_key("ADDED", access_key("app"))
        copy = access_key("stolen", key=KEY, namespace="team-b", created="2026-03-01T00:00:00Z")
        access.apply_key("ADDED", copy)
        refused = await http.get(f"{gw.url}/v1/models", headers=bearer(KEY))
        assert refused.status_code == 401 and "more than one" in error_of(refused)["message"]
        assert sorted(warned) == [
            ("ns/app", "DuplicateKeyHash"),
            ("team-b/stolen", "DuplicateKeyHash"),
        ]
        access.apply_key("MODIFIED", copy)  # warned once per object and hash
        assert len(warned) == 2
        # the key names ns/app: its secret under team-b's name is no key of team-b's
        renamed = bearer(key_for("team-b", "stolen"))
        assert (await http.get(f"{gw.url}/v1/models", headers=renamed)).status_code == 401
        access.apply_key("DELETED", access_key("app"))  # now only the copy holds the hash
        assert (await http.get(f"{gw.url}/v1/models", headers=bearer(KEY))).status_code == 401
        access.apply_key("ADDED", access_key("app", uid="uid-again"))
        access.apply_key("DELETED", copy)
        listed = (await http.get(f"{gw.url}/v1/models", headers=bearer(KEY))).json()["data"]
        assert [m["id"] for m in listed] == [MODEL]


async def test_only_minted_keys_are_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Library defaults (`EMPTY`, `sk-no-key-required`) and keys not naming an object
    were squattable: any tenant holding their hash got the requests of every client
    that sends them. Now they are refused whatever object holds their hash."""
    async with auth_gateway(monkeypatch) as (gw, _, http):
        for n, squatted in enumerate(("EMPTY", "sk-no-key-required", "kama_" + SECRET)):
            gw.state.access.apply_key("ADDED", access_key(f"squat{n}", key=squatted))
            refused = await http.get(f"{gw.url}/v1/models", headers=bearer(squatted))
            assert refused.status_code == 401, squatted
            assert "kama_<namespace>_<name>_<secret>" in error_of(refused)["message"]


def test_a_minted_key_names_its_object() -> None:
    assert key_object(KEY) == ("ns", "app")
    assert key_object(key_for("team-b", "my.app-2", "a_b-" * 11)) == ("team-b", "my.app-2")
    for bad in (
        "EMPTY",
        "kama_ns_app_" + "s" * 31,  # a short secret
        "kama_ns_" + SECRET,  # no name
        "kama_NS_app_" + SECRET,  # not a namespace
        "kama_ns_app!_" + SECRET,
        "kama_" + "n" * 64 + "_app_" + SECRET,  # a namespace is at most 63 characters
        "kama_ns_app_" + SECRET + "=",
    ):
        assert key_object(bad) is None, bad
    with pytest.raises(ValueError, match="not a key"):
        minted_key(namespace="ns", name="app", secret="short")


async def test_a_body_that_is_not_json_is_415(monkeypatch: pytest.MonkeyPatch) -> None:
    async with auth_gateway(monkeypatch) as (gw, _, http):
        gw.state.access.apply_key("ADDED", access_key("app"))
        text = json.dumps(body())
        for content_type in (
            None,
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ):
            headers = bearer(KEY) | ({"content-type": content_type} if content_type else {})
            refused = await http.post(f"{gw.url}/v1/completions", content=text, headers=headers)
            assert refused.status_code == 415, content_type
            assert error_of(refused)["code"] == "unsupported_media_type"
        for content_type in ("application/json; charset=utf-8", "Application/JSON"):
            headers = bearer(KEY) | {"content-type": content_type}
            answer = await http.post(f"{gw.url}/v1/completions", content=text, headers=headers)
            assert answer.status_code == 200, content_type
        assert len(gw.replica.requests) == 2


async def test_requests_per_minute_are_limited_per_key(monkeypatch: pytest.MonkeyPatch) -> None:
    async with auth_gateway(monkeypatch) as (gw, clock, http):
        access, url = gw.state.access, f"{gw.url}/v1/completions"
        access.apply_key("ADDED", access_key("app", requestsPerMinute=2))
        access.apply_key("ADDED", access_key("b", key=OTHER_KEY, namespace="team-b"))
        for _ in range(2):
            assert (await http.post(url, json=body(), headers=bearer(KEY))).status_code == 200
        refused = await http.post(url, json=body(), headers=bearer(KEY))
        assert refused.status_code == 429
        error = error_of(refused)
        assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
        wait = int(refused.headers["retry-after"])
        assert 60 <= wait <= 120
        # another key is not affected
        models = await http.get(f"{gw.url}/v1/models", headers=bearer(OTHER_KEY))
        assert models.status_code == 200
        clock.now += wait - 1
        assert (await http.post(url, json=body(), headers=bearer(KEY))).status_code == 429
        clock.now += 1
        assert (await http.post(url, json=body(), headers=bearer(KEY))).status_code == 200
        text = await metrics_text(gw)
    assert (
        'kama_gateway_key_rate_limited_total{key="app",key_namespace="ns",limit="requests"} 2.0'
        in text
    )
    assert 'kama_gateway_key_requests_total{key="app",key_namespace="ns"} 3.0' in text


async def test_tokens_are_counted_per_key_and_limited(monkeypatch: pytest.MonkeyPatch) -> None:
    async with auth_gateway(monkeypatch) as (gw, clock, http):
        access, url = gw.state.access, f"{gw.url}/v1/completions"
        access.apply_key("ADDED", access_key("app", tokensPerMinute=30))
        for mode in ("usage", "usage-stream"):  # 12 tokens each
            answer = await http.post(url, json=body(mode=mode), headers=bearer(KEY))
            assert answer.status_code == 200, answer.text
        native = await http.post(
            f"{gw.url}/models/ns/chat/completion", json={"mode": "native"}, headers=bearer(KEY)
        )
        assert native.status_code == 200  # 3 + 4 tokens: 31 in all, over the budget
        text = await metrics_text(gw)
        labels = '{key="app",key_namespace="ns"}'
        assert f"kama_gateway_key_prompt_tokens_total{labels} 17.0" in text
        assert f"kama_gateway_key_completion_tokens_total{labels} 14.0" in text
        refused = await http.post(url, json=body(), headers=bearer(KEY))
        assert refused.status_code == 429 and error_of(refused)["type"] == "tokens"
        assert int(refused.headers["retry-after"]) >= 1
        clock.now += int(refused.headers["retry-after"])
        assert (await http.post(url, json=body(), headers=bearer(KEY))).status_code == 200


async def settled(check: Callable[[], bool], what: str) -> None:
    async def holds() -> bool:
        return check()

    await eventually(holds, what)


async def test_a_key_may_have_only_so_many_requests_in_progress(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with auth_gateway(monkeypatch) as (gw, _, http):
        access, url = gw.state.access, f"{gw.url}/v1/completions"
        access.apply_key("ADDED", access_key("app", maxConcurrentRequests=1))
        caller = access.authenticate(bearer(KEY))
        assert caller is not None
        limits = caller.limits
        hanging = asyncio.create_task(http.post(url, json=body(mode="hang"), headers=bearer(KEY)))
        await settled(lambda: len(gw.replica.requests) == 1, "the first request at its replica")
        refused = await http.post(url, json=body(), headers=bearer(KEY))
        assert refused.status_code == 429, refused.text
        assert error_of(refused)["type"] == "concurrency"
        assert "1 requests in progress (at most 1)" in error_of(refused)["message"]
        other = await http.get(f"{gw.url}/v1/models", headers=bearer(KEY))
        assert other.status_code == 200, "the model list is not inference: not capped"
        hanging.cancel()  # its client leaves: its place is given back
        await settled(lambda: limits.in_progress == 0, "the place given back")
        assert (await http.post(url, json=body(), headers=bearer(KEY))).status_code == 200
        # refused from its head (413 here) or answered: every place comes back
        big = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
        too_big = await http.post(url, content=b"x" * (9 * MiB), headers=big)
        assert too_big.status_code == 413
        await settled(lambda: limits.in_progress == 0, "the 413's place given back")


async def test_requests_at_once_cannot_take_a_token_budget_many_times_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tokens were counted only when answers ended, so N requests at once could each
    spend the whole budget. Now each reserves its max_tokens and prompt when admitted,
    at most what is left, and is settled to what its answer states."""
    async with auth_gateway(monkeypatch) as (gw, _, http):
        access, url = gw.state.access, f"{gw.url}/v1/completions"
        access.apply_key("ADDED", access_key("app", tokensPerMinute=100))
        caller = access.authenticate(bearer(KEY))
        assert caller is not None and caller.limits.tokens is not None
        limits, window = caller.limits, caller.limits.tokens
        asked = body(mode="hang") | {"max_tokens": 60}
        first = asyncio.create_task(http.post(url, json=asked, headers=bearer(KEY)))
        await settled(lambda: len(gw.replica.requests) == 1, "the first request in flight")
        assert window.current > 60, "its max_tokens and prompt are reserved"
        second = asyncio.create_task(http.post(url, json=asked, headers=bearer(KEY)))
        await settled(lambda: len(gw.replica.requests) == 2, "the second gets what is left")
        assert window.current == 100
        refused = await http.post(url, json=asked, headers=bearer(KEY))
        assert refused.status_code == 429 and error_of(refused)["type"] == "tokens"
        assert "reserved by requests in progress" in error_of(refused)["message"]
        for task in (first, second):
            task.cancel()  # the clients leave: nothing stated, the reservations stay
        await settled(lambda: limits.in_progress == 0, "both ended")
        assert window.current == 100
    async with auth_gateway(monkeypatch) as (gw, _, http):
        access, url = gw.state.access, f"{gw.url}/v1/completions"
        access.apply_key("ADDED", access_key("app", tokensPerMinute=100))
        caller = access.authenticate(bearer(KEY))
        assert caller is not None and caller.limits.tokens is not None
        answered = await http.post(
            url, json=body(mode="usage") | {"max_tokens": 60}, headers=bearer(KEY)
        )
        assert answered.status_code == 200
        assert caller.limits.tokens.current == 12, "settled to the 12 tokens it used"


async def test_a_stream_cut_short_is_charged_its_reservation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream whose client leaves before its last event states no usage: it was
    charged 0 tokens, so a client could stream for free by hanging up at the end."""
    async with auth_gateway(monkeypatch) as (gw, _, _http):
        access = gw.state.access
        access.apply_key("ADDED", access_key("app", tokensPerMinute=1000))
        caller = access.authenticate(bearer(KEY))
        assert caller is not None and caller.limits.tokens is not None
        limits = caller.limits
        host, port = gw.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        payload = json.dumps(body(mode="hang-stream") | {"max_tokens": 50}).encode()
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s"
            % (KEY.encode(), len(payload), payload)
        )
        await writer.drain()
        await reader.readuntil(b'data: {"n": 1}')  # the stream has started
        writer.close()
        await settled(lambda: limits.in_progress == 0, "the stream to end")
        assert caller.limits.tokens.current >= 50, "charged what it reserved"


def test_keys_are_capped_by_the_operators_ceilings() -> None:
    ceilings = KeyCeilings.parse(
        {
            "default": {"requestsPerMinute": 100, "maxConcurrentRequests": 8},
            "namespaces": {"team-a": {"tokensPerMinute": 5000}},
        }
    )
    access = AccessControl(metrics=GatewayMetrics(), ceilings=ceilings)
    access.apply_key("ADDED", access_key("free"))  # sets nothing: gets the ceilings
    access.apply_key("ADDED", access_key("greedy", requestsPerMinute=10_000))
    access.apply_key("ADDED", access_key("modest", requestsPerMinute=10))
    access.apply_key("ADDED", access_key("a", namespace="team-a", tokensPerMinute=10**9))
    limits = {
        name: caller.limits
        for name in ("free", "greedy", "modest")
        if (caller := access.authenticate(bearer(key_for("ns", name)))) is not None
    }
    assert [limits[n].requests_limit for n in ("free", "greedy", "modest")] == [100, 100, 10]
    assert all(limit.concurrent == 8 for limit in limits.values())
    team_a = access.authenticate(bearer(key_for("team-a", "a")))
    assert team_a is not None
    assert team_a.limits.tokens_limit == 5000 and team_a.limits.requests_limit is None
    for bad, field_name in (
        ({"default": {"requestsPerMinute": 0}}, "requestsPerMinute"),
        ({"default": {"rpm": 1}}, "unknown"),
        ({"namespaces": {"x": {"tokensPerMinute": "many"}}}, "tokensPerMinute"),
        ({"everyone": {}}, "unknown"),
    ):
        with pytest.raises(ValueError, match=field_name):
            KeyCeilings.parse(bad)


def test_what_a_request_may_use_is_bounded_before_it_is_forwarded() -> None:
    fields: dict[str, object] = {"max_tokens": 100}
    assert tokens_to_reserve(route="chat", fields=fields, body_bytes=400, context=None) == 201
    assert tokens_to_reserve(route="chat", fields=fields, body_bytes=400, context=150) == 150
    assert tokens_to_reserve(route="chat", fields={}, body_bytes=400, context=2048) == 2048
    assert tokens_to_reserve(route="chat", fields={}, body_bytes=400, context=None) is None
    native = {"n_predict": -1}  # llama-server's "no limit"
    assert tokens_to_reserve(route="completion", fields=native, body_bytes=8, context=512) == 512
    assert tokens_to_reserve(route="embeddings", fields={}, body_bytes=400, context=None) == 101
    # tokenizing costs its replica the prompt's work: charged as much
    assert tokens_to_reserve(route="tokenize", fields={}, body_bytes=400, context=None) == 101


async def test_unauthenticated_mode_is_open(monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_gateway() as gw, httpx.AsyncClient() as http:
        assert not gw.state.access.enabled
        listed = (await http.get(f"{gw.url}/v1/models")).json()["data"]
        assert [m["id"] for m in listed] == [MODEL]
        answer = await http.post(f"{gw.url}/v1/completions", json=body())
        assert answer.status_code == 200


@pytest.mark.parametrize(
    ("limit", "uses", "cost"),
    [(10, [(0.0, 10)], 1), (10, [(0.0, 4), (61.0, 9)], 1), (5, [(30.0, 5), (70.0, 2)], 1)],
)
def test_retry_after_is_exactly_when_the_window_allows_it(
    limit: int, uses: list[tuple[float, int]], cost: int
) -> None:
    window = SlidingWindow(limit=limit, started=0.0)
    for at, amount in uses:
        window.add(at, amount)
    now = uses[-1][0]
    wait = window.retry_after(now, cost=cost)
    assert wait >= 1
    assert window.estimate(now + wait) + cost <= limit
    assert window.estimate(now + wait - 1) + cost > limit


def test_usage_is_read_from_the_end_of_an_answer() -> None:
    answer = json.dumps({"choices": [{"text": '"usage": {"prompt_tokens": 99}'}], "usage": USAGE})
    assert tokens_in(answer.encode()) == (7, 5)
    assert tokens_in(b'data: {"usage": null}\n\ndata: {"usage": {"prompt_tokens": 2}}\n\n') == (
        2,
        0,
    )
    assert tokens_in(b'{"tokens": [1, 2]}') == (0, 0)
    assert tokens_in(b'{"usage": {"prompt_tokens": "many"}}') == (0, 0)


# llama-server's own shapes (tools/server/server-task.cpp of the pinned build)
RESPONSES_USAGE = {
    "input_tokens": 21,
    "output_tokens": 8,
    "total_tokens": 29,
    "input_tokens_details": {"cached_tokens": 5},
}
MESSAGES_USAGE = {"cache_read_input_tokens": 5, "input_tokens": 16, "output_tokens": 8}


def sse(*events: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
    )


def test_responses_and_messages_answers_count_their_input_and_output() -> None:
    """Both APIs name their counts input and output tokens; Messages count the cached
    part of the prompt apart. A token budget counts the whole prompt either way."""
    assert tokens_in(json.dumps({"output": [], "usage": RESPONSES_USAGE}).encode()) == (21, 8)
    assert tokens_in(json.dumps({"content": [], "usage": MESSAGES_USAGE}).encode()) == (21, 8)
    completed = {"type": "response.completed", "response": {"usage": RESPONSES_USAGE}}
    created = {"type": "response.created", "response": {"usage": None}}
    assert tokens_in(sse(("response.created", created), ("response.completed", completed))) == (
        21,
        8,
    )


def test_a_messages_stream_counts_the_input_its_first_event_states() -> None:
    """A Messages stream states its input in `message_start` and only its output at the
    end (`message_delta`): a long answer's start is beyond the tail, so the head is
    read too."""
    start = {"type": "message_start", "message": {"usage": {**MESSAGES_USAGE, "output_tokens": 0}}}
    delta = {"type": "message_delta", "usage": {"output_tokens": 900}}
    text = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x" * 200}}
    head = sse(("message_start", start))
    body = sse(*[("content_block_delta", text)] * 400)  # ~100 KB: past the tail
    tail = sse(("message_delta", delta), ("message_stop", {"type": "message_stop"}))
    assert tokens_in(head + tail) == (21, 900)  # a short answer: all of it in the tail
    assert tokens_in(head, (head + body + tail)[-TAIL_BYTES:]) == (21, 900)
    assert tokens_in((head + body + tail)[-TAIL_BYTES:]) == (0, 900), "the head is needed"


def test_a_stream_without_usage_is_counted_by_llama_servers_timings() -> None:
    """A Chat stream whose client did not ask for usage ends with llama-server's
    timings (the prompt's cached and processed parts, and the generated tokens): a
    key's budget counts them, so not asking is no way around it. Usage, where the
    answer states it, wins."""
    timings = {"cache_n": 12, "prompt_n": 9, "predicted_n": 8, "predicted_ms": 50.1}
    chunks = [
        {"choices": [{"delta": {"content": "a"}, "finish_reason": None}]},
        {"choices": [{"delta": {}, "finish_reason": "length"}], "timings": timings},
    ]
    stream = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    assert tokens_in(stream + b"data: [DONE]\n\n") == (21, 8)
    with_usage = {"choices": [], "usage": USAGE, "timings": timings}
    assert tokens_in(stream + b"data: " + json.dumps(with_usage).encode() + b"\n\n") == (7, 5)
    text = {"choices": [{"text": '"timings": {"predicted_n": 999}'}]}  # escaped in the text
    assert tokens_in(json.dumps(text).encode()) == (0, 0)


async def test_a_metered_reply_keeps_the_head_of_a_long_stream() -> None:
    sent: list[bytes] = []

    class Sink:
        status = 200
        client_gone = False

        def start(self, status: int, headers: Any) -> None:
            self.status = status

        async def write(self, chunk: bytes) -> None:
            sent.append(chunk)

    start = {"type": "message_start", "message": {"usage": {**MESSAGES_USAGE, "output_tokens": 0}}}
    text = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x" * 200}}
    delta = {"type": "message_delta", "usage": {"output_tokens": 900}}
    reply = MeteredReply(cast(Any, Sink()))
    reply.start(200, [])
    for piece in (sse(("message_start", start))[:40], sse(("message_start", start))[40:]):
        await reply.write(piece)  # the first event split over two pieces
    for _ in range(400):
        await reply.write(sse(("content_block_delta", text)))
    await reply.write(sse(("message_delta", delta)))
    assert reply.tokens() == (21, 900)
    assert sum(map(len, sent)) > TAIL_BYTES + HEAD_BYTES


def test_the_gateway_needs_keys_unless_told_otherwise() -> None:
    assert Settings.from_env({}).gateway_auth == "apikey"
    assert Settings.from_env({"KAMA_GATEWAY_AUTH": "disabled"}).gateway_auth == "disabled"
    with pytest.raises(ValueError, match="KAMA_GATEWAY_AUTH"):
        Settings.from_env({"KAMA_GATEWAY_AUTH": "off"})
    with pytest.raises(ValueError, match="not one of"):
        AccessControl(metrics=GatewayMetrics(), mode="none")


def test_a_key_object_holds_a_hash_only() -> None:
    spec = ModelAccessKeySpec.model_validate({"keySHA256": key_sha256(KEY), "models": ["chat"]})
    assert spec.key_sha256 == key_sha256(KEY) and KEY not in spec.model_dump_json()
    for bad in (KEY, key_sha256(KEY).upper(), key_sha256(KEY)[:63]):
        with pytest.raises(ValidationError):
            ModelAccessKeySpec.model_validate({"keySHA256": bad})
    with pytest.raises(ValidationError):
        ModelAccessKeySpec.model_validate({"keySHA256": key_sha256(KEY), "requestsPerMinute": 0})


def test_a_minted_key_is_shown_once_and_its_object_holds_its_hash() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = create_access_key(
        name="my-app",
        namespace="team-a",
        models=["chat"],
        namespaces=[],
        requests_per_minute=60,
        tokens_per_minute=None,
        out=out,
        err=err,
    )
    assert code == 0
    key = err.getvalue().splitlines()[-1]
    obj = yaml.safe_load(out.getvalue())
    assert key.startswith("kama_team-a_my-app_") and len(key) > 60 and key not in out.getvalue()
    assert obj["metadata"] == {"name": "my-app", "namespace": "team-a"}
    assert obj["spec"]["keySHA256"] == hashlib.sha256(key.encode()).hexdigest()
    assert obj["spec"]["models"] == ["chat"] and obj["spec"]["requestsPerMinute"] == 60
    access = AccessControl(metrics=GatewayMetrics())
    access.apply_key("ADDED", {**obj, "metadata": {**obj["metadata"], "uid": "u"}})
    caller = access.authenticate({"authorization": f"Bearer {key}"})
    assert caller is not None and caller.key.key == "team-a/my-app"
    with pytest.raises(ValueError, match="not a valid Kubernetes name"):
        create_access_key(
            name="Bad",
            namespace="team-a",
            models=[],
            namespaces=[],
            requests_per_minute=None,
            tokens_per_minute=None,
            out=io.StringIO(),
            err=io.StringIO(),
        )
