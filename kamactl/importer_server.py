"""`kama importer`: the importer pod's process, an HTTP server for Kama's worker.

The importer runs next to a tenant's volumes (the cache, a source claim, the token
Secret) and is as untrusted as the tenant: it holds no credential for Kama's Temporal
namespace. It runs the importer activities (the same functions the import and verify
workflows schedule) when the worker, which relays the operation's task queue to it,
asks (`kama.importer_protocol`): only calls with the pod's own token are served, with
bounded inputs, and the answer streams the activity's heartbeats so the worker can
heartbeat to Temporal (progress and resume survive as before). An activity outlives
the call that started it: while Kama's worker restarts, a download goes on, and the
worker's next call with the same input is attached to it (never a second copy).

The server is the standard library's threading HTTP server: one blocking activity per
connection thread, nothing to maintain of our own beyond the handler."""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, get_type_hints

from temporalio import activity
from temporalio.converter import AdvancedJSONEncoder, value_to_type
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from kama.importer_protocol import (
    ALIVE_EVERY_S,
    HEALTH_PATH,
    MAX_REQUEST_BYTES,
    TOKEN_HEADER,
    activity_of,
    bearer,
)

log = logging.getLogger("kama.importer")


@dataclass(frozen=True)
class ImporterCall:
    """One activity as the server runs it: the function and its input's type."""

    function: Callable[[Any], Any]
    input_type: type


def importer_calls(functions: list[Callable[..., Any]]) -> dict[str, ImporterCall]:
    """The importer activities by their activity names (as the workflows call them)."""
    calls: dict[str, ImporterCall] = {}
    for function in functions:
        definition = activity._Definition.must_from_callable(function)
        hints = get_type_hints(function)
        [input_type] = [hint for name, hint in hints.items() if name != "return"]
        calls[str(definition.name)] = ImporterCall(function=function, input_type=input_type)
    return calls


@dataclass
class _Run:
    """One activity running in the importer, outliving the call that started it: a
    worker that restarts (or a relay that times out) calls again with the same input
    and is attached to this run instead of starting a second copy (which would write
    the same staged file twice). Keeps only the latest heartbeat and the end."""

    changed: threading.Condition = field(default_factory=threading.Condition)
    heartbeat: list[Any] | None = None
    beats: int = 0
    end: dict[str, Any] | None = None  # {"result": ...} or {"error": ...}
    delivered: bool = False  # the end reached a caller: a new call starts a new run

    def beat(self, *values: Any) -> None:
        with self.changed:
            self.heartbeat, self.beats = list(values), self.beats + 1
            self.changed.notify_all()

    def finish(self, end: dict[str, Any]) -> None:
        with self.changed:
            self.end = end
            self.changed.notify_all()


def _failure(error: BaseException) -> dict[str, Any]:
    if isinstance(error, ApplicationError):
        kind, message, final = error.type or "ApplicationError", error.message, error.non_retryable
    else:  # any other failure is the worker's to retry
        kind, message, final = type(error).__name__, str(error)[:2048], False
    return {"error": {"type": kind, "message": message, "non_retryable": final}}


def _run_activity(call: ImporterCall, argument: Any, details: list[Any], run: _Run) -> None:
    """Run one activity with an activity context whose heartbeats go to `run`."""
    environment = ActivityEnvironment()
    environment.info = replace(environment.info, heartbeat_details=details)
    environment.on_heartbeat = run.beat
    try:
        result = environment.run(call.function, argument)
    except Exception as error:
        if not isinstance(error, ApplicationError):
            log.exception("activity failed")
        run.finish(_failure(error))
    else:
        run.finish({"result": result})


class ImporterServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], *, calls: Mapping[str, ImporterCall], token: str
    ) -> None:
        super().__init__(address, _Handler)
        self.calls = calls
        self.token = token
        self.guard = threading.Lock()
        self.runs: dict[str, _Run] = {}

    def attach(self, *, key: str, call: ImporterCall, argument: Any, details: list[Any]) -> _Run:
        """The run of this call: the one already under way (or ended but never
        delivered) for the same activity and input, else a new one."""
        with self.guard:
            for other in [k for k, r in self.runs.items() if r.delivered]:
                del self.runs[other]
            run = self.runs.get(key)
            if run is None:
                run = self.runs[key] = _Run()
                threading.Thread(
                    target=_run_activity, args=(call, argument, details, run), daemon=True
                ).start()
            return run


class _Handler(BaseHTTPRequestHandler):
    server: ImporterServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def _plain(self, status: int, message: str) -> None:
        body = json.dumps({"error": {"message": message}}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def do_GET(self) -> None:
        if self.path == HEALTH_PATH:
            self._plain(200, "ok")
        else:
            self._plain(404, "not found")

    def do_POST(self) -> None:
        presented = self.headers.get(TOKEN_HEADER, "")
        if not hmac.compare_digest(presented.encode(), bearer(self.server.token).encode()):
            self._plain(401, "this importer answers only the worker that created it")
            return
        name = activity_of(self.path)
        call = self.server.calls.get(name or "")
        if call is None:
            self._plain(404, f"no importer activity {name!r}")
            return
        try:
            length = int(self.headers.get("content-length", ""))
        except ValueError:
            self._plain(411, "a content-length is required")
            return
        if not 0 < length <= MAX_REQUEST_BYTES:
            self._plain(413, f"an activity input is at most {MAX_REQUEST_BYTES} bytes")
            return
        try:
            body = json.loads(self.rfile.read(length))
            argument = value_to_type(call.input_type, body["input"])
            details = list(body.get("heartbeat_details") or [])
            key = f"{name}\n{json.dumps(body['input'], sort_keys=True)}"
        except Exception as error:
            self._plain(400, f"bad activity input: {str(error)[:512]}")
            return
        run = self.server.attach(key=key, call=call, argument=argument, details=details)
        self._stream(run)

    def _write(self, line: dict[str, Any]) -> bool:
        try:
            self.wfile.write(json.dumps(line, cls=AdvancedJSONEncoder).encode() + b"\n")
            self.wfile.flush()
        except OSError:
            return False  # the caller left; the run goes on for the next one
        return True

    def _stream(self, run: _Run) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        seen = 0
        while True:
            with run.changed:
                if run.end is None and run.beats == seen:
                    run.changed.wait(timeout=ALIVE_EVERY_S)
                end, beats, heartbeat = run.end, run.beats, run.heartbeat
            if end is not None:
                if self._write(end):
                    with self.server.guard:
                        run.delivered = True
                return
            if beats != seen:
                seen = beats
                line: dict[str, Any] = {"heartbeat": heartbeat}
            else:
                line = {"alive": True}
            if not self._write(line):
                return


def serve_importer(
    *, host: str, port: int, functions: list[Callable[..., Any]], token: str
) -> ImporterServer:
    """A started server (in a daemon thread); `shutdown()` stops it."""
    server = ImporterServer((host, port), calls=importer_calls(functions), token=token)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
