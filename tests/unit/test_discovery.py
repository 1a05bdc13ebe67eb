"""What the cluster offers right-sizing: the slices nodes have free, and on a node a
re-partition can change, every profile its GPU has (none free yet)."""

from __future__ import annotations

from gpusizer.api.v1alpha1 import RightSizingSpec
from gpusizer.catalog import load_catalog
from gpusizer.policy.slices import Usage, choose_slice
from gpusizer.signals.discovery import node_info, offers
from gpusizer.signals.pods import PodInfo
from gpusizer.vocabulary import Reason

CATALOG = load_catalog()
H100 = "NVIDIA-H100-80GB-HBM3"


def whole_h100_node(strategy: str, unschedulable: bool = False) -> dict[str, object]:
    return {
        "metadata": {
            "name": "gpu-a",
            "labels": {
                "nvidia.com/gpu.product": H100,
                "nvidia.com/mig.capable": "true",
                "nvidia.com/mig.strategy": strategy,
            },
        },
        "spec": {"unschedulable": unschedulable},
        "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "96"}},
    }


def pod_on(node: str) -> PodInfo:
    return PodInfo("llm", "chat-0", {}, node, True, False, "Running", "nvidia.com/gpu", "vllm", 0)


def free(strategy: str, unschedulable: bool = False) -> dict[str, int]:
    node = node_info(whole_h100_node(strategy, unschedulable))
    return {o.slice.name: o.free for o in offers(CATALOG, [node], [pod_on("gpu-a")])}


def test_a_node_in_mixed_strategy_offers_every_profile_with_none_free() -> None:
    found = free("mixed")
    assert found["gpu-h100"] == 7
    assert {k: v for k, v in found.items() if k != "gpu-h100"} == {
        f"mig-{p}": 0
        for p in CATALOG.products["h100-80gb"].mig.profiles  # type: ignore[union-attr]
    }


def test_other_nodes_offer_only_what_they_have() -> None:
    assert free("single") == {"gpu-h100": 7}
    assert free("none") == {"gpu-h100": 7}
    assert free("mixed", unschedulable=True) == {}


def test_a_smaller_slice_a_re_partition_could_make_is_no_free_capacity() -> None:
    node = node_info(whole_h100_node("mixed"))
    h100 = CATALOG.slice("gpu-h100", "h100-80gb")
    assert h100 is not None
    usage = Usage(
        peak_memory_mib=12288,
        mean_utilization=5,
        served_rps=1,
        replicas=1,
        oom_kills=0,
        coverage=1.0,
    )
    choice = choose_slice(
        h100,
        usage,
        offers(CATALOG, [node], [pod_on("gpu-a")]),
        RightSizingSpec(allowed_slices=["gpu-h100", "mig-1g.20gb"]),
        target_utilization=70,
        min_replicas=1,
        now=0,
    )
    assert choice.reason == Reason.NO_FREE_CAPACITY
    assert choice.recommended is not None and choice.recommended.slice.name == "mig-1g.20gb"
