"""The narrow channel between Kama's worker and an importer pod (#25): the importer
holds no Temporal credential; it answers only the worker's token, only importer
activities, with bounded inputs; the worker relays its heartbeats and typed errors,
refuses answers of the wrong shape, too long or too slow, and binds a relay only to a
pod in exactly the shape it creates itself."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from kubernetes import client as k8s
from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.import_payloads import HubSource, ResolvedSource, SpaceRequest
from activities.importer_relay import ImporterPodAddress, ImporterRelay, result_types
from kama.contracts import ObjectRef, importer_task_queue
from kama.importer_pod import (
    ImporterMounts,
    ImporterTemplate,
    importer_pod_manifest,
    importer_pod_name,
)
from kama.importer_protocol import (
    MAX_REQUEST_BYTES,
    TOKEN_ENV,
    TOKEN_HEADER,
    bearer,
    call_path,
    importer_token,
)
from kama.tenancy import TenancyPolicy
from kamactl import importer_relays
from kamactl.importer_relays import binding_of
from kamactl.importer_server import ImporterServer, serve_importer
from kamactl.worker import importer_activities
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.hub import HubFixture

TOKEN = "the-pods-own-token"
RESOLVE = "Resolve Hugging Face source"
SPACE = "Check free space in cache"


@pytest.fixture
def hub() -> Iterator[HubFixture]:
    fixture = HubFixture()
    fixture.start()
    yield fixture
    fixture.stop()


@pytest.fixture
def importer(hub: HubFixture) -> Iterator[tuple[ImporterServer, list[Any]]]:
    with httpx.Client(timeout=10) as http:
        functions = importer_activities(http=http, hf_endpoint=hub.url)
        server = serve_importer(host="127.0.0.1", port=0, functions=functions, token=TOKEN)
        try:
            yield server, functions
        finally:
            server.shutdown()


@asynccontextmanager
async def relay_to(
    url: str, *, functions: list[Any], token: str = TOKEN, idle_limit_s: float = 30.0
) -> AsyncIterator[ImporterRelay]:
    async with httpx.AsyncClient() as http:
        pod = ImporterPodAddress(namespace="team-a", name="llama-import-x", url=url, token=token)
        yield ImporterRelay(
            http=http, pod=pod, results=result_types(functions), idle_limit_s=idle_limit_s
        )


async def relayed(
    relay: ImporterRelay, activity_type: str, argument: Any, *, beats: list[Any] | None = None
) -> Any:
    """Run the relay as a Temporal worker runs it for a task of `activity_type`."""
    environment = ActivityEnvironment()
    environment.info = replace(environment.info, activity_type=activity_type)
    environment.on_heartbeat = lambda *details: (beats if beats is not None else []).append(details)
    payload = environment.payload_converter.to_payloads([argument])[0]
    return await environment.run(relay.relay, [RawValue(payload)])


def url_of(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


async def test_a_relayed_call_returns_the_importers_result_as_its_declared_type(
    importer: tuple[ImporterServer, list[Any]], hub: HubFixture, tmp_path: Path
) -> None:
    server, functions = importer
    model = write_model(tmp_path / "tiny.gguf", shape=ModelShape(n_layer=1))
    hub.add_repo("acme/tiny", {"tiny.gguf": model})
    async with relay_to(url_of(server), functions=functions) as relay:
        resolved = await relayed(
            relay,
            RESOLVE,
            HubSource(repo="acme/tiny", revision="main", files=["tiny.gguf"]),
        )
    assert isinstance(resolved, ResolvedSource)
    assert [f.path for f in resolved.files] == ["tiny.gguf"]
    assert resolved.files[0].size == model.stat().st_size


async def test_the_importers_typed_failures_reach_the_workflow_typed(
    importer: tuple[ImporterServer, list[Any]],
) -> None:
    server, functions = importer
    async with relay_to(url_of(server), functions=functions) as relay:
        with pytest.raises(ApplicationError) as raised:
            await relayed(relay, RESOLVE, HubSource(repo="acme/none", revision="main", files=[]))
    assert raised.value.type == "SourceUnavailable" and raised.value.non_retryable


async def test_the_importer_answers_nothing_without_its_token(
    importer: tuple[ImporterServer, list[Any]], tmp_path: Path
) -> None:
    server, functions = importer
    async with relay_to(url_of(server), functions=functions, token="guessed") as relay:
        with pytest.raises(ApplicationError) as raised:
            await relayed(relay, SPACE, SpaceRequest(cache_root=str(tmp_path), needed_bytes=1))
    assert raised.value.type == "ImporterUnavailable" and "401" in raised.value.message
    with httpx.Client(base_url=url_of(server)) as plain:
        assert plain.post(call_path(SPACE), json={"input": {}}).status_code == 401


async def test_only_importer_activities_are_relayed_and_inputs_are_bounded(
    importer: tuple[ImporterServer, list[Any]],
) -> None:
    server, functions = importer
    async with relay_to(url_of(server), functions=functions) as relay:
        with pytest.raises(ApplicationError) as raised:
            await relayed(relay, "Create serving pod", {"manifest": {}})
    assert raised.value.type == "ForgedRequest" and raised.value.non_retryable
    headers = {TOKEN_HEADER: bearer(TOKEN)}
    with httpx.Client(base_url=url_of(server), headers=headers) as worker:
        assert worker.post(call_path("Create serving pod"), json={"input": {}}).status_code == 404
        too_big = b"{" + b" " * MAX_REQUEST_BYTES + b"}"
        assert worker.post(call_path(SPACE), content=too_big).status_code == 413
        assert worker.post(call_path(SPACE), content=b"not json").status_code == 400


@contextmanager
def fake_importer(write: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """An importer that answers every call with `write` (a hostile or broken pod)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(200)
            self.send_header("connection", "close")
            self.end_headers()
            with suppress(OSError):
                write(self)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield url_of(server)
    finally:
        server.shutdown()


def lines(*written: bytes) -> Callable[[BaseHTTPRequestHandler], None]:
    def write(handler: BaseHTTPRequestHandler) -> None:
        for line in written:
            handler.wfile.write(line)
            handler.wfile.flush()

    return write


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (lines(b'{"result": {"files": "all of them"}}\n'), "ImporterAnswerInvalid"),
        (lines(b"[1, 2]\n"), "ImporterAnswerInvalid"),
        (lines(b'{"heartbeat": [1]}\n', b"x" * (5 << 20)), "ImporterAnswerInvalid"),
        (lines(b'{"heartbeat": [1]}\n'), "ImporterUnavailable"),  # ends without a result
    ],
    ids=["wrong-shape", "not-an-object", "endless-line", "no-result"],
)
async def test_a_hostile_importers_answer_is_refused(
    answer: Callable[[BaseHTTPRequestHandler], None], kind: str
) -> None:
    with httpx.Client() as http:
        functions = importer_activities(http=http, hf_endpoint="")
    with fake_importer(answer) as url:
        async with relay_to(url, functions=functions) as relay:
            with pytest.raises(ApplicationError) as raised:
                await relayed(relay, RESOLVE, HubSource(repo="acme/x", revision="main", files=[]))
    assert raised.value.type == kind, raised.value


async def test_an_importer_that_goes_quiet_is_given_up_on() -> None:
    """Given up on at the idle limit while the importer still holds the answer open,
    not when the importer ends it (which ends in ImporterUnavailable as well)."""
    released, ended = threading.Event(), threading.Event()

    def drip(handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b'{"heartbeat": [5]}\n')
        handler.wfile.flush()
        released.wait(timeout=30)  # silent until the test lets it end its answer
        ended.set()

    with httpx.Client() as http:
        functions = importer_activities(http=http, hf_endpoint="")
    beats: list[Any] = []
    with fake_importer(drip) as url:
        try:
            async with relay_to(url, functions=functions, idle_limit_s=0.5) as relay:
                with pytest.raises(ApplicationError) as raised:
                    await relayed(
                        relay,
                        RESOLVE,
                        HubSource(repo="acme/x", revision="main", files=[]),
                        beats=beats,
                    )
            still_silent = not ended.is_set()
        finally:
            released.set()
    assert raised.value.type == "ImporterUnavailable" and not raised.value.non_retryable
    assert still_silent, "the relay waited for the importer to end its answer"
    assert "ReadTimeout" in raised.value.message, raised.value.message
    assert beats == [(5,)], "the heartbeat before the silence was relayed"


def worker_made_pod(**changes: Any) -> dict[str, Any]:
    """An importer pod as the worker creates it, once the kubelet gave it an IP."""
    owner = ObjectRef(namespace="team-a", name="llama", uid="0f3c2a1b-aaaa", cluster="c1")
    pod = importer_pod_manifest(
        template=ImporterTemplate(image="kama:dev", hf_endpoint="http://hub"),
        name=importer_pod_name("llama", "0f3c2a1b-g1-a1"),
        owner=owner,
        operation_id="0f3c2a1b-g1-a1",
        token=TOKEN,
        mounts=ImporterMounts(cache_claim="cache"),
    )
    pod["metadata"]["uid"] = "pod-uid-1"
    pod["status"] = {"podIP": "10.1.2.3"}
    for path, value in changes.items():
        *parents, last = path.split(".")
        target: Any = pod
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    return pod


def test_a_relay_is_bound_only_to_a_pod_in_the_workers_own_shape() -> None:
    found = binding_of(worker_made_pod(), cluster="c1")
    assert found is not None
    binding, artifact = found
    assert artifact == ObjectRef(
        namespace="team-a", name="llama", uid="0f3c2a1b-aaaa", cluster="c1"
    )
    assert binding.queue == importer_task_queue(artifact, operation="0f3c2a1b-g1-a1")
    assert binding.address.url == "http://10.1.2.3:8090" and binding.address.token == TOKEN
    refused: dict[str, dict[str, Any]] = {
        "another owner kind": {"metadata.ownerReferences.0.kind": "ModelDeployment"},
        "an operation of another artifact": {
            "metadata.labels": {
                "kama.dev/artifact": "llama",
                "kama.dev/operation": "99999999-g1-a1",
            }
        },
        "another name": {"metadata.name": "something-else"},
        "no token": {"spec.containers.0.env": []},
        "no IP yet": {"status": {}},
        "being deleted": {"metadata.deletionTimestamp": "2026-12-03T00:00:00Z"},
    }
    for why, changes in refused.items():
        assert binding_of(worker_made_pod(**changes), cluster="c1") is None, why


MASTER = "the-workers-master-key"


def derived_pod(
    namespace: str = "team-a", uid: str = "0f3c2a1b-aaaa", n: int = 1
) -> dict[str, Any]:
    """An importer pod the worker made with the master key (its token derived)."""
    operation = f"{uid[:8]}-g{n}-a1"
    name = importer_pod_name("llama", operation)
    token = importer_token(
        master=MASTER, namespace=namespace, artifact_uid=uid, operation=operation, pod=name
    )
    pod = worker_made_pod(**{
        "metadata.namespace": namespace,
        "metadata.name": name,
        "metadata.uid": f"pod-{namespace}-{n}",
        "metadata.creationTimestamp": f"2026-12-06T00:{n // 60:02d}:{n % 60:02d}Z",
        "metadata.ownerReferences.0.uid": uid,
        "spec.containers.0.env": [{"name": TOKEN_ENV, "value": token}],
    })  # fmt: skip
    pod["metadata"]["labels"]["kama.dev/operation"] = operation
    return pod


def test_a_pod_in_the_importers_shape_needs_the_token_the_worker_derives() -> None:
    """20 busybox pods in the importer's shape once got 20 relays (20 Temporal
    workers). With the master key a pod is bound only if its token is the one the
    worker derives for that namespace, artifact, operation and pod."""
    made = derived_pod()
    assert binding_of(made, cluster="c1", master_key=MASTER) is not None
    forged = worker_made_pod()  # the right shape, a token of the tenant's choosing
    assert binding_of(forged, cluster="c1", master_key=MASTER) is None
    # a real pod's token, copied into a pod for another operation, fits nothing
    other = derived_pod(n=2)
    other["spec"]["containers"][0]["env"] = made["spec"]["containers"][0]["env"]
    assert binding_of(other, cluster="c1", master_key=MASTER) is None
    assert binding_of(made, cluster="c1", master_key="another-master") is None


async def test_relays_are_capped_per_namespace_and_in_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importer_relays, "MAX_RELAYS_PER_NAMESPACE", 3)
    monkeypatch.setattr(importer_relays, "MAX_RELAYS", 5)
    relays = importer_relays.ImporterRelays(
        client=cast(Any, None),
        api=k8s.ApiClient(),
        tenancy=TenancyPolicy(),
        cluster="c1",
        importer_functions=[],
        master_key=MASTER,
    )
    monkeypatch.setattr(relays, "_owned", lambda ref: True)
    flood = [derived_pod("hostile", "11111111-bbbb", n) for n in range(1, 11)]
    honest = [derived_pod("team-a", "0f3c2a1b-aaaa", n) for n in range(20, 22)]
    late = [derived_pod("team-c", "22222222-cccc", n) for n in range(30, 33)]
    wanted = await relays.wanted([*flood, *honest, *late])
    bound = {ns: sum(b.address.namespace == ns for b in wanted.values()) for ns in NAMESPACES}
    # the hostile flood gets its namespace's three; the oldest of the rest fill the total
    assert bound == {"hostile": 3, "team-a": 2, "team-c": 0}, bound
    assert {b.address.name for b in wanted.values() if b.address.namespace == "hostile"} == {
        p["metadata"]["name"] for p in flood[:3]
    }, "the oldest pods of a namespace keep their relays"
    await relays.http.aclose()


NAMESPACES = ("hostile", "team-a", "team-c")


STARTED: list[int] = []


@activity.defn(name="Count slowly")
def count_slowly(request: SpaceRequest) -> int:
    """A stand-in for a long download: heartbeats its progress, takes ~1.5 s."""
    STARTED.append(request.needed_bytes)
    for done in range(1, 7):
        time.sleep(0.25)
        activity.heartbeat(done)
    return request.needed_bytes


async def test_an_operation_outlives_the_worker_that_asked_and_is_not_run_twice() -> None:
    """The worker dies mid-download: the importer goes on, and the restarted worker's
    call with the same input is attached to the same run (no second writer of the
    staged file), receiving its heartbeats and its result."""
    STARTED.clear()
    server = serve_importer(host="127.0.0.1", port=0, functions=[count_slowly], token=TOKEN)
    try:
        request = SpaceRequest(cache_root="/nowhere", needed_bytes=7)
        async with relay_to(url_of(server), functions=[count_slowly]) as relay:
            first_beats: list[Any] = []
            first = asyncio.create_task(relayed(relay, "Count slowly", request, beats=first_beats))
            # Mid-run, measured rather than timed: on a busy machine the run can start
            # late, so a fixed sleep may cancel before its second heartbeat.
            async with asyncio.timeout(10):
                while not first_beats or first_beats[-1][0] < 2:
                    await asyncio.sleep(0.02)
            first.cancel()  # the worker is gone: its connection closes
            with suppress(asyncio.CancelledError):
                await first
            beats: list[Any] = []
            assert await relayed(relay, "Count slowly", request, beats=beats) == 7
        assert STARTED == [7], "one run, attached to by the second call"
        assert beats and beats[0][0] >= 2, "attached mid-run, not started again"
        async with relay_to(url_of(server), functions=[count_slowly]) as relay:
            assert await relayed(relay, "Count slowly", request) == 7
        assert STARTED == [7, 7], "once delivered, the same call runs anew"
    finally:
        server.shutdown()
