"""The local stack's default StorageClass (`kama-local`) and its provisioner: every
claim of that class gets a directory on this machine as a hostPath PersistentVolume.

A claim only one node may mount (ReadWriteOnce/ReadWriteOncePod) is a directory *of
one node*, and its PV says so with node affinity (as rancher's local-path
provisioner does), so the scheduler and Kama's planner keep its pods there: the node
the scheduler picked when the claim waits for its first consumer
(`volume.kubernetes.io/selected-node`), else the node of the namespace's other
single-node volumes, else the node holding the fewest.
A claim for many nodes (ReadWriteMany, ReadOnlyMany) stands for a shared filesystem
(NFS) that every node, fake GPU nodes included, can mount. Released volumes are
deleted with their directories.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

log = logging.getLogger("kamadev.provisioner")

PROVISIONER = "kama.dev/local-path"
STORAGE_CLASS = "kama-local"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
SINGLE_NODE_MODES = {"ReadWriteOnce", "ReadWriteOncePod"}
SHARED_DIR = "shared"
_PASS_INTERVAL_S = 0.5


def node_affinity(node: str) -> k8s.V1VolumeNodeAffinity:
    here = k8s.V1NodeSelectorRequirement(key="kubernetes.io/hostname", operator="In", values=[node])
    return k8s.V1VolumeNodeAffinity(
        required=k8s.V1NodeSelector(
            node_selector_terms=[k8s.V1NodeSelectorTerm(match_expressions=[here])]
        )
    )


def affinity_node(pv: Any) -> str | None:
    """The one node a PV of ours is pinned to, if any."""
    affinity = pv.spec.node_affinity
    if affinity is None or affinity.required is None:
        return None
    for term in affinity.required.node_selector_terms or []:
        for expression in term.match_expressions or []:
            if expression.key == "kubernetes.io/hostname" and expression.values:
                return str(expression.values[0])
    return None


class LocalPathProvisioner:
    def __init__(
        self,
        *,
        core: k8s.CoreV1Api,
        storage: k8s.StorageV1Api,
        root: Path,
        nodes: Callable[[], list[str]],
        binding_mode: str = "Immediate",
    ) -> None:
        """`nodes`: the nodes single-node volumes may live on (real, not fake)."""
        self.core = core
        self.storage = storage
        self.root = root
        self.nodes = nodes
        self.binding_mode = binding_mode

    def ensure_storage_class(self) -> None:
        sc = k8s.V1StorageClass(
            metadata=k8s.V1ObjectMeta(
                name=STORAGE_CLASS,
                annotations={"storageclass.kubernetes.io/is-default-class": "true"},
            ),
            provisioner=PROVISIONER,
            reclaim_policy="Delete",
            volume_binding_mode=self.binding_mode,
        )
        with contextlib.suppress(k8s.ApiException):
            self.storage.create_storage_class(sc)

    def run(self, stop: threading.Event) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        while not stop.wait(_PASS_INTERVAL_S):
            try:
                self.provision_once()
            except Exception as exc:
                log.warning("provisioner pass failed: %s", exc)

    def _ours(self) -> list[Any]:
        return [
            pv
            for pv in self.core.list_persistent_volume().items
            if (pv.metadata.annotations or {}).get("pv.kubernetes.io/provisioned-by") == PROVISIONER
        ]

    def _place(self, claim: Any, volumes: list[Any]) -> str | None:
        """The node a single-node claim's directory goes on: the scheduler's choice
        when the claim waited for its first pod; else the node that already holds the
        namespace's single-node volumes (a pod may mount several of them, e.g. an
        importer copying from one claim into another); else the least-used node."""
        selected = (claim.metadata.annotations or {}).get(SELECTED_NODE)
        if selected:
            return str(selected)
        nodes = sorted(self.nodes())
        if not nodes:
            return None
        held = Counter(affinity_node(pv) for pv in volumes)
        for pv in sorted(volumes, key=lambda pv: pv.metadata.name):
            ref = pv.spec.claim_ref
            node = affinity_node(pv)
            if ref is not None and ref.namespace == claim.metadata.namespace and node in nodes:
                return node
        return min(nodes, key=lambda node: (held[node], node))

    def provision_once(self) -> None:
        volumes = self._ours()
        for claim in self.core.list_persistent_volume_claim_for_all_namespaces().items:
            if claim.spec.storage_class_name != STORAGE_CLASS or claim.spec.volume_name:
                continue
            if claim.metadata.deletion_timestamp is not None:
                continue
            if self.binding_mode == "WaitForFirstConsumer" and not (
                claim.metadata.annotations or {}
            ).get(SELECTED_NODE):
                continue
            access_modes = claim.spec.access_modes or ["ReadWriteOnce"]
            node = None
            if set(access_modes) <= SINGLE_NODE_MODES:
                node = self._place(claim, volumes)
                if node is None:
                    continue
            name = f"pvc-{claim.metadata.uid}"
            path = self.root / (node or SHARED_DIR) / name
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)
            pv = k8s.V1PersistentVolume(
                metadata=k8s.V1ObjectMeta(
                    name=name, annotations={"pv.kubernetes.io/provisioned-by": PROVISIONER}
                ),
                spec=k8s.V1PersistentVolumeSpec(
                    capacity={
                        "storage": (claim.spec.resources.requests or {}).get("storage", "1Gi")
                    },
                    access_modes=access_modes,
                    node_affinity=node_affinity(node) if node else None,
                    persistent_volume_reclaim_policy="Delete",
                    storage_class_name=STORAGE_CLASS,
                    host_path=k8s.V1HostPathVolumeSource(path=str(path), type="Directory"),
                    volume_mode=claim.spec.volume_mode or "Filesystem",
                    claim_ref=k8s.V1ObjectReference(
                        api_version="v1",
                        kind="PersistentVolumeClaim",
                        namespace=claim.metadata.namespace,
                        name=claim.metadata.name,
                        uid=claim.metadata.uid,
                    ),
                ),
            )
            try:
                created = self.core.create_persistent_volume(pv)
                volumes.append(created)
                log.info(
                    "provisioned %s for %s/%s on %s",
                    name,
                    claim.metadata.namespace,
                    claim.metadata.name,
                    node or "every node",
                )
            except k8s.ApiException as exc:
                if exc.status != 409:
                    raise
        for pv in volumes:
            if (
                pv.status
                and pv.status.phase == "Released"
                and pv.spec.persistent_volume_reclaim_policy == "Delete"
            ):
                if pv.spec.host_path and Path(pv.spec.host_path.path).is_relative_to(self.root):
                    shutil.rmtree(pv.spec.host_path.path, ignore_errors=True)
                with contextlib.suppress(k8s.ApiException):
                    self.core.delete_persistent_volume(pv.metadata.name)
