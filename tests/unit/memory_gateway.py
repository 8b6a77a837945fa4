"""A gateway process for `test_gateway_memory_bounds`: the real public front and
proxy (granian, the lean path, the upstream pool) over one model whose replica
listens at the port given, with the limits given, and readiness as if its watches
had listed. It prints `ready <port> <ops port>` once serving, and stops on SIGTERM.
Run as `python -m tests.unit.memory_gateway <replica port> <limits as JSON>`; its
own process, so that its memory is measured apart from the clients'. The limits may
also name `tenants` ({namespace: replica IP}: one more model `<namespace>/chat` each,
its replica on that address and the same port, and one ModelAccessKey `app` each,
whose key `tests.unit.test_gateway_auth.key_for` gives; API keys are then required)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvloop

from gateway.app import GatewayHolder, build_apps
from gateway.held import GatewayLimits
from gateway.namespace_shares import NamespaceShares
from gateway.transport.serve import Listen, serve
from kamadev.processes import free_port
from tests.unit.gateway_support import deployment, fixed_state, pod
from tests.unit.test_gateway_auth import access_key

MODEL = "ns/chat"


@asynccontextmanager
async def no_lifespan() -> AsyncIterator[None]:
    yield


async def main(
    *, replica_port: int, limits: GatewayLimits, slots: int, tenants: dict[str, str]
) -> None:
    holder = GatewayHolder()
    holder.current = fixed_state(
        model=MODEL,
        replica_ips=["127.0.0.1"],
        replica_port=replica_port,
        slots=slots,
        max_held_bytes=limits.max_held_bytes,
        auth="apikey" if tenants else "disabled",
    )
    holder.current.proxy.max_waiting_requests = limits.max_waiting_requests
    if tenants:  # the namespaces' shares of the waiting budgets, as the gateway has them
        holder.current.proxy.shares = NamespaceShares(share=limits.namespace_share)
    for namespace, ip in tenants.items():
        registry = holder.current.registry
        registry.apply_deployment("ADDED", deployment("chat", namespace=namespace, uid=namespace))
        registry.apply_pod(
            "ADDED", pod("chat-0", namespace=namespace, model="chat", ip=ip, slots=slots)
        )
        holder.current.access.apply_key("ADDED", access_key("app", namespace=namespace))
    holder.current.health.track("pods").synced = True  # readiness as if listed
    public, ops = build_apps(holder, limits=limits)
    port, ops_port = free_port(), free_port()
    asyncio.get_running_loop().call_later(
        0.5, lambda: print(f"ready {port} {ops_port}", flush=True)
    )
    await serve(
        public=public,
        ops=ops,
        lifespan=no_lifespan,
        listen=Listen("127.0.0.1", port),
        ops_listen=Listen("127.0.0.1", ops_port),
        grace_s=1.0,
    )


if __name__ == "__main__":
    settings = json.loads(sys.argv[2])
    slots = settings.pop("slots")
    tenants = settings.pop("tenants", {})
    uvloop.run(
        main(
            replica_port=int(sys.argv[1]),
            limits=GatewayLimits(**settings),
            slots=slots,
            tenants=tenants,
        )
    )
