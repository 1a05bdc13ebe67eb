"""What the kopf handlers hand to reconcile."""

from __future__ import annotations

from gpusizer.handlers import OnePerKey
from gpusizer.signals.discovery import NodeInfo


def test_one_value_per_key_reads_an_index_without_copying_it() -> None:
    first = NodeInfo("gpu-a", "NVIDIA-H100-80GB-HBM3", {"nvidia.com/gpu": 8}, True)
    index: dict[str, list[NodeInfo]] = {"gpu-a": [first], "gpu-gone": []}
    nodes = OnePerKey(index)  # type: ignore[arg-type]  # a kopf.Index is a mapping of stores
    assert nodes["gpu-a"] is first
    assert nodes.get("gpu-gone") is None and nodes.get("cpu") is None
    assert list(nodes) == ["gpu-a", "gpu-gone"] and len(nodes) == 2
    index["gpu-b"] = [first]
    assert "gpu-b" in nodes  # a view: later index updates show
