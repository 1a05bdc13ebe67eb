"""The MIG manager emulator's state machine against an in-memory node client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from gpusizer.catalog import load_catalog

from e2e.gpusim.cluster import HOST_CLIENTS_ANNOTATION, MIG_CONFIG_LABEL, MIG_STATE_LABEL, NodeInfo
from e2e.gpusim.devices import gpu_layouts
from e2e.gpusim.migmanager import APPLIED_ANNOTATION, MigManager, MigTiming
from e2e.gpusim.testing import gpu_node


class FakeNodes:
    def __init__(self, node: NodeInfo) -> None:
        self.node = NodeInfo(node.name, dict(node.labels), dict(node.allocatable), {})
        self.busy: list[str] = []
        self.events: list[tuple[str, str]] = []
        self.configs: dict[tuple[str, str], str] = {}

    def nodes(self) -> Sequence[NodeInfo]:
        return [self.node]

    def gpu_pods(self, node: str) -> list[str]:
        return list(self.busy)

    def patch_metadata(
        self, node: str, labels: Mapping[str, str | None], annotations: Mapping[str, str | None]
    ) -> None:
        self.node = NodeInfo(
            node,
            _merge(self.node.labels, labels),
            self.node.allocatable,
            _merge(self.node.annotations, annotations),
        )

    def patch_resources(self, node: str, resources: Mapping[str, int | None]) -> None:
        values = {k: None if v is None else str(v) for k, v in resources.items()}
        self.node = NodeInfo(
            node, self.node.labels, _merge(self.node.allocatable, values), self.node.annotations
        )

    def warn(self, node: str, reason: str, message: str) -> None:
        self.events.append((reason, message))

    def read_config(self, namespace: str, name: str) -> str | None:
        return self.configs.get((namespace, name))

    def relabel(self, layout: str) -> None:
        self.patch_metadata(self.node.name, {MIG_CONFIG_LABEL: layout}, {})


def _merge(base: Mapping[str, str], patch: Mapping[str, str | None]) -> dict[str, str]:
    merged = dict(base)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


@pytest.fixture
def nodes() -> FakeNodes:
    catalog = load_catalog()
    return FakeNodes(gpu_node(catalog, "gpu-a", "h100-80gb", 8))


@pytest.fixture
def manager(nodes: FakeNodes) -> MigManager:
    # 2 s per node and 1 s per GPU: 10 s when all 8 GPUs change
    return MigManager(nodes, load_catalog(), MigTiming(per_node=2, per_gpu=1), "gpu-operator/mig")


def test_adopts_a_consistent_node_without_waiting(nodes: FakeNodes, manager: MigManager) -> None:
    manager.step(0)
    assert nodes.node.labels[MIG_STATE_LABEL] == "success"
    assert nodes.node.annotations[APPLIED_ANNOTATION] == "all-disabled"
    assert nodes.node.allocatable == {"nvidia.com/gpu": "8"}


def test_reconfigures_after_the_delay(nodes: FakeNodes, manager: MigManager) -> None:
    manager.step(0)
    nodes.relabel("all-balanced")
    manager.step(1)
    assert nodes.node.labels[MIG_STATE_LABEL] == "pending"
    manager.step(10)
    assert nodes.node.labels[MIG_STATE_LABEL] == "pending"
    assert nodes.node.allocatable == {"nvidia.com/gpu": "8"}
    manager.step(11)
    assert nodes.node.labels[MIG_STATE_LABEL] == "success"
    assert nodes.node.allocatable == {
        "nvidia.com/mig-1g.10gb": "16",
        "nvidia.com/mig-2g.20gb": "8",
        "nvidia.com/mig-3g.40gb": "8",
    }
    assert nodes.node.labels["nvidia.com/mig-3g.40gb.count"] == "8"
    assert nodes.node.labels["nvidia.com/mig-1g.10gb.memory"] == "9984"
    # back to whole GPUs: stale MIG resources and labels go away
    nodes.relabel("all-disabled")
    manager.step(20)
    manager.step(31)
    assert nodes.node.allocatable == {"nvidia.com/gpu": "8"}
    assert not [k for k in nodes.node.labels if k.startswith("nvidia.com/mig-")]


def test_invalid_layout_fails_with_an_event(nodes: FakeNodes, manager: MigManager) -> None:
    manager.step(0)
    nodes.relabel("all-1g.5gb")
    manager.step(1)
    assert nodes.node.labels[MIG_STATE_LABEL] == "failed"
    assert [reason for reason, _ in nodes.events] == ["MigReconfigureInvalidLayout"]
    manager.step(2)
    assert len(nodes.events) == 1  # not repeated


def test_refuses_a_node_with_gpu_pods(nodes: FakeNodes, manager: MigManager) -> None:
    manager.step(0)
    nodes.busy = ["llm/chat-1"]
    nodes.relabel("all-3g.40gb")
    manager.step(1)
    assert nodes.node.labels[MIG_STATE_LABEL] == "failed"
    reason, message = nodes.events[0]
    assert reason == "MigReconfigureGPUsInUse" and "llm/chat-1" in message
    assert nodes.node.allocatable == {"nvidia.com/gpu": "8"}
    # drained, and the label changed again: it goes through
    nodes.busy = []
    nodes.relabel("all-7g.80gb")
    manager.step(2)
    manager.step(12)
    assert nodes.node.labels[MIG_STATE_LABEL] == "success"
    assert nodes.node.allocatable == {"nvidia.com/mig-7g.80gb": "8"}


def test_adopts_a_consistent_node_even_with_pods(nodes: FakeNodes, manager: MigManager) -> None:
    nodes.busy = ["llm/chat-1"]
    manager.step(0)
    assert nodes.node.labels[MIG_STATE_LABEL] == "success" and not nodes.events


def test_a_failed_layout_is_retried_after_another_label(
    nodes: FakeNodes, manager: MigManager
) -> None:
    manager.step(0)
    nodes.busy = ["llm/chat-1"]
    nodes.relabel("all-3g.40gb")
    manager.step(1)
    nodes.relabel("all-disabled")  # back to what is applied
    manager.step(2)
    assert nodes.node.labels[MIG_STATE_LABEL] == "success"
    nodes.busy = []
    nodes.relabel("all-3g.40gb")
    manager.step(3)
    assert nodes.node.labels[MIG_STATE_LABEL] == "pending"


CUSTOM = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  two-kinds:
    - devices: [0, 1, 2, 3, 4, 5]
      mig-enabled: false
    - devices: [6]
      mig-enabled: true
      mig-devices: {"1g.20gb": 4}
    - devices: [7]
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
  too-much:
    - devices: all
      mig-enabled: true
      mig-devices: {"4g.40gb": 2}
"""


def test_a_custom_config_from_the_configmap_is_applied_gpu_by_gpu(
    nodes: FakeNodes, manager: MigManager
) -> None:
    nodes.configs[("gpu-operator", "mig")] = CUSTOM
    manager.step(0)
    nodes.relabel("two-kinds")
    manager.step(1)
    assert nodes.node.labels[MIG_STATE_LABEL] == "pending"
    manager.step(4)  # 2 GPUs change: 2 + 2 x 1 s
    assert nodes.node.labels[MIG_STATE_LABEL] == "pending"
    manager.step(5)
    assert nodes.node.labels[MIG_STATE_LABEL] == "success"
    assert nodes.node.allocatable == {
        "nvidia.com/gpu": "6",
        "nvidia.com/mig-1g.20gb": "4",
        "nvidia.com/mig-3g.40gb": "2",
    }
    assert nodes.node.labels["nvidia.com/mig-1g.20gb.count"] == "4"
    product = load_catalog().products["h100-80gb"]
    assert gpu_layouts(nodes.node, product, 8)[6:] == [["1g.20gb"] * 4, ["3g.40gb"] * 2]


@pytest.mark.parametrize(
    ("config", "layout", "says"),
    [
        (CUSTOM, "too-much", "cannot hold 4g.40gb+4g.40gb"),
        (CUSTOM, "nowhere", "'nowhere' is not in ConfigMap gpu-operator/mig"),
        ("version: v1\nmig-configs: [x]\n", "two-kinds", "mig-configs must be a mapping"),
    ],
)
def test_a_custom_config_mig_parted_would_refuse_fails_the_node(
    nodes: FakeNodes, manager: MigManager, config: str, layout: str, says: str
) -> None:
    nodes.configs[("gpu-operator", "mig")] = config
    manager.step(0)
    nodes.relabel(layout)
    manager.step(1)
    assert nodes.node.labels[MIG_STATE_LABEL] == "failed"
    reason, message = nodes.events[0]
    assert reason == "MigReconfigureInvalidLayout" and says in message
    assert nodes.node.allocatable == {"nvidia.com/gpu": "8"}


def test_a_pod_that_arrives_while_pending_fails_the_node_when_it_applies(
    nodes: FakeNodes, manager: MigManager
) -> None:
    manager.step(0)
    nodes.relabel("all-3g.40gb")
    manager.step(1)
    nodes.busy = ["llm/late-1"]
    manager.step(11)
    assert nodes.node.labels[MIG_STATE_LABEL] == "failed"
    assert nodes.events[0][0] == "MigReconfigureGPUsInUse"
    assert nodes.node.allocatable == {"nvidia.com/gpu": "8"}


def test_processes_outside_kubernetes_fail_the_node(nodes: FakeNodes, manager: MigManager) -> None:
    manager.step(0)
    nodes.patch_metadata(nodes.node.name, {}, {HOST_CLIENTS_ANNOTATION: "1"})
    nodes.relabel("all-3g.40gb")
    manager.step(1)
    reason, message = nodes.events[0]
    assert reason == "MigReconfigureGPUsInUse" and "outside Kubernetes" in message
    # restoring what is applied is no reconfiguration: success at once
    nodes.relabel("all-disabled")
    manager.step(2)
    assert nodes.node.labels[MIG_STATE_LABEL] == "success"
