"""An in-memory ClusterSource for tests, and builders for GPU nodes and pods."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gpusizer.catalog import Catalog, resources_for_layout

from e2e.gpusim.cluster import (
    COUNT_LABEL,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    PRODUCT_LABEL,
    ClusterSnapshot,
    NodeInfo,
    PodInfo,
)


class FakeClusterSource:
    """Pods and nodes in dicts; patches change them the way the API server would."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeInfo] = {}
        self.pods: dict[str, PodInfo] = {}
        self.readied: list[str] = []
        self.oom_kills: list[tuple[str, float]] = []

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(pods=list(self.pods.values()), nodes=dict(self.nodes))

    def mark_ready(self, pod: PodInfo) -> None:
        self.readied.append(pod.name)
        self.pods[pod.uid] = dataclasses.replace(self.pods[pod.uid], ready=True)

    def record_oom(self, pod: PodInfo, at: float) -> None:
        self.oom_kills.append((pod.name, at))
        self.record_restart(pod, at)

    def record_restart(self, pod: PodInfo, at: float) -> None:
        current = self.pods[pod.uid]
        self.pods[pod.uid] = dataclasses.replace(
            current, restart_count=current.restart_count + 1, running_since=at, ready=False
        )

    def add_pod(self, pod: PodInfo) -> PodInfo:
        self.pods[pod.uid] = pod
        return pod


def gpu_node(
    catalog: Catalog, name: str, product: str, count: int, layout: str = "all-disabled"
) -> NodeInfo:
    """A node as the local cluster creates it: GFD labels plus the layout's allocatable."""
    gpu = catalog.products[product]
    labels = {
        PRODUCT_LABEL: gpu.gfd_label,
        COUNT_LABEL: str(count),
        "nvidia.com/gpu.memory": str(gpu.memory_mib),
        "nvidia.com/gpu.family": gpu.family,
        MIG_CONFIG_LABEL: layout,
        MIG_STATE_LABEL: "success",
    }
    allocatable = {k: str(v) for k, v in resources_for_layout(gpu, layout, count).items()}
    return NodeInfo(name=name, labels=labels, allocatable=allocatable)


def gpu_pod(
    name: str,
    node: str | None,
    resource: str = "nvidia.com/gpu",
    *,
    workload: str = "chat",
    namespace: str = "llm",
    count: int = 1,
    running_since: float | None = 0.0,
    annotations: Mapping[str, str] | None = None,
    terminating: bool = False,
) -> PodInfo:
    return PodInfo(
        uid=f"uid-{namespace}-{name}",
        namespace=namespace,
        name=name,
        node=node,
        workload=(namespace, workload),
        container="vllm",
        resource=resource,
        count=count,
        running_since=running_since,
        ready=False,
        restart_count=0,
        terminating=terminating,
        annotations=dict(annotations or {}),
    )
