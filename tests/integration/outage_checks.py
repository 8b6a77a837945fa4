"""What the outage tests check on both sides of an outage: a completion through the
gateway, which replica answered, and that the watcher, worker and gateway processes
outlived it (they are left running through every outage)."""

from __future__ import annotations

import httpx

from tests.conftest import GatewayProcess


def complete(gw: GatewayProcess, model: str, *, timeout: float = 60) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/v1/completions",
        json={"model": model, "prompt": "count", "max_tokens": 4, "ignore_eos": True},
        timeout=timeout,
    )


def routed_by(gw: GatewayProcess, model: str) -> str:
    try:
        response = complete(gw, model, timeout=30)
    except httpx.HTTPError as exc:
        return f"error:{type(exc).__name__}"
    return response.headers.get("x-kama-pod", "") if response.status_code == 200 else ""


def processes_alive(gw: GatewayProcess) -> None:
    control = gw.control
    for process in (control.watcher, control.second_watcher, control.worker, gw.process):
        process.check_alive()
