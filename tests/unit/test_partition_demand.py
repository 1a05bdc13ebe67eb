"""The fleet's demand for slices, from the objects the watches hand over."""

from __future__ import annotations

from typing import Any

from gpusizer.catalog import load_catalog
from gpusizer.partition.demand import Demand, fleet_demand
from gpusizer.partition.objects import gpu_node, gpu_pod, sizing_demand
from gpusizer.policy.partitioning import WHOLE
from gpusizer.signals.pods import pod_info

CATALOG = load_catalog()
H100 = "NVIDIA-H100-80GB-HBM3"
NODES = {"h-0": "h100-80gb", "h-1": "h100-80gb"}


def pod_body(
    name: str,
    node: str | None,
    resource: str = "nvidia.com/gpu",
    count: int = 1,
    product: str | None = H100,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "llm"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: dict[str, Any] = {
        "containers": [{"name": "vllm", "resources": {"limits": {resource: str(count)}}}]
    }
    if node:
        spec["nodeName"] = node
    if product:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": product}
    return {
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def sizing_body(
    reason: str = "NoFreeCapacity", mode: str = "Auto", replicas: int | None = 2
) -> dict[str, Any]:
    return {
        "metadata": {"name": "chat", "namespace": "llm"},
        "spec": {
            "targetRef": {"kind": "Deployment", "name": "chat"},
            "rightSizing": {"mode": mode},
            "scaleToZero": {"enabled": True},
            "replicas": {"min": 0, "max": 4},
        },
        "status": {
            "currentReplicas": replicas,
            "recommendation": {
                "slice": "mig-2g.20gb",
                "resource": "nvidia.com/mig-2g.20gb",
                "nodeSelector": {"nvidia.com/gpu.product": H100},
                "replicas": 3,
            },
            "conditions": [{"type": "RightSized", "status": "False", "reason": reason}],
        },
    }


TEMPLATE = {
    "nodeSelector": {"nvidia.com/gpu.product": H100},
    "containers": [{"name": "vllm", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}],
}


def demand(pods: list[dict[str, Any]], sizings: tuple[dict[str, Any], ...] = ()) -> Demand:
    parsed = [p for p in (gpu_pod(b, pod_info(b)) for b in pods) if p is not None]
    wanted = [s for s in (sizing_demand(b) for b in sizings) if s is not None]
    return fleet_demand(
        CATALOG, NODES, parsed, wanted, lambda ns, kind, name: TEMPLATE if name == "chat" else None
    )


def test_running_and_pending_gpu_pods_count_terminating_ones_do_not() -> None:
    found = demand(
        [
            pod_body("a", "h-0", count=2),
            pod_body("b", "h-1", "nvidia.com/mig-1g.10gb"),
            pod_body("c", None, "nvidia.com/mig-3g.40gb"),
            pod_body("d", "h-0", deleting=True),
            pod_body("elsewhere", "l4-0"),
        ]
    )
    assert dict(found.counts) == {
        ("h100-80gb", WHOLE): 2,
        ("h100-80gb", "1g.10gb"): 1,
        ("h100-80gb", "3g.40gb"): 1,
    }


def test_a_pending_pod_for_another_product_is_not_ours() -> None:
    found = demand([pod_body("l4", None, product="NVIDIA-L4")])
    assert not found.counts and not found.skipped


def test_a_pending_pod_without_a_product_counts_when_one_product_can_hold_it() -> None:
    found = demand([pod_body("x", None, "nvidia.com/mig-1g.20gb", product=None)])
    assert dict(found.counts) == {("h100-80gb", "1g.20gb"): 1}


def test_a_blocked_recommendation_and_a_workload_at_zero_are_demand() -> None:
    found = demand([], (sizing_body(replicas=0),))
    assert dict(found.counts) == {("h100-80gb", "2g.20gb"): 3, ("h100-80gb", "3g.40gb"): 1}


def test_advice_its_template_already_follows_counts_as_pods_not_twice() -> None:
    moved = {
        "nodeSelector": {"nvidia.com/gpu.product": H100},
        "containers": [{"name": "vllm", "resources": {"limits": {"nvidia.com/mig-2g.20gb": 1}}}],
    }
    wanted = [s for s in [sizing_demand(sizing_body())] if s is not None]
    found = fleet_demand(CATALOG, NODES, [], wanted, lambda ns, kind, name: moved)
    assert not found.counts


def test_only_recommendations_waiting_for_capacity_in_auto_count() -> None:
    assert sizing_demand(sizing_body("CheaperSlice")) is None
    assert sizing_demand(sizing_body(mode="Recommend")) is None


def test_a_node_keeps_what_the_partitioner_reads() -> None:
    node = gpu_node(
        {
            "metadata": {
                "name": "h-0",
                "labels": {"nvidia.com/mig.config": "all-balanced"},
                "annotations": {"gpusizer.io/repartition": "{}", "other": "x"},
            },
            "spec": {"unschedulable": True},
        }
    )
    assert (node.mig_config, node.record, node.failure, node.unschedulable) == (
        "all-balanced",
        "{}",
        None,
        True,
    )
    assert node.selected_by({"nvidia.com/mig.config": "all-balanced"})
    assert not node.selected_by({})
    cpu = {"metadata": {"name": "cpu"}, "spec": {"containers": [{"name": "x"}]}}
    assert gpu_pod(cpu, pod_info(cpu)) is None
