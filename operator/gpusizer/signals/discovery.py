"""What the cluster offers: GPU slices per node from GPU Feature Discovery labels and
allocatable resources, and how many units are free after the pods already placed. A node whose
MIG layout can change (MIG-capable, mixed strategy) also offers, with nothing free, every
profile its GPU has: a slice a re-partition can make is one right-sizing may ask for
(`NoFreeCapacity`), which a GPUPartitioning counts as demand.

Pure: computed from the watches' nodes and pods, at the time the caller passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusizer.catalog import Catalog, Slice
from gpusizer.catalog.models import PRODUCT_LABEL
from gpusizer.policy.slices import Offer
from gpusizer.signals.pods import GPU_RESOURCE_PREFIX, PodInfo


@dataclass(frozen=True)
class NodeInfo:
    name: str
    product_label: str | None
    allocatable: Mapping[str, int]  # GPU resources only
    schedulable: bool
    repartitionable: bool = False  # MIG-capable, mixed strategy: any profile can be made


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return NodeInfo(
        name=str(meta.get("name") or ""),
        product_label=labels.get(PRODUCT_LABEL),
        allocatable={
            k: _quantity(v) for k, v in allocatable.items() if k.startswith(GPU_RESOURCE_PREFIX)
        },
        schedulable=not (node.get("spec") or {}).get("unschedulable", False),
        repartitionable=labels.get("nvidia.com/mig.capable") == "true"
        and labels.get("nvidia.com/mig.strategy") == "mixed",
    )


def offers(catalog: Catalog, nodes: Iterable[NodeInfo], pods: Iterable[PodInfo]) -> list[Offer]:
    """Every slice some schedulable node has, with its free units cluster-wide."""
    used: dict[tuple[str, str], int] = {}
    for pod in pods:
        if (
            pod.node
            and pod.gpu_resource
            and not pod.terminating
            and pod.phase
            in (
                "Pending",
                "Running",
            )
        ):
            key = (pod.node, pod.gpu_resource)
            used[key] = used.get(key, 0) + pod.gpu_count
    free: dict[Slice, int] = {}
    for node in nodes:
        if not node.product_label or not node.schedulable:
            continue
        product = catalog.product_by_label(node.product_label)
        if node.repartitionable and product is not None:
            for possible in catalog.slices():
                if possible.profile is not None and possible.product.key == product.key:
                    free.setdefault(possible, 0)
        for resource, count in node.allocatable.items():
            slice_ = catalog.slice_for(resource, node.product_label)
            if slice_ is None or count <= 0:
                continue
            available = max(0, count - used.get((node.name, resource), 0))
            free[slice_] = free.get(slice_, 0) + available
    return [Offer(s, n) for s, n in free.items()]


class OfferCache:
    """Offers computed at most once per `ttl_seconds`: the cost is one pass over all pods,
    which must not be paid again for every workload of a cycle."""

    def __init__(self, catalog: Catalog, ttl_seconds: float) -> None:
        self._catalog = catalog
        self._ttl = ttl_seconds
        self._latest: tuple[float, list[Offer]] | None = None

    def get(
        self,
        nodes: Iterable[NodeInfo],
        pods: Callable[[], Iterable[PodInfo]],
        now: float,
    ) -> list[Offer]:
        if self._latest is None or now - self._latest[0] >= self._ttl:
            self._latest = (now, offers(self._catalog, nodes, pods()))
        return self._latest[1]
