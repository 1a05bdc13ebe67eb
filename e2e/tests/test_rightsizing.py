"""Right-sizing on the local cluster: measured use picks the slice; Auto moves the workload."""

from __future__ import annotations

import json
from typing import Any

from e2e.tests.conftest import Cluster, wait_until
from e2e.tests.operator_support import Operator, Workloads, recommend, sizing_spec

H100_FAMILY = ["gpu-h100", "mig-1g.10gb", "mig-2g.20gb", "mig-3g.40gb"]


def right_sizing(name: str, mode: str = "Auto") -> dict[str, Any]:
    return sizing_spec(
        name,
        replicas={"min": 1, "max": 4},
        rightSizing={
            "mode": mode,
            "historySeconds": 60,
            "allowedSlices": H100_FAMILY,
            "minSavingsPercent": 15,
        },
    )


def limits(workloads: Workloads, name: str) -> dict[str, Any]:
    dep = workloads.template(name)
    container = dep["spec"]["template"]["spec"]["containers"][0]
    return dict(container["resources"]["limits"])


def node_of(cluster: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    return dict(cluster.kubectl_json("get", "node", pod["spec"]["nodeName"]))


def test_whole_h100_at_low_load_moves_to_a_small_mig_slice(
    operator: Operator, workloads: Workloads, cluster: Cluster
) -> None:
    # 12 GiB model on two whole H100s at 1 req/s: 5 % busy each
    workloads.deployment("small", replicas=2, memory_mib=12288, capacity_rps=10)
    workloads.load("small", 1)
    assert workloads.sizing("small", right_sizing("small")).returncode == 0

    moved = workloads.wait_condition("small", "RightSized", "True", "RightSized", timeout=240)
    assert "mig-2g.20gb" in moved["message"], moved
    assert limits(workloads, "small") == {"nvidia.com/mig-2g.20gb": "1"}
    dep = workloads.template("small")
    previous = json.loads(dep["metadata"]["annotations"]["gpusizer.io/previous-slice"])
    # the replica policy may already have taken it from 2 to 1 at 5 % busy
    assert previous["resource"] == "nvidia.com/gpu" and previous["slice"] == "gpu-h100"
    assert dep["spec"]["replicas"] == 1

    def on_mig_nodes() -> bool:
        pods = [p for p in workloads.pods("small") if p["spec"].get("nodeName")]
        return bool(pods) and all(
            node_of(cluster, p)["metadata"]["labels"].get("nvidia.com/mig.strategy") == "mixed"
            for p in pods
        )

    wait_until(on_mig_nodes, 60, what="pods on the MIG nodes")
    recommendation = workloads.status("small")["recommendation"]
    assert recommendation["currentCostPerHour"] >= recommendation["costPerHour"]
    reasons = workloads.event_reasons("small")
    assert "ReshapeStarted" in reasons and "Reshaped" in reasons


def test_out_of_memory_on_a_small_slice_moves_up(operator: Operator, workloads: Workloads) -> None:
    workloads.deployment(
        "cramped",
        replicas=1,
        resource="nvidia.com/mig-1g.10gb",
        memory_mib=15000,
        startup_seconds=1,
    )
    workloads.load("cramped", 1)
    assert workloads.sizing("cramped", right_sizing("cramped")).returncode == 0
    workloads.wait_condition("cramped", "RightSized", "True", "RightSized", timeout=240)
    assert limits(workloads, "cramped") == {"nvidia.com/mig-2g.20gb": "1"}
    wait_until(lambda: workloads.ready("cramped") >= 1, 60, what="a ready replica on 2g.20gb")


def test_no_free_capacity_for_the_better_slice_moves_nothing(
    operator: Operator, workloads: Workloads
) -> None:
    # every 3g.40gb of the two all-balanced nodes is taken
    workloads.deployment("filler", replicas=16, resource="nvidia.com/mig-3g.40gb", memory_mib=1000)
    wait_until(
        lambda: sum(1 for p in workloads.pods("filler") if p["spec"].get("nodeName")) == 16,
        90,
        what="16 filler pods placed",
    )
    try:
        # 30 GiB does not fit a 2g.20gb; 3g.40gb would, but none is free
        workloads.deployment("big", replicas=1, memory_mib=30720)
        workloads.load("big", 0.5)
        assert workloads.sizing("big", right_sizing("big")).returncode == 0
        condition = workloads.wait_condition(
            "big", "RightSized", "False", "NoFreeCapacity", timeout=180
        )
        assert "mig-3g.40gb" in condition["message"] and "free" in condition["message"]
        assert limits(workloads, "big") == {"nvidia.com/gpu": "1"}
    finally:
        workloads.cluster.kubectl("delete", "deployment", "filler", "-n", workloads.namespace)


def test_recommend_reports_the_fleet(workloads: Workloads, cluster: Cluster) -> None:
    workloads.deployment("h100-small", replicas=2, memory_mib=12288)
    workloads.deployment(
        "oom", replicas=1, resource="nvidia.com/mig-1g.10gb", memory_mib=15000, startup_seconds=1
    )
    workloads.load("h100-small", 1)
    workloads.load("oom", 1)

    def report() -> dict[str, Any] | None:
        result = recommend(cluster, 60, "--format", "json", check=True, timeout=120)
        rows = {
            r["name"]: r
            for r in json.loads(result.stdout)["workloads"]
            if r["namespace"] == workloads.namespace
        }
        small, oom = rows.get("h100-small"), rows.get("oom")
        # a pod counts once Prometheus has scraped it: the second may start a scrape later
        if (
            small
            and oom
            and small["peak_memory_mib"]
            and small["mean_utilization"] is not None
            and small["replicas"] >= 2
        ):
            return rows
        return None

    rows = wait_until(report, 120, what="measured rows for both workloads, both replicas of one")
    small, oom = rows["h100-small"], rows["oom"]
    assert small["current_slice"] == "gpu-h100" and small["replicas"] == 2, small
    assert abs(small["peak_memory_mib"] - 12288) < 1, small
    assert small["cost_per_month_now"] == 2 * 3.00 * 730, small
    assert small["recommended_slice"] not in (None, "gpu-h100"), small
    assert small["cost_per_month_after"] < small["cost_per_month_now"], small
    assert oom["current_slice"] == "mig-1g.10gb", oom
    assert oom["recommended_slice"] not in (None, "mig-1g.10gb"), oom
    assert "OOM" in oom["reason"], oom
