"""`kama runtime`: the serving container's process (the pod's pause process is PID 1,
`shareProcessNamespace`, so a SIGTERM before the handlers below are set still ends it).

Before anything runs it checks the mounted artifact against the serving plan's
manifest digest (the artifact status's `manifestDigest`):

- a blob published in a cache: `READY` present, its `manifest.json` with the plan's
  digest and entrypoint, every file present with its size. Bytes are not re-hashed:
  the import verified them and the blob is Kama's, written once.
- a Direct artifact (`KAMA_ARTIFACT_LAYOUT=in-place`): files on someone else's claim,
  with no manifest and no READY (Kama never writes there), that anyone with the
  claim may have changed since the import verified them. Nothing there is trusted:
  every file is read and hashed again, the manifest the import built is rebuilt from
  the names, sizes and sha256s found (the entrypoint and its shards, or every GGUF
  file of the directory), and its digest must be the plan's. Only regular files inside
  `/models` count (a symlink that leaves it is refused). This costs one read of the
  model before llama-server starts (which then maps pages the read left in the page
  cache). A file changed while llama-server runs is not noticed here; the `verify`
  signal re-hashes on demand, and Copy mode is the one that keeps its own bytes.

Its readiness endpoint listens first, before the check: a probe that arrives while
the artifact is checked or llama-server loads waits for it (up to LOADING_WAIT_S,
under the kubelet's probe timeout) instead of meeting a closed port, so a new replica
is Ready at the probe that sees it load, not a probe period later. Then it renders
llama-server's flags from the plan only, starts llama-server once, and the endpoint
is ready only while llama-server's `/health` is 200 and `/props` reports the expected
model and slot count. On SIGTERM it stops being ready, waits until no slot has been
processing for DRAIN_QUIET_S (up to the plan's drain timeout), then stops llama-server
and exits with its code.

llama-server reads its API key from `LLAMA_API_KEY`, which the worker puts into the
pod's env when Kama has a master serving key (`kama.serving_key`); llama-server
inherits the supervisor's environment, and the supervisor sends the same key on
its own calls (`/props` and `/slots` need it; `/health` is public in llama-server).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, Protocol

from kama.cache_layout import MANIFEST_NAME, READY_NAME, Manifest, ManifestFile
from kama.offload_check import check_offload
from kama.serving_key import LLAMA_API_KEY_ENV, bearer
from kama.serving_plan import (
    ARTIFACT_LAYOUT_ENV,
    IN_PLACE_LAYOUT,
    LLAMA_PORT,
    MODELS_DIR,
    ServingPlan,
)
from kama.serving_pod import SERVING_PLAN_ENV
from runtime.clock import MONOTONIC, Clock
from runtime.probe_socket import listen_for_probes, pod_ip

log = logging.getLogger("kama.runtime")

LLAMA_SERVER_ENV = "KAMA_LLAMA_SERVER"
PROBE_TIMEOUT_S = 2.0
# while llama-server is still loading, a readiness probe waits this long for it (under
# the kubelet's default 1 s probe timeout) instead of failing at once: the replica is
# Ready at the probe that sees it load, not one probe period (1 s) later
LOADING_WAIT_S = 0.7
LOADING_POLL_S = 0.05
DRAIN_POLL_S = 0.5
# a drain ends once no slot has been busy for this long: a request the gateway routed
# before it saw the pod go (it learns of the deletion when the kubelet does) reaches
# llama-server after the drain's first reading, and one idle reading would cut it off
DRAIN_QUIET_S = 1.0
STOP_GRACE_S = 10.0
# llama-server's stderr lines kept for the offload check (its load log is ~200 lines
# at -lv 4, a dozen at the default)
LOAD_LOG_LINES = 4000
TERMINATION_LOG = Path("/dev/termination-log")  # the pod's terminationMessagePath
OFFLOAD_FAILED_EXIT = 3
METRICS_MAX_BYTES = 1 << 20  # llama-server's /metrics is a few KiB
# the probe port is reachable by other pods: a connection that sends no request in this
# long is dropped, and no more than this many are handled at once (past it, closed)
PROBE_HANDLER_TIMEOUT_S = 5.0
PROBE_HANDLER_THREADS = 16


@dataclass(frozen=True)
class SlotsReading:
    """What the drain reads of llama-server's `/slots`."""

    busy: int  # slots processing a request
    decoded: int  # tokens those slots' requests have generated so far


def _decoded(slot: dict[str, Any]) -> int:
    """A busy slot's generated tokens (`next_token[0].n_decoded`), 0 if not said."""
    next_token = slot.get("next_token")
    if isinstance(next_token, list) and next_token and isinstance(next_token[0], dict):
        decoded = next_token[0].get("n_decoded")
        if isinstance(decoded, int):
            return decoded
    return 0


class ArtifactNotServable(Exception):
    """The mounted directory is not the published artifact the plan names."""


class ArtifactIdentity(Protocol):
    """What names an artifact a pod serves: the model's plan, or a companion's."""

    @property
    def entrypoint(self) -> str: ...
    @property
    def manifest_digest(self) -> str: ...


def check_artifact(*, directory: Path, plan: ArtifactIdentity, in_place: bool = False) -> Manifest:
    """The manifest of the artifact mounted at `directory` if it is the one `plan`
    names (module docstring: what is checked for each layout); ArtifactNotServable
    says why not."""
    if in_place:
        return check_in_place(directory=directory, plan=plan)
    if not (directory / READY_NAME).is_file():
        raise ArtifactNotServable(f"{directory} has no {READY_NAME}: not a published artifact")
    try:
        manifest = Manifest.parse((directory / MANIFEST_NAME).read_bytes())
    except (OSError, ValueError) as exc:
        raise ArtifactNotServable(f"{directory}/{MANIFEST_NAME}: {exc}") from exc
    if manifest.digest != plan.manifest_digest:
        raise ArtifactNotServable(
            f"manifest digest {manifest.digest} != expected {plan.manifest_digest}"
        )
    if manifest.entrypoint != plan.entrypoint:
        raise ArtifactNotServable(f"entrypoint {manifest.entrypoint} != expected {plan.entrypoint}")
    for f in manifest.files:
        path = directory / f.path
        if not path.is_file() or path.stat().st_size != f.size:
            raise ArtifactNotServable(f"{f.path} is missing or has the wrong size")
    return manifest


def _artifact_file(directory: Path, name: str) -> Path:
    """`directory/name` if it is a regular file inside `directory` (after symlinks)."""
    path = directory / name
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise ArtifactNotServable(f"{name} is missing: {exc}") from exc
    if not real.is_relative_to(directory.resolve()):
        raise ArtifactNotServable(f"{name} resolves outside {directory} ({real})")
    if not real.is_file():
        raise ArtifactNotServable(f"{name} is not a regular file")
    return real


def _file_sets(directory: Path, entrypoint: str) -> list[list[str]]:
    """The file sets a Direct import can have made for `entrypoint`: the file alone or
    its shard set (a file source), and every GGUF file of the directory (a
    directory source)."""
    # only Direct pods pay for the import
    from kama.gguf.shards import parse_shard_name, shard_file_names

    shard = parse_shard_name(entrypoint)
    if shard is None:
        own = [entrypoint]
    else:
        stem, _, count = shard
        own = shard_file_names(stem, count)
    everything = sorted(p.name for p in directory.iterdir() if p.name.endswith(".gguf"))
    return [own] if everything == own else [own, everything]


def check_in_place(*, directory: Path, plan: ArtifactIdentity) -> Manifest:
    """A Direct artifact: its files hashed again and their manifest's digest compared
    with the plan's (module docstring)."""
    if "/" in plan.entrypoint:
        raise ArtifactNotServable(
            f"entrypoint {plan.entrypoint!r} is not a file name in {directory}: the plan "
            "was made from an artifact status that names files from the claim's root"
        )
    hashed: dict[str, ManifestFile] = {}
    built: list[str] = []
    for names in _file_sets(directory, plan.entrypoint):
        entries = []
        for name in names:
            if name not in hashed:
                path = _artifact_file(directory, name)
                with path.open("rb") as f:
                    sha256 = hashlib.file_digest(f, "sha256").hexdigest()
                hashed[name] = ManifestFile(path=name, size=path.stat().st_size, sha256=sha256)
            entries.append(hashed[name])
        manifest = Manifest.build(files=entries, entrypoint=plan.entrypoint)
        if manifest.digest == plan.manifest_digest:
            log.info("verified %d file(s) in place (%d bytes)", len(entries), manifest.total_size)
            return manifest
        built.append(f"{', '.join(names)}: {manifest.digest}")
    raise ArtifactNotServable(
        f"the files in {directory} are not the artifact verified at import (manifest digest "
        f"{plan.manifest_digest}; found {'; '.join(built)}): the claim changed since"
    )


class Supervisor:
    def __init__(
        self,
        *,
        plan: ServingPlan,
        host: str,
        llama_server: str,
        models_dir: Path,
        api_key: str | None = None,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.plan = plan
        self.clock = clock
        # llama-server's key (it reads the same LLAMA_API_KEY from the env it inherits)
        self.headers = {} if api_key is None else {"Authorization": bearer(api_key)}
        self.host = host
        self.llama_server = llama_server
        self.models_dir = models_dir
        self.draining = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.was_ready = False  # llama-server has loaded (probes no longer wait)
        self.started_at: float | None = None  # self.clock.now() at llama-server's start
        self.load_log: deque[str] = deque(maxlen=LOAD_LOG_LINES)

    def _get(self, path: str) -> tuple[int, Any]:
        """GET one of llama-server's own routes (stdlib http.client: importing httpx
        would add a third of a second to every replica's start)."""
        connection = http.client.HTTPConnection(self.host, LLAMA_PORT, timeout=PROBE_TIMEOUT_S)
        try:
            connection.request("GET", path, headers=self.headers)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        return response.status, json.loads(body) if response.status == 200 else None

    def start_child(self) -> None:
        args = self.plan.llama_server_args(
            model_dir=str(self.models_dir), host=self.host, port=LLAMA_PORT
        )
        log.info("starting llama-server %s", " ".join(args))
        self.started_at = self.clock.now()
        if not self.plan.n_gpu_layers:
            self.child = subprocess.Popen([self.llama_server, *args])
            return
        # a GPU plan: llama-server's stderr passes through the supervisor, which reads
        # what it says of the GPU (`offload_failure`)
        self.child = subprocess.Popen([self.llama_server, *args], stderr=subprocess.PIPE)
        assert self.child.stderr is not None
        threading.Thread(
            target=self._relay_stderr, args=(self.child.stderr,), name="stderr", daemon=True
        ).start()

    def _relay_stderr(self, stream: IO[bytes]) -> None:
        for raw in stream:
            sys.stderr.buffer.write(raw)
            sys.stderr.buffer.flush()
            self.load_log.append(raw.decode(errors="replace").rstrip("\n"))

    def offload_failure(self) -> str | None:
        """Why llama-server does not run the plan's GPU layers on a GPU, or None. A
        llama-server without a usable GPU (a CPU build, a CUDA build that found no
        device or no driver) says so at any verbosity and computes on the CPU; with a
        GPU, `--fit off` makes one that cannot place its layers fail to load instead.
        The count line (`offloaded N/M layers`, only at -lv 4) is checked when present."""
        if not self.plan.n_gpu_layers:
            return None
        check = check_offload(list(self.load_log), n_gpu_layers=self.plan.n_gpu_layers)
        return None if check.ok or not check.known else check.reason

    def ready(self) -> tuple[bool, str]:
        if self.draining.is_set():
            return False, "draining"
        if self.child is None:
            return False, "checking the artifact"
        if self.child.poll() is not None:
            return False, "llama-server is not running"
        if failure := self.offload_failure():
            return False, failure
        try:
            if self._get("/health")[0] != 200:
                return False, "llama-server /health is not ok yet"
            status, props = self._get("/props")
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return False, f"llama-server unreachable: {type(exc).__name__}"
        if status != 200 or not isinstance(props, dict):
            return False, f"llama-server /props answered {status}"
        if props.get("total_slots") != self.plan.concurrency:
            return (
                False,
                f"llama-server has {props.get('total_slots')} slots, expected {self.plan.concurrency}",
            )
        if not str(props.get("model_path", "")).endswith("/" + self.plan.entrypoint):
            return (
                False,
                f"llama-server serves {props.get('model_path')}, expected {self.plan.entrypoint}",
            )
        return True, "ready"

    def llama_metrics(self) -> tuple[int, bytes]:
        """llama-server's Prometheus text, read with the deployment's key, for a
        scraper on the supervisor's port (which the chart's NetworkPolicy opens to
        metricsFrom): the key guards prompts and slots, while these counters say only
        how busy the replica is. At most METRICS_MAX_BYTES, in PROBE_TIMEOUT_S."""
        connection = http.client.HTTPConnection(self.host, LLAMA_PORT, timeout=PROBE_TIMEOUT_S)
        try:
            connection.request("GET", "/metrics", headers=self.headers)
            response = connection.getresponse()
            body = response.read(METRICS_MAX_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            return 503, f"llama-server unreachable: {type(exc).__name__}\n".encode()
        finally:
            connection.close()
        if len(body) > METRICS_MAX_BYTES:
            return 502, b"llama-server's metrics exceed the relay's limit\n"
        return (
            (200, body)
            if response.status == 200
            else (502, b"llama-server answered %d\n" % response.status)
        )

    def alive(self) -> bool:
        """Live while the artifact is checked (a Direct artifact is hashed again, which
        can outlast the liveness probe's failures) and while llama-server runs."""
        return self.child is None or self.child.poll() is None

    def ready_when_loaded(self, *, wait_s: float = LOADING_WAIT_S) -> tuple[bool, str]:
        """`ready()`, waiting up to `wait_s` for llama-server to finish loading the
        first time (afterwards, and while draining, it answers at once)."""
        deadline = self.clock.now() + wait_s
        while True:
            ok, why = self.ready()
            if ok and not self.was_ready and self.started_at is not None:
                # the load time, for whoever reads the pod's log about a slow cold start
                log.info(
                    "llama-server ready %.2f s after its start", self.clock.now() - self.started_at
                )
            if ok:
                self.was_ready = True
            if ok or self.was_ready or not self.alive() or self.draining.is_set():
                return ok, why
            if self.clock.now() + LOADING_POLL_S > deadline:
                return ok, why
            self.clock.sleep(LOADING_POLL_S)

    def busy_slots(self) -> int | None:
        """Slots processing a request, as llama-server's `/slots` says; None when it
        does not answer (in time, with 200 and a list): not known to be idle."""
        reading = self.read_slots()
        return None if reading is None else reading.busy

    def read_slots(self) -> SlotsReading | None:
        """`/slots` as the drain reads it, or None when it does not answer."""
        try:
            status, slots = self._get("/slots")
        except (OSError, http.client.HTTPException, ValueError):
            return None
        if status != 200 or not isinstance(slots, list):
            return None
        busy = [s for s in slots if isinstance(s, dict) and s.get("is_processing")]
        return SlotsReading(busy=len(busy), decoded=sum(_decoded(slot) for slot in busy))

    def drain_and_stop(self) -> int:
        """Stop llama-server once no slot has been processing for DRAIN_QUIET_S, or at
        the plan's drain timeout; a `/slots` that does not answer (llama-server busy
        generating on a loaded node) is waited for, not taken for idle. Every reading and why the
        drain ended go to the pod's log, which is what tells a cut request's cause."""
        self.draining.set()
        started = self.clock.now()
        deadline = started + self.plan.drain_timeout_s
        log.info("draining: waiting up to %.0f s for busy slots", self.plan.drain_timeout_s)
        idle_since: float | None = None
        while self.child is not None and self.child.poll() is None:
            slots = self.read_slots()
            now = self.clock.now()
            if slots is not None and slots.busy == 0:
                idle_since = now if idle_since is None else idle_since
                if now - idle_since >= DRAIN_QUIET_S:
                    log.info("drained: no slot processing %.1f s after SIGTERM", now - started)
                    break
            else:
                idle_since = None
            reading = (
                "/slots did not answer"
                if slots is None
                else f"{slots.busy} slot(s) processing, {slots.decoded} tokens generated"
            )
            if now >= deadline:
                log.warning(
                    "drain timeout (%.0f s) reached, %s: stopping llama-server",
                    self.plan.drain_timeout_s,
                    reading,
                )
                break
            log.info("draining: %s (%.1f s)", reading, now - started)
            self.clock.sleep(DRAIN_POLL_S)
        if self.child is None:
            return 0
        if self.child.poll() is None:
            self.child.terminate()
            try:
                self.child.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("llama-server outlived SIGTERM by %.0f s: killed", STOP_GRACE_S)
                self.child.kill()
        else:
            log.warning("llama-server exited during the drain (%s)", self.child.returncode)
        return self.child.wait()

    def serve_probes(self, listener: socket.socket) -> ThreadingHTTPServer:
        """Answer the probes (and the metrics relay) on `listener`, a listening socket
        (`runtime.probe_socket`), in a thread; connections it already holds included."""
        supervisor = self

        class Handler(BaseHTTPRequestHandler):
            timeout = PROBE_HANDLER_TIMEOUT_S

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._relay_metrics()
                    return
                if self.path == "/readyz":
                    ok, why = supervisor.ready_when_loaded()
                elif self.path == "/livez":
                    ok = supervisor.alive()
                    why = "alive" if ok else "llama-server exited"
                else:
                    ok, why = False, "not found"
                body = json.dumps({"ok": ok, "reason": why}).encode()
                self.send_response(200 if ok else (404 if why == "not found" else 503))
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _relay_metrics(self) -> None:
                status, body = supervisor.llama_metrics()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = CappedHTTPServer(listener.getsockname()[:2], Handler, bind_and_activate=False)
        server.socket.close()
        server.socket, server.server_address = listener, listener.getsockname()[:2]
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
        return server


class CappedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most PROBE_HANDLER_THREADS at once: a connection
    past the cap is closed unanswered (the kubelet's next probe comes a period later)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handlers = threading.BoundedSemaphore(PROBE_HANDLER_THREADS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.handlers.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.handlers.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.handlers.release()


def _stop_for(supervisor: Supervisor, *, server: ThreadingHTTPServer, failure: str) -> int:
    """A replica that would hold a GPU while computing on the CPU stops, saying why in
    its termination message (the rollout reports it in the deployment's status)."""
    print(f"kama runtime: stopping: {failure}", file=sys.stderr, flush=True)
    try:
        TERMINATION_LOG.write_text(failure[:4096])
    except OSError:
        log.warning("cannot write %s", TERMINATION_LOG)
    if supervisor.child is not None:
        supervisor.child.terminate()
        try:
            supervisor.child.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            supervisor.child.kill()
    server.shutdown()
    return OFFLOAD_FAILED_EXIT


def run_runtime(*, listener: socket.socket | None = None) -> int:
    """The serving pod's process, answering probes on `listener` (bound here if not
    given: `kama runtime` binds it before importing this module)."""
    listener = listener or listen_for_probes(host=pod_ip())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    plan = ServingPlan.from_json(os.environ[SERVING_PLAN_ENV])
    host = pod_ip()
    models = Path(os.environ.get("KAMA_MODELS_DIR", MODELS_DIR))
    in_place = os.environ.get(ARTIFACT_LAYOUT_ENV) == IN_PLACE_LAYOUT
    supervisor = Supervisor(
        plan=plan,
        host=host,
        llama_server=os.environ.get(LLAMA_SERVER_ENV, "llama-server"),
        models_dir=models,
        api_key=os.environ.get(LLAMA_API_KEY_ENV) or None,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = supervisor.serve_probes(listener)  # first: probes wait for the start
    try:
        check_artifact(directory=models, plan=plan, in_place=in_place)
        for extra in (plan.draft, *plan.adapter_artifacts):
            if extra is not None:
                check_artifact(directory=Path(extra.mount), plan=extra, in_place=extra.in_place)
    except ArtifactNotServable as exc:
        server.shutdown()
        print(f"kama runtime: refusing to start: {exc}", file=sys.stderr, flush=True)
        return 2
    if stop.is_set():  # SIGTERM during the check: nothing to drain
        server.shutdown()
        return 0
    supervisor.start_child()
    while not stop.wait(0.5):
        if failure := supervisor.offload_failure():
            return _stop_for(supervisor, server=server, failure=failure)
        if supervisor.child is not None and supervisor.child.poll() is not None:
            code = supervisor.child.returncode
            log.error("llama-server exited with %s", code)
            server.shutdown()
            return code if code > 0 else 1
    log.info("SIGTERM: draining")
    code = supervisor.drain_and_stop()
    server.shutdown()
    return 0 if code in (0, -signal.SIGTERM) else code
