"""Kubernetes API errors become one typed hierarchy (`activities/kube_errors.py`): the
class follows the status, the message names the verb, the resource and the object
and keeps the API server's words, and only errors a retry can fix are retryable.
Built from real `kubernetes.client.ApiException`s, the way the generated client
raises them (`ApiException.from_response` over a urllib3 response)."""

from __future__ import annotations

import contextlib
import json
from datetime import timedelta

import pytest
import urllib3
from kubernetes.client import ApiException
from kubernetes.client.rest import RESTResponse
from temporalio.exceptions import ApplicationError

from activities.kube_errors import (
    PERMANENT_ERROR_TYPES,
    ClientError,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    KubeTarget,
    NotFound,
    ServerError,
    TooManyRequests,
    kube_call,
    kube_error,
)

POD = KubeTarget(resource="pods", namespace="ml", name="chat-0")
FORBIDDEN_MESSAGE = (
    'pods is forbidden: User "system:serviceaccount:ml:kama" cannot create resource '
    '"pods" in API group "" in the namespace "ml"'
)


def api_exception(
    status: int, *, message: str = "", headers: dict[str, str] | None = None
) -> ApiException:
    """What the client raises for an answer with `status` and a Status body."""
    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "code": status,
        }
    )
    response = RESTResponse(
        urllib3.HTTPResponse(
            body=body.encode(), status=status, headers=headers or {}, preload_content=True
        )
    )
    response.read()
    try:
        ApiException.from_response(http_resp=response, body=body, data=None)
    except ApiException as exc:
        return exc
    raise AssertionError("from_response did not raise")


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (400, ClientError, False),
        (401, ClientError, False),
        (403, Forbidden, False),
        (404, NotFound, True),
        (409, Conflict, True),
        (410, ClientError, False),
        (422, Invalid, False),
        (429, TooManyRequests, True),
        (500, ServerError, True),
        (503, ServerError, True),
    ],
)
def test_the_class_follows_the_status(status: int, kind: type[KubeError], retryable: bool) -> None:
    error = kube_error(api_exception(status, message="no"), verb="create", target=POD)
    assert type(error) is kind
    assert isinstance(error, ApplicationError) and error.status == status
    assert error.type == kind.__name__
    assert error.non_retryable is not retryable
    assert (error.type in PERMANENT_ERROR_TYPES) is not retryable
    if 400 <= status < 500:
        assert isinstance(error, ClientError)


def test_a_403_names_the_verb_the_resource_the_object_and_the_api_message() -> None:
    error = kube_error(api_exception(403, message=FORBIDDEN_MESSAGE), verb="create", target=POD)
    assert error.message == (
        f"forbidden: cannot create pods in namespace ml (pods/chat-0): {FORBIDDEN_MESSAGE}"
    )
    assert error.verb == "create" and error.target == POD
    assert error.api_message == FORBIDDEN_MESSAGE


@pytest.mark.parametrize(
    ("target", "described"),
    [
        (KubeTarget(resource="nodes"), "nodes"),
        (KubeTarget(resource="pods", namespace="ml"), "pods in namespace ml"),
        (
            KubeTarget(resource="modelartifacts/status", namespace="ml", name="tiny"),
            "modelartifacts/status in namespace ml (modelartifacts/tiny)",
        ),
    ],
)
def test_targets_read_like_rbac(target: KubeTarget, described: str) -> None:
    assert str(target) == described


def test_a_body_that_is_not_a_status_falls_back_to_the_reason() -> None:
    exc = ApiException(status=502, reason="Bad Gateway")
    exc.body = "<html>proxy error</html>"
    error = kube_error(exc, verb="list", target=KubeTarget(resource="nodes"))
    assert error.message == "server error (502): cannot list nodes: Bad Gateway"
    assert type(error) is ServerError and not error.non_retryable


def test_too_many_requests_waits_for_retry_after() -> None:
    exc = api_exception(429, message="slow down", headers={"Retry-After": "7"})
    error = kube_error(exc, verb="patch", target=POD)
    assert error.next_retry_delay == timedelta(seconds=7)
    unparsable = api_exception(429, message="slow down", headers={"Retry-After": "soon"})
    assert kube_error(unparsable, verb="patch", target=POD).next_retry_delay is None


def test_kube_call_converts_and_chains_the_api_exception() -> None:
    original = api_exception(403, message=FORBIDDEN_MESSAGE)
    with pytest.raises(Forbidden) as raised, kube_call(verb="create", target=POD):
        raise original
    assert raised.value.__cause__ is original


def test_kube_call_lets_other_errors_through() -> None:
    with pytest.raises(urllib3.exceptions.ProtocolError), kube_call(verb="get", target=POD):
        raise urllib3.exceptions.ProtocolError("connection reset")


def test_expected_answers_are_suppressed_by_type() -> None:
    """delete→404 and create→409 are success; anything else still raises."""
    with contextlib.suppress(NotFound), kube_call(verb="delete", target=POD):
        raise api_exception(404, message='pods "chat-0" not found')
    with contextlib.suppress(Conflict), kube_call(verb="create", target=POD):
        raise api_exception(409, message='pods "chat-0" already exists')
    with (
        pytest.raises(Forbidden),
        contextlib.suppress(Conflict),
        kube_call(verb="create", target=POD),
    ):
        raise api_exception(403, message=FORBIDDEN_MESSAGE)
