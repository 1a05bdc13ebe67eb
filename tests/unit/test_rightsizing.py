"""The RightSized condition around a finished move: it must not drop to Unknown while the new
slice waits for its first measurement (users alert on it)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from gpusizer.actuate.targets import TargetView
from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.catalog.loader import load_catalog
from gpusizer.rightsizing import RESHAPE_ANNOTATION, RightSizingSettings, right_size
from gpusizer.signals.discovery import NodeInfo, OfferCache
from gpusizer.signals.history import HistoryCache
from gpusizer.signals.parse import PodSamples, Problem, Sample
from gpusizer.signals.pods import PodInfo
from gpusizer.vocabulary import ConditionType, Reason

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


def reshape_record(state: str, to_slice: str, to_resource: str) -> dict[str, Any]:
    """The annotation a move leaves on the Deployment, as `right_size` writes it."""
    return {
        "state": state,
        "from": {"slice": "gpu-h100", "product": "h100-80gb", "resource": "nvidia.com/gpu"},
        "to": {"slice": to_slice, "product": "h100-80gb", "resource": to_resource, "replicas": 1},
        "started": "2027-01-15T07:59:00Z",
        "message": "1 pod(s) ready on the new slice",
    }


class PrometheusAnswering:
    """The history queries' answer: `peak_mib` for the pod `pod`, or no sample at all."""

    def __init__(self, pod: str, peak_mib: float | None) -> None:
        self.pod, self.peak_mib = pod, peak_mib

    async def per_pod_batch(
        self, wanted: Mapping[str, Any]
    ) -> tuple[dict[str, PodSamples], dict[str, Problem]]:
        sample = {(NAMESPACE, self.pod): Sample(self.peak_mib, 0.0)} if self.peak_mib else {}
        return {"peak_memory": PodSamples(samples=sample)}, {}


class NoWrites:
    async def reshape(self, *args: Any) -> None:
        raise AssertionError("nothing is to be moved")


async def decide(
    record: dict[str, Any], resource: str, node: NodeInfo, peak_mib: float | None
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
        annotations={RESHAPE_ANNOTATION: json.dumps(record)},
        pod_spec={
            "nodeSelector": {"nvidia.com/gpu.product": H100},
            "containers": [{"name": "vllm", "resources": {"limits": {resource: "1"}}}],
        },
    )
    settings = RightSizingSettings(
        catalog=catalog,
        history=HistoryCache(PrometheusAnswering(pod.name, peak_mib), 60),  # type: ignore[arg-type]
        offers=OfferCache(catalog, 60),
    )
    return await right_size(
        SPEC,
        NAMESPACE,
        target,
        [pod],
        lambda: [pod],
        {node.name: node},
        settings,
        NoWrites(),  # type: ignore[arg-type]
        may_act=True,
        now=NOW,
    )


MIG_NODE = NodeInfo("h100-mig-0", H100, {"nvidia.com/mig-2g.20gb": 8}, True)
WHOLE_NODE = NodeInfo("h100-0", H100, {"nvidia.com/gpu": 8}, True)


async def test_a_finished_move_stays_right_sized_until_the_new_slice_is_measured() -> None:
    record = reshape_record("Done", "mig-2g.20gb", "nvidia.com/mig-2g.20gb")
    out = await decide(record, "nvidia.com/mig-2g.20gb", MIG_NODE, peak_mib=None)
    assert out.condition.type == ConditionType.RIGHT_SIZED
    assert (out.condition.status, out.condition.reason) == (True, Reason.RIGHT_SIZED)
    # the very message the Reshaped cycle wrote, so the condition is not even rewritten
    moved = "now on mig-2g.20gb (h100-80gb): 1 pod(s) ready on the new slice"
    assert out.condition.message == moved
    assert out.recommendation is None  # the one that made the move stays in the status


async def test_once_measured_the_new_slice_is_judged_on_its_own_samples() -> None:
    record = reshape_record("Done", "mig-2g.20gb", "nvidia.com/mig-2g.20gb")
    out = await decide(record, "nvidia.com/mig-2g.20gb", MIG_NODE, peak_mib=12288)
    assert (out.condition.status, out.condition.reason) == (True, Reason.RIGHT_SIZED)
    assert out.condition.message.startswith("mig-2g.20gb is the cheapest fitting slice")
    assert out.recommendation is not None and out.recommendation["slice"] == "mig-2g.20gb"


@pytest.mark.parametrize(
    ("record", "resource", "node"),
    [
        # moved back to whole GPUs by hand after the move: the move no longer describes it
        (
            reshape_record("Done", "mig-2g.20gb", "nvidia.com/mig-2g.20gb"),
            "nvidia.com/gpu",
            WHOLE_NODE,
        ),
        (
            reshape_record("RolledBack", "mig-2g.20gb", "nvidia.com/mig-2g.20gb"),
            "nvidia.com/gpu",
            WHOLE_NODE,
        ),
        # on the slice a rolled-back move aimed at (put there by hand): no move of ours stands
        (
            reshape_record("RolledBack", "mig-2g.20gb", "nvidia.com/mig-2g.20gb"),
            "nvidia.com/mig-2g.20gb",
            MIG_NODE,
        ),
    ],
)
async def test_without_a_finished_move_to_it_an_unmeasured_slice_is_unknown(
    record: dict[str, Any], resource: str, node: NodeInfo
) -> None:
    out = await decide(record, resource, node, peak_mib=None)
    assert (out.condition.status, out.condition.reason) == (None, Reason.NO_MEASUREMENT)
