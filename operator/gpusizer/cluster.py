"""The cluster as the operator's watches show it: pods, GPU nodes, GPU targets, and each
WorkloadSizing as a turn reads it.

Pure: read-only views over the watch caches, so a turn over thousands of workloads sends no
request for what the watches already hold.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusizer.actuate.target_view import TargetView, cached_kind
from gpusizer.api.v1alpha1 import TargetRef
from gpusizer.signals.discovery import NodeInfo
from gpusizer.signals.pods import PodInfo, equality_term, matches_selector

PodLabelKey = tuple[str, str, str]  # namespace, label key, label value


@dataclass(frozen=True)
class ClusterView:
    """Pods by namespace and by label, GPU nodes by name, Deployments and StatefulSets by
    kind, then (namespace, name), and the activator ports the WorkloadSizings hold.

    `gone`: the uids of pods the watch's cache holds that the API server no longer has
    (`sweep.PodSweep`), left out of every read."""

    pods_by_namespace: Mapping[str, Iterable[PodInfo]]
    nodes: Mapping[str, NodeInfo]
    pods_by_label: Mapping[PodLabelKey, Iterable[PodInfo]] | None = None
    targets: Mapping[str, Mapping[tuple[str, str], TargetView]] | None = None
    # every WorkloadSizing's activator port, as its status records it
    activator_ports: Mapping[int, Iterable[tuple[str, str]]] | None = None
    gone: Container[str] = frozenset()

    def target(self, namespace: str, ref: TargetRef) -> TargetView | None:
        """The target as the watch shows it; None (another kind, or one the watch has not
        shown yet) means read it from the API server, which also says exactly why when it
        does not exist."""
        if self.targets is None or not cached_kind(ref):
            return None
        return self.targets.get(ref.kind, {}).get((namespace, ref.name))

    def pods(self, namespace: str) -> Iterable[PodInfo]:
        return self._present(self.pods_by_namespace.get(namespace, ()))

    def _present(self, pods: Iterable[PodInfo]) -> Iterable[PodInfo]:
        return (p for p in pods if p.uid not in self.gone)

    def selected(self, namespace: str, selector: str) -> list[PodInfo]:
        """The namespace's pods a target's selector matches: through the label index when the
        selector has a key=value term, so a turn over every workload of a namespace does not
        match each selector against each pod of it."""
        term = equality_term(selector)
        if term is None or self.pods_by_label is None:
            candidates = self.pods(namespace)
        else:
            candidates = self._present(self.pods_by_label.get((namespace, *term), ()))
        return [p for p in candidates if matches_selector(p.labels, selector)]

    def all_pods(self) -> Iterable[PodInfo]:
        for pods in self.pods_by_namespace.values():
            yield from self._present(pods)


@dataclass(frozen=True)
class WorkloadObject:
    """A WorkloadSizing as a turn reads it."""

    namespace: str
    name: str
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    annotations: Mapping[str, str]
    generation: int | None
    uid: str = ""
