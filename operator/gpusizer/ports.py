"""The operator's I/O edge: what a turn needs from Prometheus, the scaled targets, the
activator's routes and the WorkloadSizing status, and what a GPUPartitioning's turn writes
(nodes, evictions, the mig-parted ConfigMap), as Protocols.

The operator runs `signals.prometheus.PrometheusSource`, `actuate.targets.Targets`,
`actuate.routes.Routes`, `report.writer.StatusWriter`, `partition.kube.KubeNodes` and
`lease.KubeLease` (which replica is in charge); tests run
the in-memory fakes in tests/fakes.py, so every branch of a turn has a fast test.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gpusizer.activation import ActivatorRoute
from gpusizer.actuate.target_view import SliceChange, TargetView
from gpusizer.api.v1alpha1 import TargetRef
from gpusizer.charge import LeaseRecord
from gpusizer.partition.objects import ConfigMapRef
from gpusizer.signals.parse import LabelledValue, PodSamples, Problem
from gpusizer.signals.queries import PodQuery


class MetricsSource(Protocol):
    async def per_pod_batch(
        self, wanted: Mapping[str, PodQuery]
    ) -> tuple[dict[str, PodSamples], dict[str, Problem]]:
        """Each signal's samples per pod; a signal whose query failed is in the second dict,
        with the reason, never in the first."""
        ...

    async def scalar(self, promql: str) -> tuple[float | None, Problem | None]:
        """One value (a wake query's): a number, or the reason there is none."""
        ...

    async def series_batch(
        self, wanted: Mapping[str, str]
    ) -> tuple[dict[str, list[LabelledValue]], dict[str, Problem]]:
        """Each query's series with their labels (for what is not per pod: a MIG instance's
        GPU, a workload's ledger), all evaluated at one instant, so that two windows of one
        counter see the same latest samples; a query that failed is in the second dict, with
        the reason."""
        ...


class TargetClient(Protocol):
    """Raises `actuate.target_view.TargetProblem` (or a subclass) with the reason for the user."""

    async def read(self, namespace: str, ref: TargetRef) -> TargetView: ...

    async def write(self, namespace: str, ref: TargetRef, expected: int, replicas: int) -> None:
        """Set replicas, unless the target no longer has `expected` (ScaleConflict)."""
        ...

    async def reshape(self, namespace: str, ref: TargetRef, change: SliceChange) -> None: ...

    async def annotate(
        self, namespace: str, ref: TargetRef, annotations: Mapping[str, str]
    ) -> None: ...


class RouteClient(Protocol):
    """Where a workload Service's traffic goes: the EndpointSlice that points it at the
    activator, and the activator's ready replicas. Raises `activation.RouteProblem` with the
    reason for the user."""

    def activators(self) -> tuple[str, ...] | None:
        """The ready activator replicas' addresses as the watch shows them; None when no
        activator is installed or its Service was not listed yet."""
        ...

    async def service_port(self, namespace: str, service: str, port: int | None) -> str:
        """The name the Service's EndpointSlices give the port to hold (`port`, or the
        Service's only port)."""
        ...

    async def route(self, namespace: str, service: str, route: ActivatorRoute | None) -> None:
        """The Service's activator EndpointSlice made to say `route`, or removed (None);
        nothing is sent when it already does."""
        ...


class StatusSink(Protocol):
    async def write(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch a WorkloadSizing's status; returns the status as stored. Raises
        `report.writer.StatusNotWritten`."""
        ...


class NodeClient(Protocol):
    """What re-partitioning writes. Raises `partition.objects.PartitionProblem` with the reason
    for the status when the API server refuses or does not answer."""

    async def patch_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        unschedulable: bool | None = None,
    ) -> None:
        """One merge patch of a node: None deletes a label or annotation; `unschedulable`
        cordons (True) or uncordons (False) it, None leaves it."""
        ...

    async def evict(self, namespace: str, name: str) -> str | None:
        """Evict a pod through the Eviction API: None once accepted (or when the pod is gone),
        else why it was refused (a PodDisruptionBudget); never forced."""
        ...

    async def read_config(self, ref: ConfigMapRef) -> tuple[str | None, str]:
        """The ConfigMap's config.yaml (None without one) and its resourceVersion."""
        ...

    async def write_config(self, ref: ConfigMapRef, text: str, resource_version: str) -> str:
        """Replace config.yaml, unless the ConfigMap changed since `resource_version`; returns
        the new resourceVersion."""
        ...


class LeaseStore(Protocol):
    """The operator's Lease. Blocking: `lease.keep_charge` calls it from a thread of its own."""

    def read(self) -> LeaseRecord | None:
        """None when there is no Lease yet."""
        ...

    def write(self, record: LeaseRecord) -> LeaseRecord:
        """Creates it (`record.version` empty) or replaces it at `record.version`; raises
        `lease.LeaseConflict` when another replica wrote it first."""
        ...
