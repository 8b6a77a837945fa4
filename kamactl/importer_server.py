"""`kama importer`: the importer pod's process, an HTTP server for Kama's worker.

The importer runs next to a tenant's volumes (the cache, a source claim, the token
Secret) and is as untrusted as the tenant: it holds no credential for Kama's Temporal
namespace. It runs the importer activities (the same functions the import and verify
workflows schedule) when the worker, which relays the operation's task queue to it,
asks (`kama.importer_protocol`): only calls with the pod's own token are served, one
at a time, with bounded inputs, and the answer streams the activity's heartbeats so
the worker can heartbeat to Temporal (progress and resume survive as before).

The server is the standard library's threading HTTP server: one blocking activity per
connection thread, nothing to maintain of our own beyond the handler."""

from __future__ import annotations

import hmac
import json
import logging
import queue
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

BUSY_WAIT_S = 60.0
"""How long a call waits for the one before it (a retry that overtook its own
abandoned attempt) before it is refused as busy (the worker retries)."""


class ClientGone(Exception):
    """The worker closed the call: the activity stops at its next heartbeat."""


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
class _Outcome:
    lines: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    gone: threading.Event = field(default_factory=threading.Event)


def _run_activity(call: ImporterCall, argument: Any, details: list[Any], out: _Outcome) -> None:
    """Run one activity with an activity context whose heartbeats become answer lines."""

    def heartbeat(*values: Any) -> None:
        if out.gone.is_set():
            raise ClientGone("the worker closed the call")
        out.lines.put({"heartbeat": list(values)})

    environment = ActivityEnvironment()
    environment.info = replace(environment.info, heartbeat_details=details)
    environment.on_heartbeat = heartbeat
    try:
        result = environment.run(call.function, argument)
    except ApplicationError as error:
        out.lines.put(
            {
                "error": {
                    "type": error.type or "ApplicationError",
                    "message": error.message,
                    "non_retryable": error.non_retryable,
                }
            }
        )
    except ClientGone:
        out.lines.put({"error": {"type": "ClientGone", "message": "", "non_retryable": False}})
    except Exception as error:  # any other failure is the worker's to retry
        log.exception("activity failed")
        out.lines.put(
            {
                "error": {
                    "type": type(error).__name__,
                    "message": str(error)[:2048],
                    "non_retryable": False,
                }
            }
        )
    else:
        out.lines.put({"result": result})


class ImporterServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], *, calls: Mapping[str, ImporterCall], token: str
    ) -> None:
        super().__init__(address, _Handler)
        self.calls = calls
        self.token = token
        self.one_at_a_time = threading.Lock()


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
        except Exception as error:
            self._plain(400, f"bad activity input: {str(error)[:512]}")
            return
        if not self.server.one_at_a_time.acquire(timeout=BUSY_WAIT_S):
            self._plain(503, "busy with another operation")
            return
        try:
            self._stream(call, argument, details)
        finally:
            self.server.one_at_a_time.release()

    def _stream(self, call: ImporterCall, argument: Any, details: list[Any]) -> None:
        out = _Outcome()
        worker = threading.Thread(
            target=_run_activity, args=(call, argument, details, out), daemon=True
        )
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        worker.start()
        while True:
            try:
                line = out.lines.get(timeout=ALIVE_EVERY_S)
            except queue.Empty:
                line = {"alive": True}
            try:
                self.wfile.write(json.dumps(line, cls=AdvancedJSONEncoder).encode() + b"\n")
                self.wfile.flush()
            except OSError:
                out.gone.set()  # the activity ends at its next heartbeat
                worker.join()
                return
            if "result" in line or "error" in line:
                return


def serve_importer(
    *, host: str, port: int, functions: list[Callable[..., Any]], token: str
) -> ImporterServer:
    """A started server (in a daemon thread); `shutdown()` stops it."""
    server = ImporterServer((host, port), calls=importer_calls(functions), token=token)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
