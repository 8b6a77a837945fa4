"""The importer pod as an external system: the worker runs an import operation's
activities by relaying them to the pod it created for that operation.

Importer pods hold no Temporal credential (`kama.importer_protocol`). The import and
verify workflows still schedule their volume-side activities on the operation's task
queue; the worker polls that queue with one dynamic activity bound to the operation's
pod (its IP and token read from the pod, which the worker checked is its own), sends
each task's input there and relays the answer: the importer's heartbeats become this
activity's heartbeats (so progress and resume work as they did), its typed errors
become the same typed errors, and its result is checked against the activity's
declared result type before a workflow sees it. Every answer is bounded in bytes per
line and in time between lines."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, get_type_hints

import httpx
from temporalio import activity
from temporalio.common import RawValue
from temporalio.converter import AdvancedJSONEncoder, value_to_type
from temporalio.exceptions import ApplicationError

from kama.importer_protocol import (
    IDLE_LIMIT_S,
    MAX_LINE_BYTES,
    MAX_REQUEST_BYTES,
    TOKEN_HEADER,
    bearer,
    call_path,
)
from kama.reasons import Failure

CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ImporterPodAddress:
    """Where one operation's importer listens, and the token it answers to."""

    namespace: str
    name: str
    url: str  # http://<pod IP>:<port>
    token: str


def result_types(functions: Sequence[Callable[..., Any]]) -> dict[str, Any]:
    """The declared result type of each importer activity, by activity name."""
    types: dict[str, Any] = {}
    for function in functions:
        definition = activity._Definition.must_from_callable(function)
        types[str(definition.name)] = get_type_hints(function).get("return", type(None))
    return types


def _unavailable(message: str) -> ApplicationError:
    return ApplicationError(message, type=Failure.IMPORTER_UNAVAILABLE)


async def bounded_lines(response: httpx.Response, *, limit: int) -> AsyncIterator[bytes]:
    """The answer's lines; ApplicationError when one is longer than `limit` bytes."""
    buffer = b""
    async for chunk in response.aiter_raw():
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line
        if len(buffer) > limit:
            raise ApplicationError(
                f"the importer sent a line longer than {limit} bytes",
                type=Failure.IMPORTER_ANSWER_INVALID,
                non_retryable=True,
            )
    if buffer.strip():
        yield buffer


class ImporterRelay:
    """The activities of one operation's task queue, run by its importer pod."""

    def __init__(
        self,
        *,
        http: httpx.AsyncClient,
        pod: ImporterPodAddress,
        results: dict[str, Any],
        idle_limit_s: float = IDLE_LIMIT_S,
    ) -> None:
        self.http = http
        self.pod = pod
        self.results = results
        self.idle_limit_s = idle_limit_s

    @activity.defn(dynamic=True)
    async def relay(self, args: Sequence[RawValue]) -> Any:
        info = activity.info()
        name = info.activity_type
        if name not in self.results or len(args) != 1:
            raise ApplicationError(
                f"{name!r} is not an importer activity",
                type=Failure.FORGED_REQUEST,
                non_retryable=True,
            )
        argument = activity.payload_converter().from_payload(args[0].payload)
        body = json.dumps(
            {"input": argument, "heartbeat_details": list(info.heartbeat_details)},
            cls=AdvancedJSONEncoder,
        ).encode()
        if len(body) > MAX_REQUEST_BYTES:
            raise ApplicationError(
                f"the input of {name} is over {MAX_REQUEST_BYTES} bytes",
                type=Failure.FORGED_REQUEST,
                non_retryable=True,
            )
        last_details: list[Any] = list(info.heartbeat_details)
        timeout = httpx.Timeout(self.idle_limit_s, connect=CONNECT_TIMEOUT_S)
        where = f"importer pod {self.pod.namespace}/{self.pod.name}"
        try:
            async with self.http.stream(
                "POST",
                self.pod.url + call_path(name),
                content=body,
                headers={TOKEN_HEADER: bearer(self.pod.token), "content-type": "application/json"},
                timeout=timeout,
            ) as response:
                if response.status_code != 200:
                    raise _unavailable(f"{where} answered {response.status_code} to {name}")
                async for line in bounded_lines(response, limit=MAX_LINE_BYTES):
                    if not line.strip():
                        continue
                    message = _message(line, where=where)
                    if "heartbeat" in message:
                        last_details = list(message["heartbeat"])
                        activity.heartbeat(*last_details)
                    elif "alive" in message:
                        activity.heartbeat(*last_details)
                    elif "error" in message:
                        raise _importer_error(message["error"], where=where)
                    elif "result" in message:
                        return self._checked(name, message["result"], where=where)
        except httpx.HTTPError as error:
            raise _unavailable(f"{where}: {type(error).__name__}: {error}") from None
        raise _unavailable(f"{where} ended its answer to {name} without a result")

    def _checked(self, name: str, result: Any, *, where: str) -> Any:
        """The result as the activity's declared type: an answer of another shape is
        refused, never handed to a workflow."""
        try:
            return value_to_type(self.results[name], result)
        except Exception as error:
            raise ApplicationError(
                f"{where} answered {name} with a result of the wrong shape: {error}",
                type=Failure.IMPORTER_ANSWER_INVALID,
                non_retryable=True,
            ) from None


def _message(line: bytes, *, where: str) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        raise ApplicationError(
            f"{where} sent a line that is not a JSON object",
            type=Failure.IMPORTER_ANSWER_INVALID,
            non_retryable=True,
        )
    return message


def _importer_error(error: Any, *, where: str) -> ApplicationError:
    """The importer's typed failure, as the activity's own."""
    if not isinstance(error, dict):
        return _unavailable(f"{where} failed")
    kind = str(error.get("type") or Failure.IMPORTER_UNAVAILABLE)[:128]
    message = str(error.get("message") or "")[:4096]
    return ApplicationError(message, type=kind, non_retryable=bool(error.get("non_retryable")))
