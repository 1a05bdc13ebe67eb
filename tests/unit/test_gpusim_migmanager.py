"""The MIG manager emulator's state machine against an in-memory node client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from gpusizer.catalog import load_catalog

from e2e.gpusim.cluster import MIG_CONFIG_LABEL, MIG_STATE_LABEL, NodeInfo
from e2e.gpusim.migmanager import APPLIED_ANNOTATION, MigManager
from e2e.gpusim.testing import gpu_node


class FakeNodes:
    def __init__(self, node: NodeInfo) -> None:
        self.node = NodeInfo(node.name, dict(node.labels), dict(node.allocatable), {})
        self.busy: list[str] = []
        self.events: list[tuple[str, str]] = []

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
    return MigManager(nodes, load_catalog(), reconfigure_seconds=10)


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
