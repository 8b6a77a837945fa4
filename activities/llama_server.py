"""llama-server as an external system: how busy a serving pod is, read from its
`/slots` endpoint (the IP comes from the pod, read by name and checked to be a Kama
serving pod, never from the activity's input; Kama's worker reaches pod IPs like any
in-cluster client). When Kama runs with a master serving key, the read carries the
pod's llama-server API key, derived here from the pod's namespace and controlling
ModelDeployment (`kama.serving_key`), never passed through a workflow.

A pod is not trusted to answer sanely: the read has a total deadline
(`SLOTS_READ_DEADLINE_S`, from the request to the answer's last byte, so a pod that
answers a byte every second cannot stretch it) and a byte cap (`SLOTS_MAX_BYTES`).
Past either the read fails with `PodReadTimeout` or `PodAnswerTooLarge` and the
activity answers None, as for a pod that does not answer. The activity is async: a
slow pod costs the worker a waiting coroutine, never one of its activity threads."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

import httpx
from kubernetes import client as k8s
from temporalio import activity

from activities.pod_reads import PodAnswerTooLarge, PodReadTimeout, read_pod
from activities.provenance import kama_pod
from kama.serving_key import DEPLOYMENT_KIND, bearer, serving_key
from kama.serving_plan import LLAMA_PORT
from kama.serving_pod import SERVER_ROLE
from kama.tenancy import TenancyPolicy

log = logging.getLogger("kama")

SLOTS_READ_DEADLINE_S = 3.0  # inside the activity's 5 s start-to-close timeout
SLOTS_MAX_BYTES = 4 * 1024 * 1024  # llama-server's /slots is a few KiB per slot


@dataclass(frozen=True)
class SlotsRequest:
    """A serving pod by name: the activity reads its IP from the pod, after checking
    that it is one of Kama's (a task naming another address is refused)."""

    namespace: str
    pod: str


class LlamaServerActivities:
    def __init__(
        self,
        *,
        http: httpx.AsyncClient,
        api: k8s.ApiClient,
        tenancy: TenancyPolicy | None = None,
        deadline_s: float = SLOTS_READ_DEADLINE_S,
        max_bytes: int = SLOTS_MAX_BYTES,
        serving_key: str | None = None,
    ) -> None:
        self.http = http
        self.serving_key = serving_key  # the master key (kama.serving_key); None: no key
        self.core = k8s.CoreV1Api(api)
        self.tenancy = tenancy or TenancyPolicy()
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes

    @activity.defn(name="Count busy slots")
    async def busy_slots(self, request: SlotsRequest) -> int | None:
        """Slots processing a request; None when the pod or its server is gone, or
        does not answer within the deadline and byte cap. ForgedRequest for a pod that
        is not a Kama serving pod."""
        pod = await asyncio.to_thread(
            kama_pod,
            self.core,
            policy=self.tenancy,
            namespace=request.namespace,
            name=request.pod,
            role=SERVER_ROLE,
            owner_kind="ModelDeployment",
        )
        ip = pod.status.pod_ip if pod is not None and pod.status else None
        if not ip:
            return None
        host = f"[{ip}]" if ":" in ip else ip
        return await self.count_busy(
            f"http://{host}:{LLAMA_PORT}/slots", key=self._key(request.namespace, pod)
        )

    def _key(self, namespace: str, pod: k8s.V1Pod | None) -> str | None:
        """The pod's llama-server API key: of its controlling ModelDeployment (which
        `kama_pod` checked it has); None without a master key."""
        if self.serving_key is None or pod is None or pod.metadata is None:
            return None
        for owner in pod.metadata.owner_references or []:
            if owner.kind == DEPLOYMENT_KIND and owner.controller:
                return serving_key(
                    master=self.serving_key, namespace=namespace, deployment_uid=owner.uid
                )
        return None

    async def count_busy(self, url: str, *, key: str | None = None) -> int | None:
        """Busy slots as llama-server's `/slots` at `url` says (asked with `key`, the
        pod's API key, if any), within the bounds."""
        try:
            answer = await read_pod(
                self.http,
                url,
                deadline_s=self.deadline_s,
                max_bytes=self.max_bytes,
                authorization=None if key is None else bearer(key),
            )
        except (PodReadTimeout, PodAnswerTooLarge) as exc:
            log.warning("reading %s failed: %s", url, exc)
            return None
        except httpx.TransportError:
            return None
        if answer.status != 200:
            return None
        try:
            slots = json.loads(answer.body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.warning("%s answered something other than JSON", url)
            return None
        if not isinstance(slots, list):
            return None
        return sum(1 for slot in slots if isinstance(slot, dict) and slot.get("is_processing"))
