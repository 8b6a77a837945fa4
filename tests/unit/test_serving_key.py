"""llama-server started with an API key that only Kama's worker and gateway hold
(issue 25, item 3; `kama/serving_key.py`): the key of a deployment is derived from
the master key, its namespace and uid; the worker puts it into the pod it creates
without changing the pod's fingerprint, and sends it on its `/slots` reads; the
supervisor hands it to llama-server and sends it on its own calls; the gateway sends
each replica's key on every request and load poll, and never the client's own
credentials. Against local stand-ins recording headers, and against the pinned
llama-server itself (it starts in well under a second on a generated GGUF)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s

from activities.llama_server import LlamaServerActivities, SlotsRequest
from activities.serving_pods import CreatePod, ServingPodActivities, keyed_manifest
from gateway.app import GatewayHolder, build_apps
from gateway.backend_load import poll_one
from gateway.transport.serve import Listen, serve
from kama.config import Settings
from kama.contracts import ObjectRef
from kama.serving_key import LLAMA_API_KEY_ENV, bearer, pod_serving_key, serving_key
from kama.serving_plan import LLAMA_PORT, ServingPlan
from kama.serving_pod import FINGERPRINT_LABEL, ServingTemplate
from kamadev.binaries import ensure_binaries
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.processes import free_port
from runtime.supervisor import Supervisor
from tests.unit.gateway_support import fixed_state

pytestmark = pytest.mark.timeout(30)

MASTER = "master-key-of-this-test"
# loopback addresses of their own: llama-server's port (LLAMA_PORT) is fixed
WORKER_POD_IP = "127.0.78.1"
SUPERVISED_IP = "127.0.78.2"
REAL_SERVER_IP = "127.0.78.3"
MODEL = "ns/chat"
KEY = serving_key(master=MASTER, namespace="ns", deployment_uid="u1")
PLAN = ServingPlan(entrypoint="m.gguf", manifest_digest="ab" * 32, ctx_total=512, concurrency=1)
TEMPLATE = ServingTemplate(
    image="kama:dev",
    plan=PLAN,
    claim_name="kama-cache-models",
    sub_path="blobs/sha256/abc",
    cpu_request="500m",
    memory_request="1073741824",
)


# the key -------------------------------------------------------------------------


def test_a_deployments_key_is_stable_and_its_own() -> None:
    key = serving_key(master=MASTER, namespace="ns", deployment_uid="u1")
    assert key == KEY and len(key) == 64 and int(key, 16) >= 0
    others = {
        serving_key(master=MASTER, namespace="other", deployment_uid="u1"),
        serving_key(master=MASTER, namespace="ns", deployment_uid="u2"),
        serving_key(master="another master", namespace="ns", deployment_uid="u1"),
    }
    assert len(others) == 3 and key not in others
    assert MASTER not in key


def test_a_pods_key_comes_from_its_namespace_and_controlling_deployment() -> None:
    def pod(namespace: str, *owners: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"namespace": namespace, "ownerReferences": list(owners)}}

    controller = {"kind": "ModelDeployment", "uid": "u1", "controller": True}
    assert pod_serving_key(master=MASTER, pod=pod("ns", controller)) == KEY
    # a pod in another namespace that names the same uid gets that namespace's key
    assert pod_serving_key(master=MASTER, pod=pod("evil", controller)) != KEY
    assert pod_serving_key(master=MASTER, pod=pod("ns")) is None
    assert (
        pod_serving_key(master=MASTER, pod=pod("ns", {**controller, "controller": False})) is None
    )
    assert pod_serving_key(master=MASTER, pod=pod("ns", {**controller, "kind": "Job"})) is None


def test_the_master_key_is_read_from_the_env_and_never_shown() -> None:
    settings = Settings.from_env({"KAMA_SERVING_KEY": f" {MASTER}\n"})
    assert settings.serving_key == MASTER
    assert MASTER not in repr(settings)
    assert Settings.from_env({}).serving_key is None
    assert Settings.from_env({"KAMA_SERVING_KEY": ""}).serving_key is None


# the worker: the pod it creates, its /slots reads ---------------------------------


def runtime_env(manifest: dict[str, Any]) -> dict[str, Any]:
    (container,) = manifest["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_created_pod_requires_its_deployments_key_and_keeps_its_fingerprint() -> None:
    request = CreatePod(
        ref=ObjectRef(namespace="ns", name="chat", uid="u1"), template=TEMPLATE, ordinal=0
    )
    plain = request.manifest()
    keyed = keyed_manifest(request, master_key=MASTER)
    assert runtime_env(keyed)[LLAMA_API_KEY_ENV] == KEY
    assert LLAMA_API_KEY_ENV not in runtime_env(plain)
    assert request.manifest() == plain, "the template's manifest is not changed in place"
    assert keyed["metadata"] == plain["metadata"]
    assert keyed["metadata"]["labels"][FINGERPRINT_LABEL] == TEMPLATE.fingerprint()
    assert KEY not in json.dumps(keyed["metadata"]), "the key is in the env only"
    without_env = json.loads(json.dumps(keyed))
    without_env["spec"]["containers"][0]["env"].pop()
    assert without_env == plain, "the key is the only difference"
    assert keyed_manifest(request, master_key=None) == plain, "no master key: no key"


class FakeCustom:
    """The ModelDeployment and its artifact, as the API server returns them."""

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any]:
        if plural == "modeldeployments":
            return {"metadata": {"uid": "u1"}, "spec": {"modelRef": {"name": "m"}}}
        location = {"claimName": TEMPLATE.claim_name, "subPath": TEMPLATE.sub_path}
        return {"status": {"servingLocation": location}}


@dataclass
class FakeCore:
    """Pods by name (reads) and what was created."""

    pods: dict[str, k8s.V1Pod] = field(default_factory=dict)
    created: list[dict[str, Any]] = field(default_factory=list)

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> None:
        self.created.append(body)

    def read_namespaced_pod(self, name: str, namespace: str) -> k8s.V1Pod:
        return self.pods[name]


@pytest.mark.parametrize("master", [MASTER, None])
def test_the_create_pod_activity_gives_the_pod_its_key(master: str | None) -> None:
    activities = ServingPodActivities(
        api=k8s.ApiClient(), runtime_images=frozenset({"kama:dev"}), serving_key=master
    )
    core = FakeCore()
    activities.custom, activities.core = FakeCustom(), core
    ref = ObjectRef(namespace="ns", name="chat", uid="u1")
    activities.create_pod(CreatePod(ref=ref, template=TEMPLATE, ordinal=0))
    (pod,) = core.created
    assert runtime_env(pod).get(LLAMA_API_KEY_ENV) == (KEY if master else None)


@dataclass
class FakeLlamaServer:
    """Answers like llama-server started with `key` (None: without one): 401 on every
    route but /health unless the request carries `Authorization: Bearer <key>`. It
    records each request's path, Authorization and X-Api-Key headers."""

    key: str | None
    seen: list[tuple[str, str | None, str | None]] = field(default_factory=list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the gateway's pool expects

            def log_message(self, format: str, *args: Any) -> None:
                return

            def answer(self) -> None:
                authorization = self.headers.get("Authorization")
                fake.seen.append((self.path, authorization, self.headers.get("X-Api-Key")))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                status, body, kind = 200, b"", "application/json"
                if (
                    self.path != "/health"
                    and fake.key is not None
                    and authorization != bearer(fake.key)
                ):
                    status, body = 401, b'{"error":{"message":"Invalid API Key","code":401}}'
                elif self.path == "/slots":
                    body = b'[{"id":0,"is_processing":true}]'
                elif self.path == "/props":
                    body = b'{"total_slots":1,"model_path":"/models/m.gguf"}'
                elif self.path == "/metrics":
                    body, kind = b"llamacpp:requests_processing 3\n", "text/plain"
                elif self.path == "/health":
                    body = b'{"status":"ok"}'
                else:
                    body = b'{"choices":[{"text":"ok"}]}'
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

        return Handler

    def authorizations(self) -> set[str | None]:
        return {authorization for _, authorization, _ in self.seen}


@contextmanager
def fake_llama_server(host: str, port: int, *, key: str | None) -> Iterator[FakeLlamaServer]:
    fake = FakeLlamaServer(key=key)
    server = ThreadingHTTPServer((host, port), fake.handler())
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def kama_serving_pod() -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(
            name="chat-abc-0",
            namespace="ns",
            labels={"app.kubernetes.io/managed-by": "kama", "kama.dev/role": "server"},
            owner_references=[
                k8s.V1OwnerReference(
                    api_version="kama.dev/v1alpha1",
                    kind="ModelDeployment",
                    name="chat",
                    uid="u1",
                    controller=True,
                )
            ],
        ),
        status=k8s.V1PodStatus(pod_ip=WORKER_POD_IP),
    )


async def test_the_workers_slots_read_sends_the_pods_key() -> None:
    request = SlotsRequest(namespace="ns", pod="chat-abc-0")
    core = FakeCore(pods={"chat-abc-0": kama_serving_pod()})
    with fake_llama_server(WORKER_POD_IP, LLAMA_PORT, key=KEY) as server:
        async with httpx.AsyncClient(timeout=3.0) as http:
            keyed = LlamaServerActivities(http=http, api=k8s.ApiClient(), serving_key=MASTER)
            keyed.core = core
            assert await keyed.busy_slots(request) == 1
            assert server.seen == [("/slots", bearer(KEY), None)]
            keyless = LlamaServerActivities(http=http, api=k8s.ApiClient())
            keyless.core = core
            assert await keyless.busy_slots(request) is None, "401: no answer to count"
            assert server.seen[-1] == ("/slots", None, None)
            url = f"http://{WORKER_POD_IP}:{LLAMA_PORT}/slots"
            assert await keyless.count_busy(url, key=KEY) == 1


# the supervisor -----------------------------------------------------------------------


def test_the_supervisor_sends_the_key_on_its_own_calls(tmp_path: Path) -> None:
    with fake_llama_server(SUPERVISED_IP, LLAMA_PORT, key=KEY) as server:
        keyed = Supervisor(
            plan=PLAN, host=SUPERVISED_IP, llama_server="true", models_dir=tmp_path, api_key=KEY
        )
        keyed.child = subprocess.Popen(["sleep", "30"])  # llama-server's process, running
        try:
            assert keyed.ready() == (True, "ready")
            assert keyed.busy_slots() == 1
            assert {path for path, _, _ in server.seen} == {"/health", "/props", "/slots"}
            assert server.authorizations() == {bearer(KEY)}
            keyless = Supervisor(
                plan=PLAN, host=SUPERVISED_IP, llama_server="true", models_dir=tmp_path
            )
            keyless.child = keyed.child
            assert keyless.ready() == (False, "llama-server /props answered 401")
        finally:
            keyed.child.kill()
            keyed.child.wait()


def test_the_pinned_llama_server_requires_the_key_from_its_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real llama-server, started by the supervisor with LLAMA_API_KEY in its
    environment (as the pod's env sets it): /slots, /props and /metrics are 401
    without the key and answer with it; /health stays public; the supervisor, which
    sends it, sees the replica ready."""
    server_binary = ensure_binaries().llama_server
    write_model(tmp_path / PLAN.entrypoint, shape=ModelShape())
    monkeypatch.setenv(LLAMA_API_KEY_ENV, KEY)
    supervisor = Supervisor(
        plan=PLAN,
        host=REAL_SERVER_IP,
        llama_server=str(server_binary),
        models_dir=tmp_path,
        api_key=KEY,
    )
    supervisor.start_child()
    assert supervisor.child is not None
    base = f"http://{REAL_SERVER_IP}:{LLAMA_PORT}"
    try:
        deadline = time.monotonic() + 20
        while not (ready := supervisor.ready())[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready == (True, "ready")
        with httpx.Client(timeout=5) as http:
            assert http.get(f"{base}/health").status_code == 200
            for path in ("/slots", "/props", "/metrics"):
                assert http.get(f"{base}{path}").status_code == 401, path
                wrong = {"Authorization": bearer(KEY + "x")}
                assert http.get(f"{base}{path}", headers=wrong).status_code == 401, path
                right = {"Authorization": bearer(KEY)}
                assert http.get(f"{base}{path}", headers=right).status_code == 200, path
        assert supervisor.busy_slots() == 0
    finally:
        supervisor.child.terminate()
        supervisor.child.wait(timeout=10)


# the gateway --------------------------------------------------------------------------


@asynccontextmanager
async def gateway(*, replica_port: int, master: str | None) -> AsyncIterator[tuple[str, Any]]:
    """The gateway's public port in front of one replica at 127.0.0.1:`replica_port`,
    authentication off (the client's headers are still what it sends)."""
    holder = GatewayHolder()
    holder.current = fixed_state(
        model=MODEL, replica_ips=["127.0.0.1"], replica_port=replica_port, serving_key=master
    )
    public, ops = build_apps(holder)
    port, stop = free_port(), asyncio.Event()

    @asynccontextmanager
    async def no_lifespan() -> AsyncIterator[None]:
        yield

    task = asyncio.create_task(
        serve(
            public=public,
            ops=ops,
            lifespan=no_lifespan,
            listen=Listen("127.0.0.1", port),
            ops_listen=Listen("127.0.0.1", free_port()),
            stop=stop,
            grace_s=1.0,
        )
    )
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as http:
        for _ in range(200):
            try:
                await http.get(f"{url}/v1/models")
                break
            except httpx.HTTPError:
                await asyncio.sleep(0.025)
    try:
        yield url, holder.state
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


CLIENT_SECRET = "kama_the-clients-own-key"
CLIENT_HEADERS = {
    "Authorization": f"Bearer {CLIENT_SECRET}",
    "X-Api-Key": CLIENT_SECRET,
    "Content-Type": "application/json",
}


@pytest.mark.parametrize("master", [MASTER, None])
async def test_the_gateway_sends_the_replicas_key_and_never_the_clients(
    master: str | None,
) -> None:
    replica_port = free_port()
    expected = bearer(KEY) if master else None
    with fake_llama_server("127.0.0.1", replica_port, key=KEY if master else None) as server:
        async with gateway(replica_port=replica_port, master=master) as (url, state):
            async with httpx.AsyncClient(timeout=10) as http:
                for route in ("/v1/completions", "/v1/chat/completions", "/completion"):
                    body = {"model": MODEL, "prompt": "hi", "messages": []}
                    headers = {**CLIENT_HEADERS, "X-Kama-Model": MODEL}
                    answer = await http.post(f"{url}{route}", json=body, headers=headers)
                    assert answer.status_code == 200, answer.text
            endpoint = state.registry.models[MODEL].endpoints["chat-0"]
            async with httpx.AsyncClient(transport=state.proxy.upstream) as upstream:
                await poll_one(upstream, endpoint, port=replica_port)
            assert endpoint.others == 3, "the load poll was answered"
    assert [path for path, _, _ in server.seen] == [
        "/v1/completions",
        "/v1/chat/completions",
        "/completion",
        "/metrics",
    ]
    assert server.authorizations() == {expected}
    assert all(api_key is None for _, _, api_key in server.seen), "x-api-key never forwarded"
