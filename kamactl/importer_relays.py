"""The worker's side of importer pods: one relay per live importer pod.

Importer pods no longer poll Temporal (`activities.importer_relay`). Instead the
worker keeps, for every importer pod that is its own, a Temporal worker on that
operation's task queue whose one dynamic activity relays each task to the pod. The
set follows the cluster: a loop lists importer pods in the served namespaces, binds
each new one (once it has an IP) and unbinds the gone ones, so a worker restart, a
recreated importer pod or a new operation needs nothing else.

A pod is bound only if it is exactly what the worker itself creates: Kama's labels,
controlled by a ModelArtifact that exists in the pod's own namespace with the owner
reference's uid, named as the worker names the operation's pod, with the operation's
id starting with that artifact's uid, and (with the master key, `KAMA_SERVING_KEY`) a
token the worker derives for that pod, operation and artifact
(`kama.importer_protocol.importer_token`), so a pod a tenant made in that shape gets
no relay. A tenant can create pods only in its own namespace, so it can at most stand
in for its own artifacts' importers, and every relay is another Temporal worker
polling Kama's namespace: at most `MAX_RELAYS_PER_NAMESPACE` are bound per namespace
and `MAX_RELAYS` in all (the oldest pods first; a pod past a cap waits, and its
operation retries, until a relay is free)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.worker import Worker

from activities.importer_relay import ImporterPodAddress, ImporterRelay, result_types
from kama.api import GROUP, VERSION
from kama.contracts import ARTIFACTS, ObjectRef, importer_task_queue
from kama.importer_pod import IMPORTER_ROLE, importer_pod_name
from kama.importer_protocol import IMPORTER_PORT, TOKEN_ENV, is_importer_token
from kama.tenancy import TenancyPolicy

log = logging.getLogger("kama.importer-relays")

LIST_EVERY_S = 1.0
RELAY_ACTIVITY_SLOTS = 4
MAX_RELAYS_PER_NAMESPACE = 16  # an import and a verify at a time for 8 artifacts at once
MAX_RELAYS = 256  # Temporal workers polling Kama's namespace for importers, in all
IMPORTER_SELECTOR = f"app.kubernetes.io/managed-by=kama,kama.dev/role={IMPORTER_ROLE}"


@dataclass(frozen=True)
class Binding:
    queue: str
    address: ImporterPodAddress
    uid: str  # the pod's, so a recreated pod is bound anew


def binding_of(
    pod: dict[str, Any], *, cluster: str, master_key: str | None = None
) -> tuple[Binding, ObjectRef] | None:
    """The relay a pod asks for and the artifact that must own it, if the pod is in
    the shape the worker creates and, with `master_key`, carries the token the worker
    derives for it (None otherwise, or while it has no IP)."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    artifact, operation = labels.get("kama.dev/artifact"), labels.get("kama.dev/operation")
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    ip = status.get("podIP")
    if not (artifact and operation and ip and len(owners) == 1) or meta.get("deletionTimestamp"):
        return None
    [owner] = owners
    uid = str(owner.get("uid") or "")
    if (
        owner.get("kind") != "ModelArtifact"
        or owner.get("name") != artifact
        or not uid
        or not operation.startswith(uid[:8])
        or meta["name"] != importer_pod_name(artifact, operation)
    ):
        return None
    containers = spec.get("containers") or []
    token = next(
        (
            str(e.get("value") or "")
            for c in containers
            for e in c.get("env") or []
            if e.get("name") == TOKEN_ENV
        ),
        "",
    )
    if not token:
        return None
    if master_key is not None and not is_importer_token(
        token,
        master=master_key,
        namespace=meta["namespace"],
        artifact_uid=uid,
        operation=operation,
        pod=meta["name"],
    ):
        return None
    ref = ObjectRef(namespace=meta["namespace"], name=artifact, uid=uid, cluster=cluster)
    address = ImporterPodAddress(
        namespace=meta["namespace"],
        name=meta["name"],
        url=f"http://{_host(ip)}:{IMPORTER_PORT}",
        token=token,
    )
    binding = Binding(
        queue=importer_task_queue(ref, operation=operation),
        address=address,
        uid=str(meta.get("uid") or ""),
    )
    return binding, ref


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


class ImporterRelays:
    """Temporal workers on the task queues of the live importer pods."""

    def __init__(
        self,
        *,
        client: Client,
        api: k8s.ApiClient,
        tenancy: TenancyPolicy,
        cluster: str,
        importer_functions: list[Callable[..., Any]],
        master_key: str | None = None,
    ) -> None:
        self.client = client
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.tenancy = tenancy
        self.cluster = cluster
        self.master_key = master_key
        self.refused_over_cap: set[str] = set()  # pod uids past a cap, logged once
        self.results = result_types(importer_functions)
        self.http = httpx.AsyncClient()
        self.running: dict[str, tuple[Binding, Worker, asyncio.Task[None]]] = {}

    def _importer_pods(self) -> list[dict[str, Any]]:
        if self.tenancy.watch_namespaces:
            found: list[Any] = []
            for namespace in self.tenancy.watch_namespaces:
                found.extend(
                    self.core.list_namespaced_pod(namespace, label_selector=IMPORTER_SELECTOR).items
                )
        else:
            found = self.core.list_pod_for_all_namespaces(label_selector=IMPORTER_SELECTOR).items
        pods: list[dict[str, Any]] = self.api.sanitize_for_serialization(found)
        return pods

    def _owned(self, ref: ObjectRef) -> bool:
        """Whether the ModelArtifact exists in the pod's namespace with that uid."""
        try:
            artifact = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, ref.namespace, ARTIFACTS, ref.name
            )
        except k8s.ApiException:
            return False
        return bool((artifact.get("metadata") or {}).get("uid") == ref.uid)

    async def sync(self) -> None:
        """Bind the importer pods listed now; unbind the ones gone."""
        pods = await asyncio.to_thread(self._importer_pods)
        wanted = await self.wanted(pods)
        for queue, (binding, worker, task) in list(self.running.items()):
            if wanted.get(queue) != binding:
                del self.running[queue]
                await _stop(worker, task)
                log.info("unbound %s from %s", queue, binding.address.name)
        for queue, binding in wanted.items():
            if queue in self.running:
                continue
            relay = ImporterRelay(http=self.http, pod=binding.address, results=self.results)
            worker = Worker(
                self.client,
                task_queue=queue,
                activities=[relay.relay],
                max_concurrent_activities=RELAY_ACTIVITY_SLOTS,
            )
            self.running[queue] = (binding, worker, asyncio.create_task(worker.run()))
            log.info("relaying %s to %s", queue, binding.address.name)

    async def wanted(self, pods: list[dict[str, Any]]) -> dict[str, Binding]:
        """The relays `pods` ask for that the worker binds, by queue: pods of its own
        (`binding_of`, the owning artifact live), within the caps."""
        wanted: dict[str, Binding] = {}
        per_namespace: dict[str, int] = {}
        over_cap: set[str] = set()
        # bound ones first, then the oldest: a flood of new pods displaces nothing
        for pod in sorted(pods, key=self._binding_order):
            found = binding_of(pod, cluster=self.cluster, master_key=self.master_key)
            if found is None or not self.tenancy.serves(found[1].namespace):
                continue
            binding, ref = found
            if (
                len(wanted) >= MAX_RELAYS
                or per_namespace.get(ref.namespace, 0) >= MAX_RELAYS_PER_NAMESPACE
            ):
                over_cap.add(binding.uid)
                if binding.uid not in self.refused_over_cap:
                    log.warning(
                        "importer pod %s/%s waits for a relay: %d relays are bound in its "
                        "namespace (at most %d), %d in all (at most %d)",
                        ref.namespace, binding.address.name,
                        per_namespace.get(ref.namespace, 0), MAX_RELAYS_PER_NAMESPACE,
                        len(wanted), MAX_RELAYS,
                    )  # fmt: skip
                continue
            current = self.running.get(binding.queue)
            known = current is not None and current[0] == binding
            if not known and not await asyncio.to_thread(self._owned, ref):
                continue
            wanted[binding.queue] = binding
            per_namespace[ref.namespace] = per_namespace.get(ref.namespace, 0) + 1
        self.refused_over_cap = over_cap
        return wanted

    def _binding_order(self, pod: dict[str, Any]) -> tuple[bool, str, str]:
        meta = pod["metadata"]
        bound = any(b.uid == meta.get("uid") for b, _w, _t in self.running.values())
        return (not bound, str(meta.get("creationTimestamp") or ""), str(meta.get("uid")))

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await self.sync()
                except Exception:
                    log.exception("listing importer pods failed; trying again")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=LIST_EVERY_S)
        finally:
            for _binding, worker, task in self.running.values():
                await _stop(worker, task)
            self.running.clear()
            await self.http.aclose()


async def _stop(worker: Worker, task: asyncio.Task[None]) -> None:
    try:
        await worker.shutdown()
    except Exception:
        log.exception("stopping a relay failed")
    if not task.done():
        task.cancel()
