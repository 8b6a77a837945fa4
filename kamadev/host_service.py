"""A Service whose one endpoint is a server on this host (the Temporal dev server's
relay, KEDA's metrics adapter): no selector, and an EndpointSlice written by hand with
the nodes' bridge address, where the server listens. Pods then reach it by its name
(`temporal.kama-system.svc`) through kube-proxy, as they would reach an in-cluster
server, and the API server's aggregation layer dials the same address."""

from __future__ import annotations

from typing import Any

MANAGED_BY = "kamadev"


def host_service(
    *, namespace: str, name: str, port: int, target_port: int, address: str, port_name: str
) -> list[dict[str, Any]]:
    """The Service `namespace/name` on `port`, and its EndpointSlice to
    `address:target_port`."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            # no selector: the server is no pod; its endpoint is the slice below
            "spec": {"ports": [{"name": port_name, "port": port, "targetPort": target_port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-host",
                "namespace": namespace,
                "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": port_name, "port": target_port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        },
    ]
