"""The emulated GPUs and MIG instances of each node, and their stable assignment to pods."""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpusizer.catalog import Catalog, GPUProduct, layout_is_valid, named_layout
from gpusizer.catalog.migparted import read_described

from e2e.gpusim.cluster import (
    COUNT_LABEL,
    MIG_APPLIED_ANNOTATION,
    MIG_CONFIG_LABEL,
    MIG_LAYOUT_ANNOTATION,
    MIG_STATE_LABEL,
    PRODUCT_LABEL,
    NodeInfo,
    PodInfo,
    Rederived,
)

log = logging.getLogger(__name__)

# Bus ids of the eight GPUs of an HGX H100 board, for realistic-looking labels.
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

DeviceKey = tuple[str, int, int | None]
"""(node, GPU index, GPU instance id or None for a whole GPU)."""


@dataclass(frozen=True)
class Device:
    """A whole GPU or one MIG instance, labelled as dcgm-exporter labels it."""

    node: str
    gpu: int
    uuid: str
    pci_bus_id: str
    product: GPUProduct
    profile: str | None
    instance_id: int | None

    @property
    def key(self) -> DeviceKey:
        return (self.node, self.gpu, self.instance_id)

    @property
    def resource(self) -> str:
        return "nvidia.com/gpu" if self.profile is None else f"nvidia.com/mig-{self.profile}"


@functools.lru_cache(maxsize=65536)  # every device's, at every tick
def gpu_uuid(node: str, gpu: int) -> str:
    """Stable per node and index, so series keep their identity across emulator restarts."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{gpu}.gpusim')}"


def pci_bus_id(gpu: int) -> str:
    bus = _PCI_BUSES[gpu] if gpu < len(_PCI_BUSES) else 0xE0 + gpu
    return f"00000000:{bus:02X}:00.0"


def gpu_layouts(node: NodeInfo, product: GPUProduct, count: int) -> list[list[str]]:
    """MIG profiles of each GPU ([] for a whole GPU): the applied layout, else packed from
    allocatable.

    The label alone is not enough: it names the requested layout, applied only on `success`,
    and a new request can arrive before the state leaves `success`.
    """
    applied = _applied_layout(node, count)
    if applied is not None:
        return applied
    name = node.annotations.get(MIG_APPLIED_ANNOTATION)
    if name is None and node.labels.get(MIG_STATE_LABEL, "success") == "success":
        name = node.labels.get(MIG_CONFIG_LABEL)
    if name:
        layout = named_layout(product, name)
        if layout is not None:
            return [list(layout) for _ in range(count)]
    # Custom or in-flight layouts: what the node advertises is what the scheduler places on.
    whole = _int(node.allocatable.get("nvidia.com/gpu", "0"))
    wanted: list[str] = []
    for resource, value in node.allocatable.items():
        if resource.startswith("nvidia.com/mig-"):
            wanted += [resource.removeprefix("nvidia.com/mig-")] * _int(value)
    if not wanted or product.mig is None:
        return [[] for _ in range(count)]
    profiles = product.mig.profiles
    wanted.sort(key=lambda p: (-profiles[p].memory_slots, p) if p in profiles else (0, p))
    layouts: list[list[str]] = [[] for _ in range(count)]
    mig_gpus = range(min(whole, count), count)
    for profile in wanted:
        target = next(
            (g for g in mig_gpus if layout_is_valid(product, [*layouts[g], profile])), None
        )
        if target is None:
            log.warning("node %s: no room for a %s instance", node.name, profile)
        else:
            layouts[target].append(profile)
    return layouts


def _applied_layout(node: NodeInfo, count: int) -> list[list[str]] | None:
    """What the MIG manager emulator recorded it applied, GPU by GPU."""
    raw = node.annotations.get(MIG_LAYOUT_ANNOTATION)
    if not raw:
        return None
    try:
        layouts = [read_described(str(gpu)) for gpu in json.loads(raw)]
    except ValueError:
        log.warning("node %s: unreadable %s annotation", node.name, MIG_LAYOUT_ANNOTATION)
        return None
    if len(layouts) != count:
        return None
    return [list(gpu or ()) for gpu in layouts]


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


def node_devices(node: NodeInfo, catalog: Catalog) -> list[Device]:
    """Every GPU device of a GPU node (allocated or not); [] for nodes without a known GPU."""
    product = catalog.product_by_label(node.labels.get(PRODUCT_LABEL, ""))
    if product is None:
        return []
    count = _int(node.labels.get(COUNT_LABEL, node.allocatable.get("nvidia.com/gpu", "0")))
    devices: list[Device] = []
    for gpu, layout in enumerate(gpu_layouts(node, product, count)):
        common = (node.name, gpu, gpu_uuid(node.name, gpu), pci_bus_id(gpu), product)
        if not layout:
            devices.append(Device(*common, profile=None, instance_id=None))
        for position, profile in enumerate(layout, start=1):
            devices.append(Device(*common, profile=profile, instance_id=position))
    return devices


class Allocator:
    """Keeps each pod on the same devices for its whole life; never gives a device twice."""

    def __init__(self) -> None:
        self._assigned: dict[str, tuple[DeviceKey, ...]] = {}

    def update(self, pods: Sequence[PodInfo], devices: Iterable[Device]) -> dict[str, list[Device]]:
        by_key = {d.key: d for d in devices}
        live = {p.uid: p for p in pods if p.node and not p.terminating}
        self._assigned = {
            uid: keys
            for uid, keys in self._assigned.items()
            if uid in live and _still_fit(keys, live[uid], by_key)
        }
        taken = {k for keys in self._assigned.values() for k in keys}
        new = [p for p in live.values() if p.uid not in self._assigned]
        # free devices by node and resource, in device order: one pass over the devices, not
        # one per new pod (thousands of each while a benchmark creates its workloads)
        free: dict[tuple[str, str], list[DeviceKey]] = {}
        for device in by_key.values():
            if device.key not in taken:
                free.setdefault((device.node, device.resource), []).append(device.key)
        handed: dict[tuple[str, str], int] = {}
        for pod in sorted(new, key=lambda p: (p.running_since or float("inf"), p.uid)):
            pool = (pod.node or "", pod.resource)
            start = handed.get(pool, 0)
            chosen = free.get(pool, [])[start : start + pod.count]
            if len(chosen) < pod.count:
                log.warning(
                    "pod %s/%s: no free %s on %s", pod.namespace, pod.name, pod.resource, pod.node
                )
                continue
            handed[pool] = start + pod.count
            self._assigned[pod.uid] = tuple(chosen)
        return {uid: [by_key[k] for k in keys] for uid, keys in self._assigned.items()}


def _still_fit(
    keys: tuple[DeviceKey, ...], pod: PodInfo, by_key: Mapping[DeviceKey, Device]
) -> bool:
    """Whether a pod's devices still exist, on its node, as its resource."""
    for key in keys:
        device = by_key.get(key)
        if device is None or device.node != pod.node or device.resource != pod.resource:
            return False
    return True


class NodeDevices:
    """Every GPU device of every node, a node's derived again only when the node is another
    object (`Rederived`)."""

    def __init__(self, catalog: Catalog) -> None:
        self._per_node: Rederived[NodeInfo, list[Device]] = Rederived(
            lambda node: node_devices(node, catalog)
        )

    def of(self, nodes: Mapping[str, NodeInfo]) -> list[Device]:
        return [device for devices in self._per_node.of(nodes.items()) for device in devices]
