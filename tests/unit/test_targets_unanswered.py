"""A write the API server never answers is said as such, whatever urllib3 raised: a real
client against a port nothing listens on."""

from __future__ import annotations

import pytest
from gpusizer.actuate.target_view import SliceChange, TargetUnanswered
from gpusizer.actuate.targets import Targets
from gpusizer.api.v1alpha1 import TargetRef
from kubernetes import client as k8s

from tests.support import free_port

REF = TargetRef(apiVersion="apps/v1", kind="Deployment", name="chat")


@pytest.fixture
def targets() -> Targets:
    configuration = k8s.Configuration(host=f"https://127.0.0.1:{free_port()}")
    configuration.verify_ssl = False
    return Targets(k8s.ApiClient(configuration))


async def test_a_scale_the_api_server_never_answers_is_unanswered(targets: Targets) -> None:
    with pytest.raises(TargetUnanswered, match=r"scaling Deployment llm/chat to 3: the API"):
        await targets.write("llm", REF, 2, 3)


async def test_a_slice_change_the_api_server_never_answers_is_unanswered(
    targets: Targets,
) -> None:
    change = SliceChange(
        container="server",
        old_resource="nvidia.com/gpu",
        new_resource="nvidia.com/mig-3g.40gb",
        count=1,
        product_label="NVIDIA-H100-80GB-HBM3",
        replicas=2,
        annotations={},
    )
    with pytest.raises(TargetUnanswered, match="changing the slice of Deployment llm/chat"):
        await targets.reshape("llm", REF, change)
