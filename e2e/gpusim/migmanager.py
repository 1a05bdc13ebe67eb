"""Emulates NVIDIA's MIG manager: applies `nvidia.com/mig.config` layouts to kwok GPU nodes.

Like the real one it looks the label's config up by name (the standard `all-*` layouts, or a
custom mig-parted config in its ConfigMap, as the GPU Operator's ClusterPolicy
`migManager.config.name` makes it read one), refuses a config that is invalid or that the GPU
cannot hold, reports progress in `nvidia.com/mig.config.state` (pending -> success or failed),
takes a node's time (stopping and restarting the GPU operands, then each GPU whose layout
changes), never evicts pods, and fails a node whose GPUs are still held when it applies the
layout: by pods, or by processes outside Kubernetes (the `gpusim.gpusizer.io/host-gpu-clients`
annotation stands for those). A failed layout is not retried until the label changes again.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpusizer.catalog import Catalog, GPUProduct, load_catalog
from gpusizer.catalog.migparted import (
    NodeLayout,
    describe,
    node_layout,
    parse_config,
    standard_layout,
)
from gpusizer.catalog.placement import labels_for_gpus, resources_for_gpus

from e2e.gpusim.cluster import (
    COUNT_LABEL,
    HOST_CLIENTS_ANNOTATION,
    MIG_APPLIED_ANNOTATION,
    MIG_CONFIG_LABEL,
    MIG_LAYOUT_ANNOTATION,
    MIG_STATE_LABEL,
    PRODUCT_LABEL,
    NodeInfo,
)
from e2e.gpusim.devices import gpu_layouts
from e2e.gpusim.kube import KubeCluster

log = logging.getLogger(__name__)

APPLIED_ANNOTATION = MIG_APPLIED_ANNOTATION
"""Kept on the node, so an emulator restart does not re-apply a layout."""
EVENT_REASON_BUSY = "MigReconfigureGPUsInUse"
EVENT_REASON_INVALID = "MigReconfigureInvalidLayout"
DEFAULT_CONFIG_MAP = "gpu-operator/custom-mig-parted-config"


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

    def read_config(self, namespace: str, name: str) -> str | None:
        """The ConfigMap's config.yaml; None when there is no such ConfigMap or key."""
        ...


@dataclass(frozen=True)
class MigTiming:
    """How long a node takes. Defaults: stopping and restarting the device plugin, GFD, DCGM and
    its exporter (30 s), then 10 s per GPU whose layout changes, so a whole 8-GPU node takes
    110 s, inside NVIDIA's 1-3 minutes without a reboot (an estimate: gpu-facts.md)."""

    per_node: float = 30.0
    per_gpu: float = 10.0

    def seconds(self, changed_gpus: int) -> float:
        return self.per_node + self.per_gpu * changed_gpus


@dataclass
class _Pending:
    layout_name: str
    layout: NodeLayout
    since: float
    seconds: float


def _as_node_layout(layouts: Sequence[Sequence[str]]) -> NodeLayout:
    return tuple(None if not gpu else tuple(sorted(gpu)) for gpu in layouts)


class MigManager:
    def __init__(
        self,
        client: MigNodeClient,
        catalog: Catalog,
        timing: MigTiming,
        config_map: str = DEFAULT_CONFIG_MAP,
    ) -> None:
        self.client = client
        self.catalog = catalog
        self.timing = timing
        self.config_map = tuple(config_map.split("/", 1))
        self._pending: dict[str, _Pending] = {}
        self._failed: dict[str, str] = {}

    def step(self, now: float) -> None:
        for node in self.client.nodes():
            try:
                self._step_node(node, now)
            except Exception:
                log.exception("node %s: MIG reconfiguration step failed", node.name)

    def layout(self, product: GPUProduct, name: str, gpus: int) -> NodeLayout:
        """The per-GPU layout a config name stands for; ValueError as mig-parted's
        `assert --valid-config` would refuse it."""
        found = standard_layout(product, name, gpus)
        if found is not None:
            return found
        namespace, config_map = self.config_map
        text = self.client.read_config(namespace, config_map)
        configs = parse_config(text)
        if name not in configs:
            raise ValueError(f"config {name!r} is not in ConfigMap {namespace}/{config_map}")
        return node_layout(configs[name], product, gpus, name)

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
        if pending is None or pending.layout_name != desired:
            try:
                layout = self.layout(product, desired, count)
            except ValueError as exc:
                self._fail(node, desired, EVENT_REASON_INVALID, str(exc))
                return
            if applied is None and self._already_applied(node, layout):
                log.info("node %s: adopting layout %s", node.name, desired)
                self.client.patch_metadata(
                    node.name, {MIG_STATE_LABEL: "success"}, self._applied(desired, layout)
                )
                return
            if self._busy(node, desired):
                return
            current = _as_node_layout(gpu_layouts(node, product, count))
            changed = sum(1 for old, new in zip(current, layout, strict=False) if old != new)
            seconds = self.timing.seconds(changed)
            log.info("node %s: reconfiguring to %s (%.0f s)", node.name, desired, seconds)
            self._pending[node.name] = _Pending(desired, layout, now, seconds)
            self.client.patch_metadata(node.name, {MIG_STATE_LABEL: "pending"}, {})
            return
        if now - pending.since < pending.seconds:
            return
        if self._busy(node, desired):
            return
        resources: dict[str, int | None] = {
            name: None for name in node.allocatable if _is_gpu_resource(name)
        }
        resources.update(resources_for_gpus(pending.layout))
        labels: dict[str, str | None] = {
            key: None for key in node.labels if key.startswith("nvidia.com/mig-")
        }
        labels.update(labels_for_gpus(product, pending.layout))
        labels[MIG_STATE_LABEL] = "success"
        self.client.patch_resources(node.name, resources)
        self.client.patch_metadata(node.name, labels, self._applied(desired, pending.layout))
        del self._pending[node.name]
        log.info("node %s: layout %s applied", node.name, desired)

    @staticmethod
    def _applied(name: str, layout: NodeLayout) -> dict[str, str | None]:
        return {
            APPLIED_ANNOTATION: name,
            MIG_LAYOUT_ANNOTATION: json.dumps([describe(gpu) for gpu in layout]),
        }

    def _busy(self, node: NodeInfo, desired: str) -> bool:
        """Fails the node when something holds its GPUs; True if it did."""
        busy = self.client.gpu_pods(node.name)
        if busy:
            message = f"GPUs are in use by {', '.join(sorted(busy))}: drain the node first"
        elif node.annotations.get(HOST_CLIENTS_ANNOTATION, "0") not in ("", "0"):
            clients = node.annotations[HOST_CLIENTS_ANNOTATION]
            message = f"GPUs are in use by {clients} process(es) outside Kubernetes"
        else:
            return False
        self._fail(node, desired, EVENT_REASON_BUSY, message)
        return True

    def _already_applied(self, node: NodeInfo, layout: NodeLayout) -> bool:
        want = {k: str(v) for k, v in resources_for_gpus(layout).items()}
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The MIG manager's options, shared with the emulator's command line."""
    defaults = MigTiming()
    parser.add_argument(
        "--mig-seconds-per-node",
        type=float,
        default=defaults.per_node,
        help="a reconfiguration's fixed time: GPU operands stopped and started again",
    )
    parser.add_argument(
        "--mig-seconds-per-gpu",
        type=float,
        default=defaults.per_gpu,
        help="added for each GPU whose layout changes",
    )
    parser.add_argument(
        "--mig-config-map",
        default=DEFAULT_CONFIG_MAP,
        help="NAMESPACE/NAME of the ConfigMap holding custom mig-parted configs (config.yaml)",
    )


def manager_from(args: argparse.Namespace, client: MigNodeClient, catalog: Catalog) -> MigManager:
    timing = MigTiming(args.mig_seconds_per_node, args.mig_seconds_per_gpu)
    return MigManager(client, catalog, timing, args.mig_config_map)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the MIG manager alone (the emulator also runs it in-process)."""
    parser = argparse.ArgumentParser(prog="python -m e2e.gpusim.migmanager", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    add_arguments(parser)
    parser.add_argument("--catalog", default=None, help="catalog override YAML")
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    catalog = load_catalog(Path(args.catalog) if args.catalog else None)
    cluster = KubeCluster(args.kubeconfig)
    cluster.start()
    manager = manager_from(args, cluster, catalog)
    stop = threading.Event()
    try:
        manager.run(args.interval, stop)
    except KeyboardInterrupt:
        stop.set()


if __name__ == "__main__":
    main()
