"""What the partitioner keeps of the cluster's objects (nodes, GPU pods, WorkloadSizings), as
its watches hand them over, and the errors of its I/O edge. Pure."""

from __future__ import annotations

import sys
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusizer.api.partitioning import REPARTITION_ANNOTATION, REPARTITION_FAILURE_ANNOTATION
from gpusizer.catalog.models import PRODUCT_LABEL
from gpusizer.signals.pods import PodInfo
from gpusizer.vocabulary import ConditionType, Reason

MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"


class PartitionProblem(Exception):
    """A node, pod or ConfigMap request the API server refused or did not answer; the message
    is one line for the status."""


@dataclass(frozen=True)
class ConfigMapRef:
    """The ConfigMap mig-manager reads its mig-parted configs from (the GPU Operator's
    ClusterPolicy `migManager.config.name`)."""

    namespace: str
    name: str

    @classmethod
    def parse(cls, value: str) -> ConfigMapRef:
        namespace, sep, name = value.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise ValueError(f"expected NAMESPACE/NAME for the mig-parted ConfigMap, not {value!r}")
        return cls(namespace, name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class GpuNode:
    name: str
    labels: Mapping[str, str]
    unschedulable: bool
    record: str | None = None  # the REPARTITION_ANNOTATION, as written
    failure: str | None = None  # the REPARTITION_FAILURE_ANNOTATION, as written

    def selected_by(self, selector: Mapping[str, str]) -> bool:
        return bool(selector) and all(self.labels.get(k) == v for k, v in selector.items())

    @property
    def product_label(self) -> str | None:
        return self.labels.get(PRODUCT_LABEL)

    @property
    def mig_config(self) -> str | None:
        return self.labels.get(MIG_CONFIG_LABEL)

    @property
    def mig_state(self) -> str | None:
        return self.labels.get(MIG_STATE_LABEL)


def gpu_node(node: Mapping[str, Any]) -> GpuNode:
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return GpuNode(
        name=str(meta.get("name") or ""),
        labels=dict(meta.get("labels") or {}),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable", False)),
        record=annotations.get(REPARTITION_ANNOTATION),
        failure=annotations.get(REPARTITION_FAILURE_ANNOTATION),
    )


@dataclass(frozen=True, slots=True)
class GpuPod:
    namespace: str
    name: str
    node: str | None
    resource: str
    count: int
    terminating: bool
    product_label: str | None  # from its node selector, when it has one
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def gpu_pod(pod: Mapping[str, Any], info: PodInfo) -> GpuPod | None:
    """A pod holding (or asking for) GPU resources, with `info` its pod_info; None for any
    other pod."""
    if info.gpu_resource is None:
        return None
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    product = selector.get(PRODUCT_LABEL)
    return GpuPod(
        namespace=info.namespace,
        name=info.name,
        node=info.node,
        resource=info.gpu_resource,
        count=info.gpu_count,
        terminating=info.terminating or info.phase in ("Succeeded", "Failed"),
        product_label=sys.intern(product) if isinstance(product, str) else None,
        uid=info.uid,
    )


def present_pods(index: Mapping[str, Iterable[GpuPod]], gone: Container[str]) -> list[GpuPod]:
    """The GPU pods of the watch's cache the API server still has (`sweep.PodSweep`): a pod a
    watch missed deleting would hold its slice in every layout, and hide the pod of the same
    name that replaced it."""
    return [p for pods in index.values() for p in pods if p.uid not in gone]


@dataclass(frozen=True)
class SizingDemand:
    """What a WorkloadSizing asks of the layouts beyond its running pods: the slices right-sizing
    would move it to but cannot find free, and the replicas it wakes to from zero."""

    namespace: str
    name: str
    target_kind: str
    target_name: str
    blocked: tuple[str, str, int] | None  # (resource, product label, replicas)
    waking: int | None  # replicas it wakes to, at zero now


def sizing_demand(body: Mapping[str, Any]) -> SizingDemand | None:
    """None for a WorkloadSizing that asks nothing of the layouts."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    target = spec.get("targetRef") or {}
    if not target.get("name"):
        return None
    blocked = waking = None
    right_sizing = spec.get("rightSizing") or {}
    recommendation = status.get("recommendation") or {}
    if right_sizing.get("mode") == "Auto" and _blocked(status):
        resource = recommendation.get("resource")
        product = (recommendation.get("nodeSelector") or {}).get(PRODUCT_LABEL)
        replicas = recommendation.get("replicas")
        if isinstance(resource, str) and isinstance(product, str) and isinstance(replicas, int):
            blocked = (resource, product, replicas)
    scale_to_zero = spec.get("scaleToZero") or {}
    if scale_to_zero.get("enabled") and status.get("currentReplicas") == 0:
        minimum = (spec.get("replicas") or {}).get("min") or 0
        waking = max(1, minimum) if isinstance(minimum, int) else 1
    if blocked is None and waking is None:
        return None
    return SizingDemand(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name")),
        target_kind=str(target.get("kind") or "Deployment"),
        target_name=str(target["name"]),
        blocked=blocked,
        waking=waking,
    )


def _blocked(status: Mapping[str, Any]) -> bool:
    return any(
        isinstance(c, Mapping)
        and c.get("type") == ConditionType.RIGHT_SIZED.value
        and c.get("reason") == Reason.NO_FREE_CAPACITY.value
        for c in status.get("conditions") or []
    )
