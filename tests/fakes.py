"""In-memory implementations of the operator's ports (`gpusizer.ports`), for fast tests of
every branch of a turn: each answers from a table the test fills and records what was asked."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpusizer.activation import ActivatorRoute, RouteProblem
from gpusizer.actuate.target_view import (
    ScaleConflict,
    SliceChange,
    TargetNotFound,
    TargetProblem,
    TargetView,
)
from gpusizer.api.partitioning import REPARTITION_ANNOTATION, REPARTITION_FAILURE_ANNOTATION
from gpusizer.api.v1alpha1 import TargetRef
from gpusizer.catalog import load_catalog
from gpusizer.charge import LeaseRecord
from gpusizer.clock import Cycle
from gpusizer.cluster import WorkloadObject
from gpusizer.lease import LeaseConflict
from gpusizer.measurement import Measurer
from gpusizer.partition.objects import ConfigMapRef, GpuNode, PartitionProblem
from gpusizer.ports import MetricsSource, RouteClient, TargetClient
from gpusizer.reconcile import Services
from gpusizer.rightsizing import RightSizer
from gpusizer.settings import Tenancy
from gpusizer.signals.discovery import OfferCache
from gpusizer.signals.parse import LabelledValue, PodSamples, Problem
from gpusizer.signals.queries import PodQuery
from gpusizer.signals.reader import HistoryCache, LedgerCache
from gpusizer.vocabulary import Reason

# a query Prometheus did not answer in time, as `PrometheusSource` reports it
TIMED_OUT = Problem(Reason.PROMETHEUS_UNREACHABLE, "timed out: read timeout=10")


@dataclass
class FakeMetrics:
    """A MetricsSource: each signal's answer by name (a signal not in the table has no series),
    or `down` for every query, as a Prometheus that does not answer."""

    answers: dict[str, PodSamples | Problem] = field(default_factory=dict)
    scalars: dict[str, float | Problem] = field(default_factory=dict)
    series: dict[str, list[LabelledValue] | Problem] = field(default_factory=dict)
    down: Problem | None = None
    asked: list[tuple[str, str]] = field(default_factory=list)  # (signal, promql)

    async def per_pod_batch(
        self, wanted: Mapping[str, PodQuery]
    ) -> tuple[dict[str, PodSamples], dict[str, Problem]]:
        samples: dict[str, PodSamples] = {}
        errors: dict[str, Problem] = {}
        for name, query in wanted.items():
            self.asked.append((name, query.promql))
            answer = self.down or self.answers.get(name, PodSamples())
            if isinstance(answer, Problem):
                errors[name] = answer
            else:
                samples[name] = answer
        return samples, errors

    async def series_batch(
        self, wanted: Mapping[str, str]
    ) -> tuple[dict[str, list[LabelledValue]], dict[str, Problem]]:
        found: dict[str, list[LabelledValue]] = {}
        errors: dict[str, Problem] = {}
        for name, promql in wanted.items():
            self.asked.append((name, promql))
            answer = self.down or self.series.get(name, [])
            if isinstance(answer, Problem):
                errors[name] = answer
            else:
                found[name] = list(answer)
        return found, errors

    async def scalar(self, promql: str) -> tuple[float | None, Problem | None]:
        self.asked.append(("scalar", promql))
        answer = self.down or self.scalars.get(promql)
        if answer is None:
            return None, Problem(Reason.NO_SAMPLES, "the query returned no series")
        if isinstance(answer, Problem):
            return None, answer
        return answer, None


@dataclass
class FakeTargets:
    """A TargetClient over targets by (namespace, name). A write or reshape changes the stored
    target as the API server would; `fail` makes the named call raise instead."""

    targets: dict[tuple[str, str], TargetView] = field(default_factory=dict)
    fail: dict[str, TargetProblem] = field(default_factory=dict)  # read|write|reshape|annotate
    writes: list[tuple[str, str, int]] = field(default_factory=list)  # namespace, name, replicas
    reshapes: list[tuple[str, str, SliceChange]] = field(default_factory=list)
    annotations: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    reads: int = 0

    def _get(self, namespace: str, ref: TargetRef) -> TargetView:
        target = self.targets.get((namespace, ref.name))
        if target is None:
            raise TargetNotFound(
                f"spec.targetRef: {ref.kind} {namespace}/{ref.name} does not exist"
            )
        return target

    def _store(self, namespace: str, ref: TargetRef, target: TargetView) -> None:
        version = str(int(target.resource_version or "0") + 1)
        self.targets[(namespace, ref.name)] = replace(target, resource_version=version)

    async def read(self, namespace: str, ref: TargetRef) -> TargetView:
        self.reads += 1
        if "read" in self.fail:
            raise self.fail["read"]
        return self._get(namespace, ref)

    async def write(self, namespace: str, ref: TargetRef, expected: int, replicas: int) -> None:
        if "write" in self.fail:
            raise self.fail["write"]
        target = self._get(namespace, ref)
        if target.replicas != expected:
            raise ScaleConflict(
                f"{ref.kind} {namespace}/{ref.name} changed to {target.replicas} replicas since "
                f"it was read ({expected}); deciding again next cycle"
            )
        self.writes.append((namespace, ref.name, replicas))
        self._store(namespace, ref, replace(target, replicas=replicas))

    async def reshape(self, namespace: str, ref: TargetRef, change: SliceChange) -> None:
        if "reshape" in self.fail:
            raise self.fail["reshape"]
        target = self._get(namespace, ref)
        self.reshapes.append((namespace, ref.name, change))
        annotations = {**target.annotations, **change.annotations}
        self._store(
            namespace, ref, replace(target, replicas=change.replicas, annotations=annotations)
        )

    async def annotate(
        self, namespace: str, ref: TargetRef, annotations: Mapping[str, str]
    ) -> None:
        if "annotate" in self.fail:
            raise self.fail["annotate"]
        target = self._get(namespace, ref)
        self.annotations.append((namespace, ref.name, dict(annotations)))
        merged = {**target.annotations, **annotations}
        self._store(namespace, ref, replace(target, annotations=merged))


@dataclass
class FakeRoutes:
    """A RouteClient over Services by (namespace, name) with their port names by number; the
    slices it holds are the routes written. `fail` makes `route` raise instead."""

    ready: tuple[str, ...] | None = ("10.0.0.7", "10.0.0.8")  # the activator's replicas
    services: dict[tuple[str, str], dict[int, str]] = field(
        default_factory=lambda: {("llm", "chat"): {80: "http"}}
    )
    slices: dict[tuple[str, str], ActivatorRoute] = field(default_factory=dict)
    fail: RouteProblem | None = None
    writes: list[tuple[str, str, ActivatorRoute | None]] = field(default_factory=list)

    def activators(self) -> tuple[str, ...] | None:
        return self.ready

    async def service_port(self, namespace: str, service: str, port: int | None) -> str:
        field = "spec.scaleToZero.activator"
        ports = self.services.get((namespace, service))
        if ports is None:
            raise RouteProblem(f"{field}.service: Service {namespace}/{service} does not exist")
        if port is None:
            if len(ports) != 1:
                raise RouteProblem(f"{field}.port: Service {namespace}/{service} has {len(ports)}")
            return next(iter(ports.values()))
        if port not in ports:
            raise RouteProblem(f"{field}.port: Service {namespace}/{service} has no port {port}")
        return ports[port]

    async def route(self, namespace: str, service: str, route: ActivatorRoute | None) -> None:
        if self.slices.get((namespace, service)) == route:
            return
        if self.fail is not None:
            raise self.fail
        self.writes.append((namespace, service, route))
        if route is None:
            self.slices.pop((namespace, service), None)
        else:
            self.slices[(namespace, service)] = route


@dataclass
class FakeStatus:
    """A StatusSink that keeps every patch and answers with the merged status."""

    patches: list[dict[str, Any]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)

    async def write(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.patches.append(dict(patch))
        self.status = {k: v for k, v in {**self.status, **patch}.items() if v is not None}
        return dict(self.status)


def services(
    metrics: MetricsSource,
    targets: TargetClient,
    tenancy: Tenancy | None = None,
    routes: RouteClient | None = None,
    now: float | None = None,
) -> Services:
    """A turn's ports with the default catalog; right-sizing reads its history (windows that
    end at `now`, else at the time of the read) and the ledger from `metrics`, and writes
    through `targets`."""
    catalog = load_catalog()
    history = HistoryCache(metrics, 60, wall=(lambda: now) if now is not None else time.time)
    return Services(
        metrics=metrics,
        targets=targets,
        routes=routes or FakeRoutes(),
        right_sizer=RightSizer(
            catalog,
            history,
            OfferCache(catalog, 60),
            targets,
            measurer=Measurer(catalog, history, LedgerCache(metrics, 60)),
        ),
        tenancy=tenancy or Tenancy(),
    )


def workload(
    spec: Mapping[str, Any],
    status: Mapping[str, Any] | None = None,
    annotations: Mapping[str, str] | None = None,
    name: str = "chat",
    namespace: str = "llm",
    generation: int = 1,
) -> WorkloadObject:
    return WorkloadObject(
        namespace, name, spec, status or {}, annotations or {}, generation, uid=f"uid-{name}"
    )


def _merged(base: Mapping[str, str], patch: Mapping[str, str | None] | None) -> dict[str, str]:
    out = dict(base)
    for key, value in (patch or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


@dataclass
class FakeNodes:
    """A NodeClient over nodes by name and one mig-parted ConfigMap. Patches change the stored
    nodes as the API server would; `refuse` maps a pod (namespace/name) to why a
    PodDisruptionBudget refuses its eviction; `fail` makes the named call (patch, evict, read,
    write) raise; `config` None is a ConfigMap that does not exist."""

    nodes: dict[str, GpuNode] = field(default_factory=dict)
    config: str | None = ""
    version: int = 1
    refuse: dict[str, str] = field(default_factory=dict)
    fail: dict[str, str] = field(default_factory=dict)
    patches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)

    async def patch_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        unschedulable: bool | None = None,
    ) -> None:
        if "patch" in self.fail:
            raise PartitionProblem(self.fail["patch"])
        self.patches.append(
            (name, {"labels": labels, "annotations": annotations, "unschedulable": unschedulable})
        )
        node = self.nodes[name]
        kept = {REPARTITION_ANNOTATION: node.record, REPARTITION_FAILURE_ANNOTATION: node.failure}
        now = _merged({k: v for k, v in kept.items() if v is not None}, annotations)
        self.nodes[name] = replace(
            node,
            labels=_merged(node.labels, labels),
            unschedulable=node.unschedulable if unschedulable is None else unschedulable,
            record=now.get(REPARTITION_ANNOTATION),
            failure=now.get(REPARTITION_FAILURE_ANNOTATION),
        )

    async def evict(self, namespace: str, name: str) -> str | None:
        if "evict" in self.fail:
            raise PartitionProblem(self.fail["evict"])
        key = f"{namespace}/{name}"
        if key in self.refuse:
            return self.refuse[key]
        self.evicted.append(key)
        return None

    async def read_config(self, ref: ConfigMapRef) -> tuple[str | None, str]:
        if "read" in self.fail:
            raise PartitionProblem(self.fail["read"])
        if self.config is None:
            raise PartitionProblem(f'configmaps "{ref.name}" not found')
        return self.config or None, str(self.version)

    async def write_config(self, ref: ConfigMapRef, text: str, resource_version: str) -> str:
        if "write" in self.fail:
            raise PartitionProblem(self.fail["write"])
        if resource_version != str(self.version):
            raise PartitionProblem("the object has been modified")
        self.config, self.version = text, self.version + 1
        self.writes.append(text)
        return str(self.version)


@dataclass
class FakeLease:
    """A LeaseStore: one record, versioned as the API server versions it (a write at a stale
    version conflicts), shared by the replicas of a test."""

    record: LeaseRecord | None = None
    down: Exception | None = None  # raised by every call, as an API server that is down
    writes: list[LeaseRecord] = field(default_factory=list)
    _version: int = 0

    def read(self) -> LeaseRecord | None:
        if self.down is not None:
            raise self.down
        return self.record

    def write(self, record: LeaseRecord) -> LeaseRecord:
        if self.down is not None:
            raise self.down
        current = self.record.version if self.record is not None else ""
        if record.version != current:
            raise LeaseConflict(f"409: written at {record.version!r}, now {current!r}")
        self._version += 1
        self.record = replace(record, version=str(self._version))
        self.writes.append(self.record)
        return self.record


async def never_fetched() -> Cycle:
    """A CycleClock's fetch where a test publishes its cycles itself."""
    raise AssertionError("no cycle is fetched here")


async def steps_taken() -> None:
    """Returns once every task created or woken before the call has taken its next step: a
    point in the loop's order (a callback queued after theirs), not a wait of some duration."""
    taken = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(taken.set_result, None)
    await taken
