"""Emulates NVIDIA's MIG manager: applies `nvidia.com/mig.config` layouts to kwok GPU nodes.

Like the real one it reports progress in `nvidia.com/mig.config.state` (pending -> success or
failed), never evicts pods, and fails on a node whose GPUs are still held by running pods. A
failed layout is not retried until the label changes again.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpusizer.catalog import (
    Catalog,
    labels_for_layout,
    load_catalog,
    named_layout,
    resources_for_layout,
)

from e2e.gpusim.cluster import (
    COUNT_LABEL,
    MIG_APPLIED_ANNOTATION,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    PRODUCT_LABEL,
    NodeInfo,
)
from e2e.gpusim.kube import KubeCluster

log = logging.getLogger(__name__)

APPLIED_ANNOTATION = MIG_APPLIED_ANNOTATION
"""Kept on the node, so an emulator restart does not re-apply a layout."""
EVENT_REASON_BUSY = "MigReconfigureGPUsInUse"
EVENT_REASON_INVALID = "MigReconfigureInvalidLayout"


def _is_gpu_resource(name: str) -> bool:
    return name == "nvidia.com/gpu" or name.startswith("nvidia.com/mig-")


class MigNodeClient(Protocol):
    def nodes(self) -> Sequence[NodeInfo]: ...

    def gpu_pods(self, node: str) -> list[str]:
        """`namespace/name` of non-terminated pods on the node holding GPU resources."""
        ...

    def patch_metadata(
        self, node: str, labels: Mapping[str, str | None], annotations: Mapping[str, str | None]
    ) -> None:
        """Merge-patch labels and annotations; None deletes a key."""
        ...

    def patch_resources(self, node: str, resources: Mapping[str, int | None]) -> None:
        """Set status capacity and allocatable through the status subresource; None deletes."""
        ...

    def warn(self, node: str, reason: str, message: str) -> None:
        """Record a Warning Event on the node."""
        ...


@dataclass
class _Pending:
    layout: str
    since: float


class MigManager:
    def __init__(self, client: MigNodeClient, catalog: Catalog, reconfigure_seconds: float) -> None:
        self.client = client
        self.catalog = catalog
        self.reconfigure_seconds = reconfigure_seconds
        self._pending: dict[str, _Pending] = {}
        self._failed: dict[str, str] = {}

    def step(self, now: float) -> None:
        for node in self.client.nodes():
            try:
                self._step_node(node, now)
            except Exception:
                log.exception("node %s: MIG reconfiguration step failed", node.name)

    def _step_node(self, node: NodeInfo, now: float) -> None:
        desired = node.labels.get(MIG_CONFIG_LABEL)
        product = self.catalog.product_by_label(node.labels.get(PRODUCT_LABEL, ""))
        if not desired or product is None:
            return
        failed = self._failed.pop(node.name, None)
        if failed == desired:
            self._failed[node.name] = failed
            return
        applied = node.annotations.get(APPLIED_ANNOTATION)
        count = int(node.labels.get(COUNT_LABEL, "0") or 0)
        if applied == desired:
            self._pending.pop(node.name, None)
            if node.labels.get(MIG_STATE_LABEL) != "success":
                self.client.patch_metadata(node.name, {MIG_STATE_LABEL: "success"}, {})
            return
        pending = self._pending.get(node.name)
        if pending is None or pending.layout != desired:
            if named_layout(product, desired) is None:
                self._fail(
                    node,
                    desired,
                    EVENT_REASON_INVALID,
                    f"a {product.gfd_label} cannot hold layout {desired!r}",
                )
                return
            if applied is None and self._already_applied(node, desired, count):
                log.info("node %s: adopting layout %s", node.name, desired)
                self.client.patch_metadata(
                    node.name, {MIG_STATE_LABEL: "success"}, {APPLIED_ANNOTATION: desired}
                )
                return
            busy = self.client.gpu_pods(node.name)
            if busy:
                self._fail(
                    node,
                    desired,
                    EVENT_REASON_BUSY,
                    f"GPUs are in use by {', '.join(sorted(busy))}: drain the node first",
                )
                return
            log.info("node %s: reconfiguring to %s", node.name, desired)
            self._pending[node.name] = _Pending(desired, now)
            self.client.patch_metadata(node.name, {MIG_STATE_LABEL: "pending"}, {})
            return
        if now - pending.since < self.reconfigure_seconds:
            return
        resources: dict[str, int | None] = {
            name: None for name in node.allocatable if _is_gpu_resource(name)
        }
        resources.update(resources_for_layout(product, desired, count))
        labels: dict[str, str | None] = {
            key: None for key in node.labels if key.startswith("nvidia.com/mig-")
        }
        labels.update(labels_for_layout(product, desired, count))
        labels[MIG_STATE_LABEL] = "success"
        self.client.patch_resources(node.name, resources)
        self.client.patch_metadata(node.name, labels, {APPLIED_ANNOTATION: desired})
        del self._pending[node.name]
        log.info("node %s: layout %s applied", node.name, desired)

    def _already_applied(self, node: NodeInfo, layout: str, count: int) -> bool:
        product = self.catalog.product_by_label(node.labels.get(PRODUCT_LABEL, ""))
        assert product is not None
        want = {k: str(v) for k, v in resources_for_layout(product, layout, count).items()}
        have = {k: v for k, v in node.allocatable.items() if _is_gpu_resource(k) and v != "0"}
        return want == have

    def _fail(self, node: NodeInfo, layout: str, reason: str, message: str) -> None:
        log.warning("node %s: layout %s failed: %s", node.name, layout, message)
        self._failed[node.name] = layout
        self._pending.pop(node.name, None)
        self.client.patch_metadata(node.name, {MIG_STATE_LABEL: "failed"}, {})
        self.client.warn(node.name, reason, f"layout {layout}: {message}")

    def run(
        self, interval: float, stop: threading.Event, clock: Callable[[], float] = time.time
    ) -> None:
        while not stop.is_set():
            self.step(clock())
            stop.wait(interval)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the MIG manager alone (the emulator also runs it in-process)."""
    parser = argparse.ArgumentParser(prog="python -m e2e.gpusim.migmanager", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--mig-reconfigure-seconds", type=float, default=10.0)
    parser.add_argument("--catalog", default=None, help="catalog override YAML")
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    catalog = load_catalog(Path(args.catalog) if args.catalog else None)
    cluster = KubeCluster(args.kubeconfig)
    cluster.start()
    manager = MigManager(cluster, catalog, args.mig_reconfigure_seconds)
    stop = threading.Event()
    try:
        manager.run(args.interval, stop)
    except KeyboardInterrupt:
        stop.set()


if __name__ == "__main__":
    main()
