"""The RightSized condition around a finished move: it must not drop to Unknown while the new
slice waits for its first measurement (users alert on it)."""

from __future__ import annotations

from typing import Any

import pytest
from gpusizer.actuate.target_view import TargetView
from gpusizer.api.annotations import RESHAPE_ANNOTATION, Placement, ReshapeRecord, ReshapeState
from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.catalog.loader import load_catalog
from gpusizer.cluster import ClusterView
from gpusizer.rightsizing import RightSizer, Sized
from gpusizer.signals.discovery import NodeInfo, OfferCache
from gpusizer.signals.parse import PodSamples, Sample
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.reader import HistoryCache
from gpusizer.vocabulary import ConditionType, Reason

from tests.fakes import FakeMetrics, FakeTargets

NOW = 1_800_000_000.0
H100 = "NVIDIA-H100-80GB-HBM3"
NAMESPACE = "llm"
SPEC = WorkloadSizingSpec.model_validate(
    {
        "targetRef": {"name": "small"},
        "replicas": {"min": 1, "max": 4, "targetGPUUtilization": 70},
        "rightSizing": {
            "mode": "Auto",
            "historySeconds": 60,
            "allowedSlices": ["gpu-h100", "mig-1g.10gb", "mig-2g.20gb", "mig-3g.40gb"],
        },
    }
)


def reshape_record(state: ReshapeState, to_slice: str, to_resource: str) -> ReshapeRecord:
    """The record a move from a whole H100 leaves on the Deployment."""
    return ReshapeRecord(
        state=state,
        origin=Placement(
            slice="gpu-h100",
            product="h100-80gb",
            resource="nvidia.com/gpu",
            product_label=H100,
            replicas=1,
        ),
        to=Placement(
            slice=to_slice,
            product="h100-80gb",
            resource=to_resource,
            product_label=H100,
            replicas=1,
        ),
        container="vllm",
        started="2027-01-15T07:59:00Z",
        deadline_seconds=600,
        message="1 pod(s) ready on the new slice",
    )


async def decide(
    record: ReshapeRecord, resource: str, node: NodeInfo, peak_mib: float | None
) -> Any:
    catalog = load_catalog()
    pod = PodInfo(
        namespace=NAMESPACE,
        name="small-new",
        labels={"app": "small"},
        node=node.name,
        ready=True,
        terminating=False,
        phase="Running",
        gpu_resource=resource,
        gpu_container="vllm",
        oom_kills=0,
        created=NOW - 20,
    )
    target = TargetView(
        replicas=1,
        selector="app=small",
        resource_version="7",
        annotations={RESHAPE_ANNOTATION: record.annotation()},
        pod_spec={
            "nodeSelector": {"nvidia.com/gpu.product": H100},
            "containers": [{"name": "vllm", "resources": {"limits": {resource: "1"}}}],
        },
    )
    # the history queries' answer: `peak_mib` for the pod, or no sample at all
    peak = {(NAMESPACE, pod.name): Sample(peak_mib, 0.0)} if peak_mib else {}
    metrics = FakeMetrics(answers={"peak_memory": PodSamples(samples=peak)})
    targets = FakeTargets({(NAMESPACE, "small"): target})
    sizer = RightSizer(catalog, HistoryCache(metrics, 60), OfferCache(catalog, 60), targets)
    cluster = ClusterView({NAMESPACE: [pod]}, {node.name: node})
    out = await sizer.size(SPEC, Sized(NAMESPACE, target, [pod], cluster), NOW, may_act=True)
    assert targets.reshapes == [], "nothing is to be moved"
    return out


MIG_NODE = NodeInfo("h100-mig-0", H100, {"nvidia.com/mig-2g.20gb": 8}, True)
WHOLE_NODE = NodeInfo("h100-0", H100, {"nvidia.com/gpu": 8}, True)


async def test_a_finished_move_stays_right_sized_until_the_new_slice_is_measured() -> None:
    record = reshape_record(ReshapeState.DONE, "mig-2g.20gb", "nvidia.com/mig-2g.20gb")
    out = await decide(record, "nvidia.com/mig-2g.20gb", MIG_NODE, peak_mib=None)
    assert out.condition.type == ConditionType.RIGHT_SIZED
    assert (out.condition.status, out.condition.reason) == (True, Reason.RIGHT_SIZED)
    # the very message the Reshaped cycle wrote, so the condition is not even rewritten
    moved = "now on mig-2g.20gb (h100-80gb): 1 pod(s) ready on the new slice"
    assert out.condition.message == moved
    assert out.recommendation is None  # the one that made the move stays in the status


async def test_once_measured_the_new_slice_is_judged_on_its_own_samples() -> None:
    record = reshape_record(ReshapeState.DONE, "mig-2g.20gb", "nvidia.com/mig-2g.20gb")
    out = await decide(record, "nvidia.com/mig-2g.20gb", MIG_NODE, peak_mib=12288)
    assert (out.condition.status, out.condition.reason) == (True, Reason.RIGHT_SIZED)
    assert out.condition.message.startswith("mig-2g.20gb is the cheapest fitting slice")
    assert out.recommendation is not None and out.recommendation.slice == "mig-2g.20gb"


@pytest.mark.parametrize(
    ("record", "resource", "node"),
    [
        # moved back to whole GPUs by hand after the move: the move no longer describes it
        (
            reshape_record(ReshapeState.DONE, "mig-2g.20gb", "nvidia.com/mig-2g.20gb"),
            "nvidia.com/gpu",
            WHOLE_NODE,
        ),
        (
            reshape_record(ReshapeState.ROLLED_BACK, "mig-2g.20gb", "nvidia.com/mig-2g.20gb"),
            "nvidia.com/gpu",
            WHOLE_NODE,
        ),
        # on the slice a rolled-back move aimed at (put there by hand): no move of ours stands
        (
            reshape_record(ReshapeState.ROLLED_BACK, "mig-2g.20gb", "nvidia.com/mig-2g.20gb"),
            "nvidia.com/mig-2g.20gb",
            MIG_NODE,
        ),
    ],
)
async def test_without_a_finished_move_to_it_an_unmeasured_slice_is_unknown(
    record: ReshapeRecord, resource: str, node: NodeInfo
) -> None:
    out = await decide(record, resource, node, peak_mib=None)
    assert (out.condition.status, out.condition.reason) == (None, Reason.NO_MEASUREMENT)
