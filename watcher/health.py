"""The watcher's health endpoints: `/healthz` (liveness: every watch loop alive) and
`/readyz` (readiness: every collection listed and its watch connected), with the
per-collection detail as JSON. The watcher serves no other HTTP, so the standard
library's threading HTTP server is enough."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from informer.watch import WatchHealth


def serve_health(*, health: WatchHealth, host: str, port: int) -> ThreadingHTTPServer:
    """Start serving in a daemon thread; `shutdown()` the returned server to stop."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                ok = health.alive()
            elif self.path == "/readyz":
                ok = health.ready()
            else:
                self.send_error(404)
                return
            body = json.dumps({"ok": ok, "watches": health.report()}).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # probes every few seconds would drown the log

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
