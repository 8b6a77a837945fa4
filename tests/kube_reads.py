"""`kubectl get … -o json` answered through the Python client instead of a kubectl
process, for the tests' existence polls (`tests.support.exists`: the stack tests poll
the cluster hundreds of times a run, and each kubectl start costs about 60 ms of CPU
and 170 ms of wall time on the two cores that also run the cluster being waited
for). `get_json` still runs kubectl (see its docstring).

`get_via_client` understands what the tests ask (resource names, plural, singular,
short or `plural.group`, comma-separated; names or `kind/name`; `-n`, `-A`, `-l`,
`--field-selector`) and answers as kubectl does: one object for one name, else a
`List` whose items carry their `apiVersion` and `kind`; a missing object fails with
kubectl's message. It returns None for anything else, which the caller then asks
kubectl. Resources are found by the API server's discovery (core first, then each
group's preferred version, as kubectl ranks them), read again when a name is not
found (a CRD installed since)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kamadev.stack import LocalStack

READ_TIMEOUT_S = 30
REDISCOVER_S = 5.0  # an unknown name reads discovery again at most this often


@dataclass(frozen=True)
class Resource:
    path: str  # "/api/v1" or "/apis/<group>/<version>"
    api_version: str
    plural: str
    kind: str
    namespaced: bool


@dataclass(frozen=True)
class GetRequest:
    resources: list[str]
    names: list[str]
    namespace: str | None  # None: all namespaces
    label_selector: str | None
    field_selector: str | None


def parse_get(args: tuple[str, ...]) -> GetRequest | None:
    """What `kubectl get <args>` asks, or None for arguments this does not read."""
    positional: list[str] = []
    namespace: str | None = "default"
    labels = fields = None
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg in ("-n", "--namespace", "-l", "--selector", "--field-selector"):
            if not rest:
                return None
            value = rest.pop(0)
            if arg in ("-n", "--namespace"):
                namespace = value
            elif arg == "--field-selector":
                fields = value
            else:
                labels = value
        elif arg in ("-A", "--all-namespaces"):
            namespace = None
        elif arg.startswith("-"):
            return None
        else:
            positional.append(arg)
    if not positional:
        return None
    if "/" in positional[0]:  # kind/name [kind/name ...] of one kind
        kinds = {p.split("/", 1)[0] for p in positional}
        if len(kinds) != 1 or not all("/" in p for p in positional):
            return None
        names = [p.split("/", 1)[1] for p in positional]
        return GetRequest(list(kinds), names, namespace, labels, fields)
    resources = positional[0].split(",")
    names = positional[1:]
    if names and (len(resources) > 1 or labels or fields):
        return None
    return GetRequest(resources, names, namespace, labels, fields)


class ClusterReads:
    """One stack's API client and its discovered resources."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self._api = api
        self._lock = threading.Lock()
        self._by_name: dict[str, Resource] = {}
        self._discovered_at = -REDISCOVER_S

    def _call(self, path: str, query: list[tuple[str, str]] | None = None) -> Any:
        """GET `path`; an API error as ApiException, no answer at all (the API server
        down) as the AssertionError a failed kubectl gives."""
        try:
            method, url, headers, body, _ = self._api.param_serialize(
                "GET", path, query_params=query or [], header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )  # fmt: skip
            response = self._api.call_api(method, url, headers, body,
                                          _request_timeout=READ_TIMEOUT_S)  # fmt: skip
            data = response.read()
            if response.status >= 400:
                raise ApiException(status=response.status, reason=data.decode(errors="replace"))
            return json.loads(data)
        except ApiException:
            raise
        except Exception as exc:  # urllib3's connection and timeout errors
            raise AssertionError(f"kubectl get {path} failed: {exc}") from None

    def _discover(self) -> dict[str, Resource]:
        found: dict[str, Resource] = {}
        paths = [("/api/v1", "v1")]
        try:
            groups = self._call("/apis")["groups"]
        except ApiException as exc:
            raise AssertionError(f"API discovery failed: {exc}") from None
        for group in groups:
            version = group["preferredVersion"]["groupVersion"]
            paths.append((f"/apis/{version}", version))
        for path, api_version in paths:
            try:
                listed = self._call(path)["resources"]
            except ApiException:  # a group going away (an aggregated API): skip it
                continue
            for item in listed:
                if "/" in item["name"]:  # subresources
                    continue
                resource = Resource(path, api_version, item["name"], item["kind"],
                                    item["namespaced"])  # fmt: skip
                group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
                names = [item["name"], item.get("singularName") or item["kind"].lower(),
                         item["kind"].lower(), *(item.get("shortNames") or [])]  # fmt: skip
                if group:
                    names += [f"{item['name']}.{group}", f"{item['kind'].lower()}.{group}"]
                for name in names:
                    found.setdefault(name, resource)  # the first (core, then groups) wins
        return found

    def resource(self, name: str) -> Resource | None:
        with self._lock:
            stale = time.monotonic() - self._discovered_at > REDISCOVER_S
            if name.lower() not in self._by_name and stale:
                self._by_name = self._discover()
                self._discovered_at = time.monotonic()
            return self._by_name.get(name.lower())

    def get(self, request: GetRequest) -> Any | None:
        resources = [self.resource(r) for r in request.resources]
        if any(r is None for r in resources):
            return None
        items: list[Any] = []
        for resource in resources:
            assert resource is not None
            if request.namespace is None or not resource.namespaced:
                base = f"{resource.path}/{resource.plural}"
            else:
                base = f"{resource.path}/namespaces/{request.namespace}/{resource.plural}"
            if request.names:
                for name in request.names:
                    items.append(self._one(resource, f"{base}/{name}", name))
                if len(request.names) == 1:
                    return items[0]
                continue
            query = []
            if request.label_selector:
                query.append(("labelSelector", request.label_selector))
            if request.field_selector:
                query.append(("fieldSelector", request.field_selector))
            try:
                listed = self._call(base, query)["items"]
            except ApiException as exc:
                raise AssertionError(f"kubectl get {resource.plural} failed: {exc}") from None
            for item in listed:
                items.append({"apiVersion": resource.api_version, "kind": resource.kind, **item})
        return {"apiVersion": "v1", "items": items, "kind": "List",
                "metadata": {"resourceVersion": ""}}  # fmt: skip

    def _one(self, resource: Resource, path: str, name: str) -> Any:
        try:
            return self._call(path)
        except ApiException as exc:
            if exc.status == 404:
                raise AssertionError(
                    f"kubectl get {resource.plural} {name} failed (1): Error from server "
                    f'(NotFound): {resource.plural} "{name}" not found'
                ) from None
            raise AssertionError(f"kubectl get {resource.plural} {name} failed: {exc}") from None


_READS: dict[str, ClusterReads] = {}
_READS_LOCK = threading.Lock()


def get_via_client(stack: LocalStack, args: tuple[str, ...]) -> Any | None:
    """`kubectl get <args> -o json` read with the Python client, or None when the
    arguments are not ones this reads (the caller runs kubectl)."""
    request = parse_get(args)
    if request is None:
        return None
    with _READS_LOCK:
        reads = _READS.get(stack.stack_id)
        if reads is None:
            reads = _READS[stack.stack_id] = ClusterReads(stack.api_client())
    return reads.get(request)
