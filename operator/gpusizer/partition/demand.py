"""The slices the fleet needs on the selected nodes: running GPU pods' slices, pending GPU pods'
(the slices they wait for), the slices WorkloadSizings' recommendations wait for
(`NoFreeCapacity`) and those of workloads at zero when they wake. Pure.

The sources add up rather than replace each other: a workload waiting to move to a smaller
slice keeps its running pods until the new ones are ready, so the layouts must hold both
meanwhile. Once its template asks for the new slice, its new pods stand for the advice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpusizer.catalog import Catalog
from gpusizer.catalog.models import PRODUCT_LABEL
from gpusizer.partition.objects import GpuPod, SizingDemand
from gpusizer.policy.partitioning import WHOLE, SliceKey
from gpusizer.signals.pods import MIG_RESOURCE_PREFIX, WHOLE_GPU_RESOURCE

TemplateLookup = Callable[[str, str, str], Mapping[str, Any] | None]
"""(namespace, kind, name) -> the target's pod template spec, when the watch has it."""


@dataclass
class Demand:
    counts: Counter[SliceKey] = field(default_factory=Counter)
    running: Counter[SliceKey] = field(default_factory=Counter)  # the part running pods hold
    skipped: list[str] = field(default_factory=list)  # what could not be counted, and why

    def add(self, key: SliceKey, n: int) -> None:
        if n > 0:
            self.counts[key] += n


def slice_kind(resource: str) -> str | None:
    if resource == WHOLE_GPU_RESOURCE:
        return WHOLE
    if resource.startswith(MIG_RESOURCE_PREFIX):
        return resource.removeprefix(MIG_RESOURCE_PREFIX)
    return None


class _Products:
    """The selected nodes' products, and which of them a slice request means."""

    def __init__(self, catalog: Catalog, products: Collection[str]) -> None:
        self.catalog = catalog
        self.keys = sorted(products)

    def holding(self, kind: str, product_label: str | None) -> tuple[str | None, str | None]:
        """(product key, None) for the selected product a request lands on; (None, why) when
        that is not known; (None, None) when the request is for nodes not selected."""
        if product_label:
            product = self.catalog.product_by_label(product_label)
            if product is None or product.key not in self.keys:
                return None, None
            return product.key, None
        able = [
            key
            for key in self.keys
            if kind == WHOLE
            or ((mig := self.catalog.products[key].mig) is not None and kind in mig.profiles)
        ]
        if len(able) == 1:
            return able[0], None
        if not able:
            return None, None
        return None, f"could be any of {', '.join(able)}: no {PRODUCT_LABEL} node selector"


def fleet_demand(
    catalog: Catalog,
    node_products: Mapping[str, str],
    pods: Iterable[GpuPod],
    sizings: Iterable[SizingDemand],
    template: TemplateLookup,
) -> Demand:
    """Demand on the nodes of `node_products` (node name -> product key)."""
    products = _Products(catalog, set(node_products.values()))
    demand = Demand()

    def ask(kind: str | None, label: str | None, n: int, who: str) -> None:
        if kind is None:
            return
        key, why = products.holding(kind, label)
        if key is not None:
            demand.add((key, kind), n)
        elif why is not None:
            demand.skipped.append(f"{who}: {why}")

    for pod in pods:
        if pod.terminating:
            continue
        kind = slice_kind(pod.resource)
        if pod.node is None:
            ask(kind, pod.product_label, pod.count, f"pending pod {pod.key}")
        elif pod.node in node_products and kind is not None:
            demand.add((node_products[pod.node], kind), pod.count)
            demand.running[(node_products[pod.node], kind)] += pod.count
    for sizing in sizings:
        who = f"WorkloadSizing {sizing.namespace}/{sizing.name}"
        spec = template(sizing.namespace, sizing.target_kind, sizing.target_name)
        found = _template_slice(spec) if spec is not None else None
        if sizing.blocked is not None:
            resource, product_label, replicas = sizing.blocked
            # once its template asks for the slice, its pods are the demand, not the advice
            if found is None or found[0] != resource:
                ask(slice_kind(resource), product_label, replicas, who)
        if sizing.waking is not None and found is not None:
            resource, count, template_label = found
            ask(slice_kind(resource), template_label, count * sizing.waking, who)
    return demand


def _template_slice(spec: Mapping[str, Any]) -> tuple[str, int, str | None] | None:
    """(resource, units per pod, product label) of a pod template's GPU container."""
    label = (spec.get("nodeSelector") or {}).get(PRODUCT_LABEL)
    for container in spec.get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        for resource, amount in limits.items():
            if slice_kind(str(resource)) is not None:
                try:
                    count = max(1, int(str(amount)))
                except ValueError:
                    count = 1
                return str(resource), count, label
    return None
