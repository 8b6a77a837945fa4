"""llama-server as an external system: how busy a serving pod is, read from its
`/slots` endpoint (the pod IP and port come from the pod; Kama's worker reaches pod
IPs like any in-cluster client)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from temporalio import activity

from kama.serving_plan import LLAMA_PORT


@dataclass(frozen=True)
class SlotsRequest:
    pod_ip: str
    port: int = LLAMA_PORT


class LlamaServerActivities:
    def __init__(self, *, http: httpx.Client) -> None:
        self.http = http

    @activity.defn(name="Count busy slots")
    def busy_slots(self, request: SlotsRequest) -> int | None:
        """Slots processing a request; None when the server does not answer (gone)."""
        try:
            response = self.http.get(f"http://{request.pod_ip}:{request.port}/slots")
        except httpx.TransportError:
            return None
        if response.status_code != 200:
            return None
        return sum(1 for slot in response.json() if slot.get("is_processing"))
