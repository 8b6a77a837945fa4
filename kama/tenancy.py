"""What a tenant may ask of the cluster through a Kama resource, decided in one place.

Kama is a shared service: whoever can create a ModelDeployment in a served namespace
is a tenant, and a tenant's spec is untrusted input. Two of its fields reach past the
tenant's own namespace: `placement.nodeSelector` and `placement.tolerations` choose
nodes, and a toleration of the control plane's taint (or an empty key, which
tolerates every taint) would put a tenant's replicas on the nodes that run the API
server. So both are allowed only from allow-lists the cluster operator sets in the
chart (`tenancy.*`), and the namespaces Kama serves are a list the operator sets
(`watchNamespaces`). Pure: the worker's activities apply it to what they create.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

DEFAULT_NODE_SELECTOR_KEYS: Final = frozenset(
    {
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "nvidia.com/gpu.product",
        "nvidia.com/gpu.memory",
        "nvidia.com/gpu.count",
    }
)
"""Labels that describe hardware and place, none that singles out control-plane nodes."""
DEFAULT_TOLERATION_KEYS: Final = frozenset({"nvidia.com/gpu"})
"""The taint GPU node pools commonly carry; nothing else by default."""
ANY_KEY: Final = "*"
"""In an allow-list: every key (a toleration with an empty key needs it too)."""


@dataclass(frozen=True, kw_only=True)
class TenancyPolicy:
    """The operator's bounds on tenants: which namespaces are served and which node
    labels and taints a deployment may name."""

    watch_namespaces: tuple[str, ...] = ()
    """Served namespaces; empty: every namespace."""
    node_selector_keys: frozenset[str] = field(default=DEFAULT_NODE_SELECTOR_KEYS)
    toleration_keys: frozenset[str] = field(default=DEFAULT_TOLERATION_KEYS)

    def serves(self, namespace: str) -> bool:
        return not self.watch_namespaces or namespace in self.watch_namespaces

    def placement_refusals(
        self, *, node_selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]]
    ) -> list[str]:
        """Why this node selector and these tolerations are not allowed (nothing when
        they are), one reason per offending entry, naming the field and the chart
        value that would allow it."""
        refusals = [
            f"spec.placement.nodeSelector key {key!r} is not in the operator's allow-list "
            "(chart value tenancy.allowedNodeSelectorKeys)"
            for key in sorted(node_selector)
            if not _allowed(key, self.node_selector_keys)
        ]
        for toleration in tolerations:
            key = str(toleration.get("key") or "")
            if not _allowed(key, self.toleration_keys):
                shown = repr(key) if key else "'' (every taint)"
                refusals.append(
                    f"spec.placement.tolerations key {shown} is not in the operator's "
                    "allow-list (chart value tenancy.allowedTolerationKeys)"
                )
        return refusals


def _allowed(key: str, allowed: frozenset[str]) -> bool:
    return ANY_KEY in allowed or (bool(key) and key in allowed)


def parse_key_list(value: str | None, *, default: Iterable[str]) -> frozenset[str]:
    """A comma-separated allow-list from the environment; unset keeps `default`, an
    empty string allows nothing."""
    if value is None:
        return frozenset(default)
    return frozenset(part.strip() for part in value.split(",") if part.strip())


def parse_namespaces(value: str | None) -> tuple[str, ...]:
    """`KAMA_WATCH_NAMESPACE`: one namespace or a comma-separated list; unset or
    empty: every namespace."""
    if not value:
        return ()
    return tuple(sorted({part.strip() for part in value.split(",") if part.strip()}))
