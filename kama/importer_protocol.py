"""How Kama's worker and an importer pod talk: the one narrow channel between them.

An importer pod runs in a tenant's namespace, so it is untrusted and holds no
credential for Kama's Temporal namespace. It serves the importer's operations (the
activities that must run next to the volume: resolve, stage, download, hash,
publish) over HTTP on its pod IP; the worker, which created the pod, relays each
activity task of the operation's task queue to it and relays the answer back. What
both sides share is here: the port, the paths, the header with the per-pod token,
the size limits, and the shape of the streamed answer (one JSON object per line:
`{"heartbeat": [...]}` while it works, `{"alive": true}` when it has nothing to say,
then `{"result": ...}` or `{"error": {"type", "message", "non_retryable"}}`).

Pure: no I/O."""

from __future__ import annotations

import hashlib
import hmac
from typing import Final
from urllib.parse import quote, unquote

IMPORTER_PORT: Final = 8090
TOKEN_ENV: Final = "KAMA_IMPORTER_TOKEN"
"""The pod's token, in its spec (set by the worker when it creates the pod; the
worker reads it back from the pod it verified as its own). With the master key
(`KAMA_SERVING_KEY`) it is `importer_token`, which only the worker can compute: a pod
a tenant made in the importer's shape carries no token the worker would derive for
it, so it gets no relay."""
TOKEN_HEADER: Final = "authorization"
CALL_PREFIX: Final = "/v1/activities/"
HEALTH_PATH: Final = "/healthz"
MAX_REQUEST_BYTES: Final = 1 << 20
"""An activity input: a file list of at most 128 entries and a few names."""
MAX_LINE_BYTES: Final = 4 << 20
"""One answer line: a result with up to 128 files and the GGUF facts."""
ALIVE_EVERY_S: Final = 5.0
"""The importer writes a line at least this often while an operation runs."""
IDLE_LIMIT_S: Final = 30.0
"""The worker gives up on an answer that writes nothing for this long."""


def call_path(activity: str) -> str:
    return CALL_PREFIX + quote(activity, safe="")


def activity_of(path: str) -> str | None:
    """The activity a call path names; None for any other path."""
    if not path.startswith(CALL_PREFIX):
        return None
    return unquote(path.removeprefix(CALL_PREFIX)) or None


def bearer(token: str) -> str:
    return f"Bearer {token}"


def importer_token(
    *, master: str, namespace: str, artifact_uid: str, operation: str, pod: str
) -> str:
    """The token of the importer pod `pod` of `operation` of the ModelArtifact
    `artifact_uid` in `namespace`: HMAC-SHA256 of the master key over all four (64 hex
    digits), so a token read from one pod fits no other pod, operation or artifact."""
    message = f"importer/{namespace}/{artifact_uid}/{operation}/{pod}".encode()
    return hmac.new(master.encode(), message, hashlib.sha256).hexdigest()


def is_importer_token(
    token: str, *, master: str, namespace: str, artifact_uid: str, operation: str, pod: str
) -> bool:
    expected = importer_token(
        master=master, namespace=namespace, artifact_uid=artifact_uid, operation=operation, pod=pod
    )
    return hmac.compare_digest(token.encode(), expected.encode())
