"""What the emulator sees of the cluster, and the narrow interface it reads and patches through."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_APPLIED_ANNOTATION = "gpusim.gpusizer.io/mig-config-applied"
"""The layout the MIG manager emulator last applied (it also rewrote allocatable then)."""
MIG_LAYOUT_ANNOTATION = "gpusim.gpusizer.io/mig-layout-applied"
"""What that layout holds, per GPU ("whole", "none" or profiles joined by +), as JSON."""
HOST_CLIENTS_ANNOTATION = "gpusim.gpusizer.io/host-gpu-clients"
"""Fault injection: processes outside Kubernetes holding the node's GPUs (a count)."""

WorkloadKey = tuple[str, str]
"""(namespace, name) of the Deployment (or bare pod) a replica belongs to."""

S = TypeVar("S")
D = TypeVar("D")


class Rederived(Generic[S, D]):
    """What was derived from each source, by key, derived again only when the source is
    another object: the informers replace an object at each of its events, and the emulator
    hands on an unchanged node or pod as the same object. Deriving every device and server of
    10,000 GPUs at every tick was work a tick could spare (bench/README.md)."""

    def __init__(self, derive: Callable[[S], D]) -> None:
        self._derive = derive
        self._known: dict[str, tuple[S, D]] = {}

    def of(self, sources: Iterable[tuple[str, S]]) -> list[D]:
        """What each source gives, in their order; sources no longer given are forgotten."""
        known: dict[str, tuple[S, D]] = {}
        for key, source in sources:
            cached = self._known.get(key)
            known[key] = (
                cached
                if cached is not None and cached[0] is source
                else (source, self._derive(source))
            )
        self._known = known
        return [derived for _, derived in known.values()]


@dataclass(frozen=True)
class PodInfo:
    """A pod holding GPU resources, reduced to what the emulator needs."""

    uid: str
    namespace: str
    name: str
    node: str | None
    workload: WorkloadKey
    container: str
    resource: str
    count: int
    running_since: float | None
    """When it became Running (container start), None while Pending."""
    ready: bool
    restart_count: int
    terminating: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    """Deployment annotations over the pod's own: the Deployment wins."""
    ip: str | None = None
    """The pod's IP (kwok's, inside 127.0.0.0/8): where its inference server listens."""
    http_port: int = 8000
    """The GPU container's port named http, else vLLM's default."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterSnapshot:
    pods: Sequence[PodInfo]
    nodes: Mapping[str, NodeInfo]


class ClusterSource(Protocol):
    """The cluster behind the emulator; tests replace it with an in-memory fake."""

    def snapshot(self) -> ClusterSnapshot: ...

    def mark_ready(self, pod: PodInfo) -> None:
        """Set conditions Ready/ContainersReady and every container's ready to true."""
        ...

    def record_oom(self, pod: PodInfo, at: float) -> None:
        """Report a CUDA out-of-memory crash: restartCount+1, lastState OOMKilled, exit 137."""
        ...

    def record_restart(self, pod: PodInfo, at: float) -> None:
        """Report a restart of the server: restartCount+1, lastState Error, exit 1."""
        ...


def gpu_limit(limits: Mapping[str, object]) -> tuple[str, int] | None:
    """The GPU resource and count among a container's limits, if any."""
    for name, value in limits.items():
        if name == "nvidia.com/gpu" or name.startswith("nvidia.com/mig-"):
            try:
                count = int(str(value))
            except ValueError:
                continue
            if count > 0:
                return name, count
    return None
