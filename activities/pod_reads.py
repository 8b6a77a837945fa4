"""Reads of a pod's small operational answers, bounded whatever the pod does: the
worker's `/slots` probe (`activities.llama_server`) and the gateway's (llama-server's
`/metrics` for backend load, `/health` of a replica that refused a connection, a
supervisor's `/readyz` while a model wakes). One implementation for both processes.

A pod is not trusted to answer sanely: the read has a total deadline, from the
request to the answer's last byte (not a timeout per read, so a pod that answers a
byte every second cannot stretch it and freeze the poller that waits on it), and a
byte cap. Past either it fails with `PodReadTimeout` or `PodAnswerTooLarge`, httpx
errors, so callers that treat any httpx error as "no answer" keep doing so. The
response head is bounded the same way by the upstream transport itself."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

POD_READ_MAX_BYTES = 1024 * 1024  # llama-server's /metrics is a few KiB
IDENTITY = {"accept-encoding": "identity"}  # the cap counts the bytes as they are read


class PodReadTimeout(httpx.ReadTimeout):
    """The answer did not arrive whole within the total deadline."""


class PodAnswerTooLarge(httpx.RemoteProtocolError):
    """The answer was larger than the byte cap."""


@dataclass(frozen=True)
class PodAnswer:
    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


async def read_pod(
    http: httpx.AsyncClient,
    url: str,
    *,
    deadline_s: float,
    max_bytes: int = POD_READ_MAX_BYTES,
    authorization: str | None = None,
) -> PodAnswer:
    """GET `url` (with `authorization` as its Authorization header, if any), its whole
    answer within `deadline_s` and `max_bytes`; PodReadTimeout or PodAnswerTooLarge
    past them (the connection is then closed), httpx's errors if it fails otherwise."""
    headers = IDENTITY if authorization is None else {**IDENTITY, "authorization": authorization}
    try:
        async with (
            asyncio.timeout(deadline_s),
            http.stream("GET", url, headers=headers, timeout=deadline_s) as response,
        ):
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise PodAnswerTooLarge(f"{url} declared {declared} bytes (at most {max_bytes})")
            body = bytearray()
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) > max_bytes:
                    raise PodAnswerTooLarge(f"{url} sent over {max_bytes} bytes")
            return PodAnswer(status=response.status_code, body=bytes(body))
    except TimeoutError:
        raise PodReadTimeout(f"{url} did not answer whole within {deadline_s:g}s") from None
