"""Kubernetes API errors as one typed hierarchy, made in one place.

The `kubernetes` client raises one `ApiException` for every HTTP status, and an
activity that compares `exc.status` by hand also has to decide, each time, whether a
retry can help. Here (after nolar/kopf's `clients/errors.py`) a failed call becomes a
`KubeError` subclass chosen by its status, with a message that names the verb, the
resource and the object, followed by the API server's own words. Activities branch on
types (`except NotFound`), and Temporal sees a typed `ApplicationError`:

- retried (the cluster may change): `NotFound` 404, `Conflict` 409,
  `TooManyRequests` 429 (after the server's Retry-After), `ServerError` 5xx;
- never retried (`non_retryable=True`: the same request gets the same answer until a
  person changes something): `Forbidden` 403, `Invalid` 422 and any other 4xx
  (`ClientError`), e.g. "forbidden: cannot create pods in namespace ml
  (pods/chat-0): pods is forbidden: User ... cannot create resource "pods" ...".

Connection errors (urllib3) are not API answers and pass through unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar, Final

from kubernetes.client import ApiException
from temporalio.exceptions import ApplicationError

API_MESSAGE_LIMIT = 1024  # characters of the API server's message kept in ours


@dataclass(frozen=True, kw_only=True)
class KubeTarget:
    """What a call acts on: the resource as RBAC names it (`pods`,
    `modelartifacts/status`), and the namespace and name when there are any."""

    resource: str
    namespace: str | None = None
    name: str | None = None

    def __str__(self) -> str:
        where = f" in namespace {self.namespace}" if self.namespace else ""
        which = f" ({self.resource.split('/')[0]}/{self.name})" if self.name else ""
        return f"{self.resource}{where}{which}"


class KubeError(ApplicationError):
    """An answer of the API server other than success; `status` is its HTTP status."""

    retryable: ClassVar[bool] = True
    label: ClassVar[str] = "API error ({status})"

    def __init__(
        self,
        *,
        status: int,
        verb: str,
        target: KubeTarget,
        api_message: str,
        retry_after: timedelta | None = None,
    ) -> None:
        self.status = status
        self.verb = verb
        self.target = target
        self.api_message = api_message
        super().__init__(
            f"{self.label.format(status=status)}: cannot {verb} {target}: {api_message}",
            type=type(self).__name__,
            non_retryable=not self.retryable,
            next_retry_delay=retry_after,
        )


class ClientError(KubeError):
    """A 4xx the request itself is to blame for: sending it again does not help."""

    retryable = False
    label = "rejected ({status})"


class Forbidden(ClientError):
    """403: the credentials lack a permission (RBAC): a person has to grant it."""

    label = "forbidden"


class Invalid(ClientError):
    """422: the object or patch does not validate (or a JSON patch `test` failed)."""

    label = "invalid"


class NotFound(ClientError):
    """404: the object (or its kind) does not exist. Retried, as the cluster may yet
    create it; deletes and reads that expect it take it as an answer."""

    retryable = True
    label = "not found"


class Conflict(ClientError):
    """409: it exists already (create) or changed meanwhile (update)."""

    retryable = True
    label = "conflict"


class TooManyRequests(ClientError):
    """429: the API server sheds load; retried after its Retry-After."""

    retryable = True
    label = "too many requests"


class ServerError(KubeError):
    """5xx: the API server (or etcd, or a webhook) failed; retried."""

    label = "server error ({status})"


BY_STATUS: Final[Mapping[int, type[KubeError]]] = {
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Invalid,
    429: TooManyRequests,
}
PERMANENT_ERRORS: Final = (ClientError, Forbidden, Invalid)
PERMANENT_ERROR_TYPES: Final = tuple(cls.__name__ for cls in PERMANENT_ERRORS)
"""The `ApplicationError.type`s that no retry can fix (for retry policies)."""


def _error_class(status: int) -> type[KubeError]:
    if status in BY_STATUS:
        return BY_STATUS[status]
    if 400 <= status < 500:
        return ClientError
    if 500 <= status < 600:
        return ServerError
    return KubeError


def _api_message(exc: ApiException) -> str:
    """The `message` of the Status the API server sent, else its reason phrase."""
    body = exc.body
    try:
        payload = json.loads(body) if body else None
    except ValueError:
        payload = None
    if isinstance(payload, dict) and payload.get("kind") == "Status" and payload.get("message"):
        return str(payload["message"])[:API_MESSAGE_LIMIT]
    return str(exc.reason or "no message")


def _retry_after(exc: ApiException) -> timedelta | None:
    value = (exc.headers or {}).get("Retry-After")
    try:
        return timedelta(seconds=int(value)) if value is not None else None
    except ValueError:
        return None


def kube_error(exc: ApiException, *, verb: str, target: KubeTarget) -> KubeError:
    """The typed error for one failed call of `verb` on `target`."""
    status = int(exc.status or 0)
    return _error_class(status)(
        status=status,
        verb=verb,
        target=target,
        api_message=_api_message(exc),
        retry_after=_retry_after(exc) if status == 429 else None,
    )


@contextmanager
def kube_call(*, verb: str, target: KubeTarget) -> Iterator[None]:
    """Run one API call; an `ApiException` it raises leaves as the matching `KubeError`
    (the original chained as its cause). Combine with `contextlib.suppress(NotFound)`
    for a delete, `suppress(Conflict)` for a create."""
    try:
        yield
    except ApiException as exc:
        raise kube_error(exc, verb=verb, target=target) from exc
