"""GPUs as clusters publish them: from a Node's labels and allocatable resources to the
kinds of device a serving pod can request there.

The planner must not read ``nvidia.com/gpu`` directly, because what that number means
depends on how the node is set up. The NVIDIA device plugin advertises allocatable
devices and GPU Feature Discovery (GFD) labels them (NVIDIA/k8s-device-plugin,
``docs/gpu-feature-discovery``, ``internal/lm/resource.go``); per resource ``R`` it
writes ``R.product``, ``R.count``, ``R.memory`` (MiB per device), ``R.replicas`` and
``R.sharing-strategy`` (``none``, ``time-slicing``, ``mps``):

- Whole cards: allocatable ``nvidia.com/gpu`` = ``nvidia.com/gpu.count`` cards of
  ``nvidia.com/gpu.memory`` MiB each. A replica may take several and split layers
  over them.
- Time-slicing or MPS with N replicas: allocatable ``nvidia.com/gpu`` = cards x N
  (``nvidia.com/gpu.shared`` instead when the sharing config says
  ``renameByDefault: true``), ``nvidia.com/gpu.replicas`` = N, and the product label
  gets a ``-SHARED`` suffix unless the resource was renamed. A device is then one
  slice of a card, and any slice may be handed to another pod: time-slicing isolates
  no memory, MPS caps each client at 1/N of it. Rule: **a slice has the card's memory
  divided by N** (so four slices of a 24 GiB card are 6 GiB each, never 4 x 24 GiB),
  and **a replica takes one slice**: the plugin hands out replicas without regard to
  which card they come from, so two slices may be one card, and a layer split over
  them would count the same memory twice (with ``failRequestsGreaterThanOne`` the
  plugin refuses such a request anyway).
- MIG, ``mixed`` strategy: each profile is its own resource,
  ``nvidia.com/mig-<profile>`` (``nvidia.com/mig-1g.10gb``), labelled
  ``nvidia.com/mig-<profile>.{count,memory,product,...}``; the ``nvidia.com/gpu.*``
  labels then describe the MIG-enabled cards, of which none is allocatable as a whole.
- MIG, ``single`` strategy (``nvidia.com/mig.strategy=single``): ``nvidia.com/gpu`` is a
  MIG instance, ``nvidia.com/gpu.memory`` its memory and ``nvidia.com/gpu.product``
  e.g. ``A100-SXM4-40GB-MIG-1g.5gb`` (plus ``nvidia.com/gpu.slices.gi``).
  A CUDA process uses one MIG instance, so **a replica takes one instance** of either
  strategy; every profile on a node is a kind of its own, with its own memory.

A vendor is described by data (``AcceleratorVendor``: the resource, the labels read,
their memory unit, the llama.cpp backend its runtime needs) plus a reader that turns
a node's labels and allocatable into ``DeviceKind``s; the planner sees only those.
Only NVIDIA is described. AMD's device plugin (ROCm/k8s-device-plugin) advertises
``amd.com/gpu`` with ``amd.com/gpu.product-name`` and ``amd.com/gpu.vram`` (whole GiB,
``"64G"``), which a second entry could read with ``whole_devices``; it is left out
because Kama's runtime image has no ROCm build, so a pod placed there could not use
the GPU.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Protocol

from kama.quantities import parse_count

__all__ = [
    "GPU_MEMORY_LABEL",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "MIG_STRATEGY_LABEL",
    "NVIDIA",
    "VENDORS",
    "AcceleratorVendor",
    "DeviceKind",
    "Sharing",
    "device_kinds",
    "whole_devices",
]

# Not from kama.memory: `kama runtime` imports this module (through kama.serving_pod)
# and must start without kama.api, which kama.memory imports.
MIB: Final = 1 << 20
GIB: Final = 1 << 30

GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"  # MiB, from GPU Feature Discovery
MIG_STRATEGY_LABEL: Final = "nvidia.com/mig.strategy"
SHARED_SUFFIX: Final = ".shared"
"""What ``renameByDefault: true`` appends to a shared resource's name."""
SHARED_PRODUCT_SUFFIX: Final = "-SHARED"
_MIG_RESOURCE: Final = re.compile(r"nvidia\.com/(mig-[^/]+?)(\.shared)?")


class Sharing(StrEnum):
    """How one device is shared between pods."""

    NONE = "none"
    TIME_SLICING = "time-slicing"
    MPS = "mps"


@dataclass(frozen=True, kw_only=True)
class DeviceKind:
    """One kind of device a node offers a serving pod: what to request, how many are
    allocatable, and the memory one replica may count on per device."""

    vendor: str
    resource: str
    """The extended resource the pod requests (``nvidia.com/mig-1g.10gb``)."""
    count: int
    """Allocatable devices of this kind (slices, where they are slices)."""
    memory_bytes: int | None
    """VRAM a replica may count on per device: a slice's share; None when unknown."""
    memory_label: str
    """The label whose absence leaves the memory unknown (named in rejections)."""
    product: str | None
    product_label: str
    """The label the pod's node affinity pins ``product`` by."""
    sharing: Sharing = Sharing.NONE
    replicas: int = 1
    """Pods one physical device (card or MIG instance) is handed to."""
    partition: bool = False
    """A hardware partition of a card (an NVIDIA MIG instance)."""
    device_memory_bytes: int | None = None
    """The card's (or MIG instance's) memory before it is divided among replicas."""

    def __post_init__(self) -> None:
        if self.count < 0 or self.replicas < 1:
            raise ValueError(f"DeviceKind {self.resource}: count >= 0 and replicas >= 1")
        if self.memory_bytes is not None and self.memory_bytes < 1:
            raise ValueError(f"DeviceKind {self.resource}: memory_bytes must be >= 1")

    @property
    def combinable(self) -> bool:
        """Whether a replica may take several and split layers over them: only whole,
        unshared cards, each of them distinct memory."""
        return self.sharing is Sharing.NONE and not self.partition

    @property
    def max_per_replica(self) -> int:
        return self.count if self.combinable else min(1, self.count)

    @property
    def unit(self) -> str:
        """How a candidate's devices read in a rejection: ``GPU(s)`` for whole cards,
        else the resource requested and what it is (``MIG nvidia.com/mig-1g.10gb``)."""
        if self.combinable:
            return "GPU(s)"
        what = [str(self.sharing)] if self.sharing is not Sharing.NONE else []
        what += ["MIG"] if self.partition else []
        return " ".join([*what, self.resource])

    def describe_memory(self) -> str:
        """What one device offers, for a rejection: the product and, for a shared or
        partitioned device, how its memory was arrived at."""
        if self.memory_bytes is None:
            return f"{self.product or self.resource} memory unknown"
        have = f"{self.memory_bytes / GIB:.1f} GiB ({self.memory_bytes} bytes)"  # as format_bytes
        if self.combinable:
            return f"{self.product or 'GPU'} has {have}"
        name = self.product or self.resource
        whole = self.device_memory_bytes
        if self.sharing is not Sharing.NONE and whole is not None:
            of = "MIG instance" if self.partition else "card"
            return (
                f"a {self.sharing} slice of {name} has {have}: one {whole / GIB:.1f} GiB "
                f"{of} shared by {self.replicas} replicas, any of which may go to another pod"
            )
        return f"MIG instance {name} has {have}"


class Reader(Protocol):
    """Turns one node's labels and allocatable resources into a vendor's device kinds."""

    def __call__(
        self,
        *,
        vendor: AcceleratorVendor,
        labels: Mapping[str, str],
        allocatable: Mapping[str, Any],
    ) -> list[DeviceKind]: ...


@dataclass(frozen=True, kw_only=True)
class AcceleratorVendor:
    """What Kama reads of one vendor's devices: the resource its device plugin
    advertises, the labels its feature discovery writes, and the llama.cpp backend the
    runtime image needs for them. ``read`` turns labels and allocatable into kinds."""

    name: str
    resource: str
    product_label: str
    memory_label: str
    memory_unit_bytes: int
    """Bytes per unit of the memory label's value (MiB for NVIDIA GFD)."""
    runtime_backend: str
    """The llama.cpp backend the serving image must be built with (Kama ships one
    runtime image, ``KAMA_RUNTIME_IMAGE``; this says which build these nodes need)."""
    read: Reader

    def memory(self, value: str | None) -> int | None:
        """The memory label's value in bytes; None when absent, zero or not a number."""
        number = _positive_int(value)
        return None if number is None else number * self.memory_unit_bytes


def _positive_int(value: str | None) -> int | None:
    if value is None or not value.isdigit() or int(value) < 1:
        return None
    return int(value)


def _allocatable(*, allocatable: Mapping[str, Any], resource: str) -> int:
    value = allocatable.get(resource)
    return 0 if value is None else parse_count(value)


def whole_devices(
    *, vendor: AcceleratorVendor, labels: Mapping[str, str], allocatable: Mapping[str, Any]
) -> list[DeviceKind]:
    """The reader for a vendor whose devices are only ever whole cards, all alike."""
    count = _allocatable(allocatable=allocatable, resource=vendor.resource)
    if count == 0:
        return []
    memory = vendor.memory(labels.get(vendor.memory_label))
    return [
        DeviceKind(
            vendor=vendor.name,
            resource=vendor.resource,
            count=count,
            memory_bytes=memory,
            memory_label=vendor.memory_label,
            product=labels.get(vendor.product_label),
            product_label=vendor.product_label,
            device_memory_bytes=memory,
        )
    ]


def _nvidia_kind(
    *,
    vendor: AcceleratorVendor,
    base: str,
    labels: Mapping[str, str],
    allocatable: Mapping[str, Any],
) -> DeviceKind | None:
    """The kind GFD labels under ``base`` (``nvidia.com/gpu`` or a MIG profile's
    resource), requested as ``base`` or as its ``.shared`` rename."""
    resource = (
        base if _allocatable(allocatable=allocatable, resource=base) else base + SHARED_SUFFIX
    )
    count = _allocatable(allocatable=allocatable, resource=resource)
    if count == 0:
        return None
    product = labels.get(f"{base}.product")
    replicas = _positive_int(labels.get(f"{base}.replicas")) or 1
    strategy = labels.get(f"{base}.sharing-strategy", "")
    shared = (
        replicas > 1
        or resource != base
        or strategy in (Sharing.TIME_SLICING, Sharing.MPS)
        or (product or "").endswith(SHARED_PRODUCT_SUFFIX)
    )
    sharing = Sharing.NONE
    if shared:
        sharing = Sharing.MPS if strategy == Sharing.MPS else Sharing.TIME_SLICING
    partition = base != vendor.resource or (
        labels.get(MIG_STRATEGY_LABEL) == "single"
        and (f"{base}.slices.gi" in labels or "-MIG-" in (product or ""))
    )
    memory_label = f"{base}.memory"
    device_memory = vendor.memory(labels.get(memory_label))
    memory = None if device_memory is None else device_memory // replicas
    if shared and replicas == 1:  # shared, but by how many is not published
        memory, memory_label = None, f"{base}.replicas"
    return DeviceKind(
        vendor=vendor.name,
        resource=resource,
        count=count,
        memory_bytes=memory,
        memory_label=memory_label,
        product=product,
        product_label=f"{base}.product",
        sharing=sharing,
        replicas=replicas,
        partition=partition,
        device_memory_bytes=device_memory,
    )


def nvidia_devices(
    *, vendor: AcceleratorVendor, labels: Mapping[str, str], allocatable: Mapping[str, Any]
) -> list[DeviceKind]:
    """NVIDIA's kinds: ``nvidia.com/gpu`` (whole cards, time-slicing or MPS slices, or
    MIG instances under the single strategy) and each ``nvidia.com/mig-<profile>``."""
    bases = [vendor.resource]
    for name in sorted(allocatable):
        match = _MIG_RESOURCE.fullmatch(name)
        if match and f"nvidia.com/{match.group(1)}" not in bases:
            bases.append(f"nvidia.com/{match.group(1)}")
    kinds = (
        _nvidia_kind(vendor=vendor, base=base, labels=labels, allocatable=allocatable)
        for base in bases
    )
    return [kind for kind in kinds if kind is not None]


NVIDIA: Final = AcceleratorVendor(
    name="NVIDIA",
    resource=GPU_RESOURCE,
    product_label=GPU_PRODUCT_LABEL,
    memory_label=GPU_MEMORY_LABEL,
    memory_unit_bytes=MIB,
    runtime_backend="cuda",
    read=nvidia_devices,
)

VENDORS: Final[tuple[AcceleratorVendor, ...]] = (NVIDIA,)


def device_kinds(
    *,
    labels: Mapping[str, str],
    allocatable: Mapping[str, Any],
    vendors: tuple[AcceleratorVendor, ...] = VENDORS,
) -> tuple[DeviceKind, ...]:
    """Every kind of device the node offers, by vendor, each with a nonzero count."""
    return tuple(
        kind
        for vendor in vendors
        for kind in vendor.read(vendor=vendor, labels=labels, allocatable=allocatable)
    )
