"""A local Hugging Face Hub for tests and benchmarks: speaks the part of the Hub
HTTP API that `huggingface_hub` uses (repo info with siblings, sizes and LFS sha256,
revision resolution, `resolve/<revision>/<path>` with ETag, X-Repo-Commit,
Content-Length and Range) and injects failures (401, 404, 5xx, truncated bodies,
wrong bytes, slow transfers). It records every byte range it served, so tests can
prove a resumed import did not fetch data twice.

Named as a fixture: the public Hub cannot be reached from where Kama is tested.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

_CHUNK = 256 * 1024


@dataclass
class HubFile:
    path: str
    source: Path
    size: int
    sha256: str
    git_sha1: str


@dataclass
class HubRepo:
    repo_id: str
    commit: str
    refs: dict[str, str]
    files: dict[str, HubFile]
    token: str | None = None  # private repo: this bearer token is required


@dataclass
class Fault:
    """What to do to the next `times` downloads of one file."""

    status: int | None = None
    truncate_at: int | None = None
    corrupt: bool = False
    bytes_per_second: float | None = None
    times: int = 1


@dataclass(frozen=True)
class ServedRange:
    repo_id: str
    path: str
    start: int
    end: int  # exclusive: bytes actually written to the client


@dataclass
class HubLog:
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    ranges: list[ServedRange] = field(default_factory=list)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class HubFixture:
    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.faults: dict[tuple[str, str], list[Fault]] = {}
        self.log = HubLog()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    # content -------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, Path],
        *,
        branch: str = "main",
        token: str | None = None,
    ) -> str:
        """Publish files as one commit of `repo_id`; returns the 40-hex commit."""
        entries = {}
        for rel, source in sorted(files.items()):
            sha = sha256_file(source)
            size = source.stat().st_size
            git_sha1 = hashlib.sha1(f"blob {size}\0".encode() + sha.encode()).hexdigest()
            entries[rel] = HubFile(
                path=rel, source=source, size=size, sha256=sha, git_sha1=git_sha1
            )
        commit = hashlib.sha1(
            repo_id.encode() + b"".join(f"{e.path}:{e.sha256}".encode() for e in entries.values())
        ).hexdigest()
        with self._lock:
            existing = self.repos.get(repo_id)
            refs = dict(existing.refs) if existing else {}
            refs[branch] = commit
            self.repos[repo_id] = HubRepo(
                repo_id=repo_id, commit=commit, refs=refs, files=entries, token=token
            )
        return commit

    def inject(self, repo_id: str, path: str, fault: Fault) -> None:
        with self._lock:
            self.faults.setdefault((repo_id, path), []).append(fault)

    def served_ranges(self, repo_id: str, path: str) -> list[ServedRange]:
        with self._lock:
            return [r for r in self.log.ranges if r.repo_id == repo_id and r.path == path]

    def _take_fault(self, repo_id: str, path: str) -> Fault | None:
        with self._lock:
            queue = self.faults.get((repo_id, path))
            if not queue:
                return None
            fault = queue[0]
            fault.times -= 1
            if fault.times <= 0:
                queue.pop(0)
            return fault

    # server ---------------------------------------------------------------------

    def start(self, *, host: str = "127.0.0.1") -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                hub._handle(self, head=False)

            def do_HEAD(self) -> None:
                hub._handle(self, head=True)

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="hub-fixture", daemon=True).start()
        self.url = f"http://{host}:{self._server.server_address[1]}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _authorized(self, handler: BaseHTTPRequestHandler, repo: HubRepo) -> bool:
        if repo.token is None:
            return True
        return handler.headers.get("Authorization") == f"Bearer {repo.token}"

    def _error(
        self, handler: BaseHTTPRequestHandler, status: int, code: str, message: str, *, head: bool
    ) -> None:
        body = json.dumps({"error": message}).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("X-Error-Code", code)
        handler.send_header("X-Error-Message", message)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if not head:
            handler.wfile.write(body)

    def _resolve_rev(self, repo: HubRepo, revision: str) -> str | None:
        if revision in repo.refs:
            return repo.refs[revision]
        if re.fullmatch(r"[0-9a-f]{40}", revision) and revision == repo.commit:
            return revision
        return None

    def _handle(self, handler: BaseHTTPRequestHandler, *, head: bool) -> None:
        url = urlparse(handler.path)
        path = unquote(url.path)
        with self._lock:
            self.log.requests.append((handler.command, path, handler.headers.get("Range")))
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        repo_id = (info or resolve).group(1) if (info or resolve) else None  # type: ignore[union-attr]
        repo = self.repos.get(repo_id) if repo_id else None
        if repo is None or not self._authorized(handler, repo):
            # the Hub answers 401 for both a missing repo and a private one without access
            self._error(
                handler,
                401 if repo else 404,
                "RepoNotFound",
                f"Repository {repo_id} not found",
                head=head,
            )
            return
        if info:
            self._repo_info(handler, repo, info.group(2) or "main", head=head)
        elif resolve:
            self._file(handler, repo, resolve.group(2), resolve.group(3), head=head)

    def _repo_info(
        self, handler: BaseHTTPRequestHandler, repo: HubRepo, revision: str, *, head: bool
    ) -> None:
        commit = self._resolve_rev(repo, revision)
        if commit is None:
            self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {revision}", head=head)
            return
        body = json.dumps(
            {
                "_id": repo.repo_id,
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": commit,
                "private": repo.token is not None,
                "tags": ["gguf"],
                "siblings": [
                    {
                        "rfilename": f.path,
                        "size": f.size,
                        "blobId": f.git_sha1,
                        "lfs": {"sha256": f.sha256, "size": f.size, "pointerSize": 134},
                    }
                    for f in repo.files.values()
                ],
            }
        ).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if not head:
            handler.wfile.write(body)

    def _file(
        self, handler: BaseHTTPRequestHandler, repo: HubRepo, revision: str, rel: str, *, head: bool
    ) -> None:
        commit = self._resolve_rev(repo, revision)
        if commit is None:
            self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {revision}", head=head)
            return
        entry = repo.files.get(rel)
        if entry is None:
            self._error(
                handler, 404, "EntryNotFound", f"{rel} does not exist at {revision}", head=head
            )
            return
        fault = None if head else self._take_fault(repo.repo_id, rel)
        if fault is not None and fault.status is not None:
            self._error(
                handler, fault.status, "Injected", f"injected HTTP {fault.status}", head=head
            )
            return
        start, end = 0, entry.size
        range_header = handler.headers.get("Range")
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header or "")
        if match:
            start = int(match.group(1))
            end = int(match.group(2)) + 1 if match.group(2) else entry.size
            if start >= entry.size:
                handler.send_response(416)
                handler.send_header("Content-Range", f"bytes */{entry.size}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
        handler.send_response(206 if match else 200)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Accept-Ranges", "bytes")
        handler.send_header("ETag", f'"{entry.git_sha1}"')
        handler.send_header("X-Linked-Etag", f'"{entry.sha256}"')
        handler.send_header("X-Linked-Size", str(entry.size))
        handler.send_header("X-Repo-Commit", commit)
        handler.send_header("Content-Length", str(end - start))
        if match:
            handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{entry.size}")
        handler.end_headers()
        if head:
            return
        self._stream(handler, repo, entry, start, end, fault)

    def _stream(
        self,
        handler: BaseHTTPRequestHandler,
        repo: HubRepo,
        entry: HubFile,
        start: int,
        end: int,
        fault: Fault | None,
    ) -> None:
        sent = start
        stop_at = min(end, fault.truncate_at) if fault and fault.truncate_at is not None else end
        try:
            with entry.source.open("rb") as f:
                f.seek(start)
                while sent < stop_at:
                    block = f.read(min(_CHUNK, stop_at - sent))
                    if not block:
                        break
                    if fault and fault.corrupt:
                        block = bytes(b ^ 0xFF for b in block[:1]) + block[1:]
                    handler.wfile.write(block)
                    sent += len(block)
                    if fault and fault.bytes_per_second:
                        time.sleep(len(block) / fault.bytes_per_second)
            if sent < end:
                handler.close_connection = True  # truncated body: the client sees a short read
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
        finally:
            with self._lock:
                self.log.ranges.append(
                    ServedRange(repo_id=repo.repo_id, path=entry.path, start=start, end=sent)
                )
