"""The operator's own Prometheus metrics, served on the metrics port."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.utils import floatToGoString

from gpusizer.api.v1alpha1 import Condition
from gpusizer.signals.queries import (
    ENERGY_JOULES,
    HELD_COST,
    HELD_COST_PER_HOUR,
    HELD_GPU_SECONDS,
    HELD_GPUS,
    HELD_IDLE_JOULES,
    HELD_IDLE_WATTS,
    TRACKED_SECONDS,
)

QUERY_SECONDS = Histogram(
    "gpusizer_prometheus_query_duration_seconds",
    "Time from sending a Prometheus query to having its samples read, by signal: it "
    "includes the wait for other answers of the same read, decoded one at a time.",
    ["signal"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
QUERY_ERRORS = Counter(
    "gpusizer_prometheus_query_errors_total",
    "Failed Prometheus queries, by signal and reason.",
    ["signal", "reason"],
)
PROMETHEUS_AVAILABLE = Gauge(
    "gpusizer_prometheus_available",
    "0 while Prometheus answers none of the operator's queries (every workload holds its "
    "replicas), else 1: the one signal of such an outage for the whole fleet.",
)
IN_CHARGE = Gauge(
    "gpusizer_in_charge",
    "1 while this replica holds the operator's Lease and acts (always, without --peering), "
    "else 0: exactly one replica of an installation says 1.",
)
PODS_MISSED_DELETIONS = Gauge(
    "gpusizer_pods_missed_deletions",
    "Pods the watch's cache still holds that the API server no longer has (deleted while a "
    "watch was down; kopf keeps them), left out of every decision.",
)
QUIET_WORKLOADS = Gauge(
    "gpusizer_quiet_workloads",
    "Workloads whose last turn found nothing that time alone could change: each is decided "
    "every four sync periods (within a minute) until something it reads changes.",
)
PROMETHEUS_OUTAGES = Counter(
    "gpusizer_prometheus_outages",
    "Times Prometheus stopped answering every query of a read.",
)
RECONCILE_SECONDS = Histogram(
    "gpusizer_reconcile_duration_seconds",
    "Time to decide one WorkloadSizing (observe, decide, act); the count is the number of "
    "decisions, so workloads / decision rate is the time to decide every workload once.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
DECISION_LAG_SECONDS = Histogram(
    "gpusizer_decision_lag_seconds",
    "Time from a cycle's snapshot to a workload's decision on it: how far behind the operator "
    "runs when it decides thousands of workloads.",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
KUBE_API_REQUESTS = Counter(
    "gpusizer_kube_api_requests_total",
    "Requests the operator sent to the Kubernetes API server (watches excluded), by verb.",
    ["verb"],
)
STATUS_WRITES = Counter(
    "gpusizer_status_writes_total",
    "WorkloadSizing status patches, counted once per top-level status field they carry: what "
    "makes the operator write.",
    ["field"],
)
CYCLE_SECONDS = Histogram(
    "gpusizer_snapshot_duration_seconds",
    "Time to fetch one cycle's batched signals for all workloads, by read: full (every pod, "
    "once per sync period) or moved (only the pods whose readings moved, between them).",
    ["read"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

ACTIVATOR_WAKE_SECONDS = Histogram(
    "gpusizer_activator_wake_seconds",
    "At each wake from zero by requests the activator held: from the first of them to the "
    "operator's /scale write.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


@dataclass(slots=True)
class WorkloadSeries:
    """What one WorkloadSizing exports, as plain values: prometheus_client's labelled metrics
    keep an object per series, nine per workload (bench/README.md)."""

    desired: int | None = None  # None until decided: no replica gauges before that
    current: int = 0
    metrics_known: bool = False
    decisions: dict[str, int] = field(default_factory=dict)  # by reason
    scale_writes: dict[str, int] = field(default_factory=dict)  # by result
    reconcile_errors: int = 0
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)  # type: status, reason
    gauges: dict[str, float] = field(default_factory=dict)  # EFFICIENCY_GAUGES, HELD_GAUGES
    accounted: dict[str, float] = field(default_factory=dict)  # HELD_COUNTERS
    ledger: dict[tuple[str, str, str], float] = field(default_factory=dict)  # see `ledger`


# What a result costs, measured over the right-sizing window (status.efficiency).
EFFICIENCY_GAUGES: dict[str, str] = {
    "gpusizer_cost_per_1k_requests": "Cost per 1,000 requests, in the GPU catalog's currency, "
    "measured over the right-sizing window.",
    "gpusizer_cost_per_million_output_tokens": "Cost per million output tokens, measured over "
    "the right-sizing window.",
    "gpusizer_kwh_per_1k_requests": "GPU energy per 1,000 requests, kWh, measured over the "
    "right-sizing window.",
    "gpusizer_kwh_per_million_output_tokens": "GPU energy per million output tokens, kWh, "
    "measured over the right-sizing window.",
    "gpusizer_output_tokens_per_second_per_cost_per_hour": "Output tokens per second for each "
    "unit of cost per hour, measured over the right-sizing window.",
    "gpusizer_power_watts": "Mean GPU power of the serving pods over the right-sizing window, "
    "W (a MIG slice's share of its GPU's).",
}
# What the workload's pods hold now (the savings ledger's peak).
HELD_GAUGES: dict[str, str] = {
    HELD_GPUS: "GPUs the workload's pods hold now; a MIG slice counts as its share of its GPU.",
    HELD_COST_PER_HOUR: "Cost per hour of what the workload's pods hold now.",
    HELD_IDLE_WATTS: "Idle power of what the workload's pods hold now, W (the catalog's).",
}
# What the workload's pods held, counted at each turn (the savings ledger's use).
HELD_COUNTERS: dict[str, str] = {
    HELD_GPU_SECONDS: "GPU-seconds the workload's pods held (a MIG slice as its share).",
    HELD_COST: "Cost of what the workload's pods held, in the GPU catalog's currency.",
    HELD_IDLE_JOULES: "Idle energy of what the workload's pods held, J (the catalog's power).",
    ENERGY_JOULES: "GPU energy of the workload's serving pods, J: their draw measured over the "
    "last right-sizing period, for the time they held their GPUs.",
    TRACKED_SECONDS: "Seconds the operator followed the workload.",
}
# The savings ledger: used against static provisioning for the observed peak.
LEDGER_GAUGES: dict[str, str] = {
    "gpusizer_ledger_gpu_hours": "GPU-hours over the window, by basis: used, or static "
    "(the observed peak held throughout).",
    "gpusizer_ledger_cost": "Cost over the window, by basis: used, or static.",
    "gpusizer_ledger_kwh": "GPU energy over the window, kWh, by basis: used, or static.",
}


class WorkloadCollector:
    """The per-WorkloadSizing series, written from plain records when scraped. Updates come from
    the event loop and scrapes from the HTTP server's thread, hence the lock. An update
    replaces the dicts of a workload's series it changes, never changes one in place, so a
    scrape takes the list of workloads under the lock and reads their series without it: no
    copy of them, and no wait for the decisions' updates while the scrape writes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[tuple[str, str], WorkloadSeries] = {}

    def decided(
        self, namespace: str, name: str, reason: str, desired: int, current: int, known: bool
    ) -> None:
        with self._lock:
            series = self._of(namespace, name)
            series.decisions = _counted(series.decisions, reason)
            series.desired, series.current, series.metrics_known = desired, current, known

    def scale_written(self, namespace: str, name: str, result: str) -> None:
        with self._lock:
            series = self._of(namespace, name)
            series.scale_writes = _counted(series.scale_writes, result)

    def reconcile_failed(self, namespace: str, name: str) -> None:
        with self._lock:
            self._of(namespace, name).reconcile_errors += 1

    def set_conditions(self, namespace: str, name: str, conditions: Iterable[Condition]) -> None:
        """One series per condition type, following its status and reason."""
        with self._lock:
            series = self._of(namespace, name)
            shown = dict(series.conditions)
            for condition in conditions:
                shown[condition.type] = (condition.status, condition.reason)
            series.conditions = shown

    def gauges(self, namespace: str, name: str, values: Mapping[str, float | None]) -> None:
        """Set EFFICIENCY_GAUGES and HELD_GAUGES; None drops the series (unknown)."""
        with self._lock:
            series = self._of(namespace, name)
            shown = dict(series.gauges)
            for key, value in values.items():
                if value is None:
                    shown.pop(key, None)
                else:
                    shown[key] = value
            series.gauges = shown

    def account(self, namespace: str, name: str, increments: Mapping[str, float]) -> None:
        """Add to HELD_COUNTERS."""
        with self._lock:
            series = self._of(namespace, name)
            counted = dict(series.accounted)
            for key, value in increments.items():
                counted[key] = counted.get(key, 0.0) + max(0.0, value)
            series.accounted = counted

    def ledger(
        self, namespace: str, name: str, values: Mapping[tuple[str, str, str], float]
    ) -> None:
        """The workload's ledger: (LEDGER_GAUGES name, window, basis) -> value, all at once."""
        with self._lock:
            self._of(namespace, name).ledger = dict(values)

    def forget(self, namespace: str, name: str) -> None:
        """Drop every series of a deleted workload, counters too: dashboards show no ghosts and
        an operator with churn does not keep what it no longer sizes."""
        with self._lock:
            self._series.pop((namespace, name), None)

    def _of(self, namespace: str, name: str) -> WorkloadSeries:
        series = self._series.get((namespace, name))
        if series is None:
            series = self._series[(namespace, name)] = WorkloadSeries()
        return series

    def exposition(self) -> Iterator[bytes]:
        """Every per-workload family in the text format (0.0.4), as prometheus_client's
        `generate_latest` writes it (tests/unit/test_report_metrics.py holds it to that).
        Written here, not through prometheus_client's families: a Sample and a label dict per
        series, validated and escaped one by one, took seconds of CPU a scrape at 10,000
        workloads, in a thread that shares the interpreter with every decision (bench/README.md,
        "Issue 29: the operator's own /metrics"). Written a family at a time, in chunks of
        CHUNK_LINES lines, from the series as they stand (see the class): a copy of every
        workload's series taken first was most of what a scrape allocated (bench/README.md,
        "Issue 29: a wave of status writes; a scrape's memory")."""
        with self._lock:
            workloads = list(self._series.items())
        escaped = [((_escape(namespace), _escape(name)), s) for (namespace, name), s in workloads]
        for family in WORKLOAD_FAMILIES:
            yield from _text(family, escaped)


def _counted(counts: Mapping[str, int], key: str) -> dict[str, int]:
    """`counts` with one more `key`, as a new dict (see `WorkloadCollector`)."""
    return {**counts, key: counts.get(key, 0) + 1}


# A family's samples of one workload: the label values past namespace and name, and the value.
Samples = Callable[[WorkloadSeries], Iterable[tuple[tuple[str, ...], float]]]


class Family(NamedTuple):
    kind: str  # "counter" or "gauge"
    name: str
    help: str
    labels: tuple[str, ...]  # past namespace and name
    samples: Samples

    @property
    def exposed(self) -> str:
        """The name a scrape shows: a counter's with `_total`."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


CHUNK_LINES = 1000
"""Lines of a family sent at once: about 100 KiB of text."""


def _text(
    family: Family, workloads: Iterable[tuple[tuple[str, str], WorkloadSeries]]
) -> Iterator[bytes]:
    """The family's lines, labels in the order of their names and each value as Go prints it:
    what `generate_latest` writes. `workloads` are keyed by escaped names."""
    name = family.exposed
    names = ("namespace", "name", *family.labels)
    order = sorted(range(len(names)), key=names.__getitem__)
    in_order = itemgetter(*order)
    line = name + "{" + ",".join(f'{names[i]}="%s"' for i in order) + "} %s\n"
    doc = family.help.replace("\\", r"\\").replace("\n", r"\n")
    lines = [f"# HELP {name} {doc}\n# TYPE {name} {family.kind}\n"]
    for key, series in workloads:
        for extra, value in family.samples(series):
            labels = in_order((*key, *map(_escape_label, extra)))
            go_value = floatToGoString(value)  # type: ignore[no-untyped-call]  # untyped upstream
            lines.append(line % (*labels, go_value))
        if len(lines) >= CHUNK_LINES:
            yield "".join(lines).encode()
            lines.clear()
    yield "".join(lines).encode()


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@functools.lru_cache(maxsize=1024)
def _escape_label(value: str) -> str:
    """`_escape` of a label past namespace and name: reasons, results, condition types and
    windows, a few dozen values that recur on every workload's lines."""
    return _escape(value)


def _decided(value: Callable[[WorkloadSeries], float]) -> Samples:
    """One sample once the workload was decided, none before."""
    return lambda series: [((), value(series))] if series.desired is not None else ()


def _by(field_of: Callable[[WorkloadSeries], Mapping[str, float]]) -> Samples:
    return lambda series: (((label,), value) for label, value in field_of(series).items())


def _one(field_of: Callable[[WorkloadSeries], Mapping[str, float]], name: str) -> Samples:
    return lambda series: [((), field_of(series)[name])] if name in field_of(series) else ()


def _ledger(name: str) -> Samples:
    return lambda series: (
        ((window, basis), value)
        for (family, window, basis), value in series.ledger.items()
        if family == name
    )


_FIXED_FAMILIES: tuple[Family, ...] = (
    Family(
        "counter",
        "gpusizer_decisions",
        "Replica decisions made, by outcome reason.",
        ("reason",),
        _by(lambda series: series.decisions),
    ),
    Family(
        "gauge",
        "gpusizer_desired_replicas",
        "Replicas the operator wants.",
        (),
        _decided(lambda series: series.desired or 0),
    ),
    Family(
        "gauge",
        "gpusizer_current_replicas",
        "Replicas the target has.",
        (),
        _decided(lambda series: series.current),
    ),
    Family(
        "gauge",
        "gpusizer_metrics_available",
        "1 when every signal the workload needs is known, else 0.",
        (),
        _decided(lambda series: 1 if series.metrics_known else 0),
    ),
    Family(
        "counter",
        "gpusizer_scale_writes",
        "Writes to a target's /scale subresource, by result.",
        ("result",),
        _by(lambda series: series.scale_writes),
    ),
    Family(
        "counter",
        "gpusizer_reconcile_errors",
        "Reconcile cycles that ended in an unexpected error.",
        (),
        lambda series: [((), series.reconcile_errors)] if series.reconcile_errors else (),
    ),
    Family(
        "gauge",
        "gpusizer_condition",
        "1 for each WorkloadSizing condition as it stands, so alerts can match type and reason.",
        ("type", "status", "reason"),
        lambda series: (
            ((type_, status, reason), 1) for type_, (status, reason) in series.conditions.items()
        ),
    ),
)


_GAUGE_HELP = {**EFFICIENCY_GAUGES, **HELD_GAUGES}

# every per-workload family, in the order a scrape shows them
WORKLOAD_FAMILIES: tuple[Family, ...] = (
    *_FIXED_FAMILIES,
    *(
        Family("gauge", name, doc, (), _one(lambda s: s.gauges, name))
        for name, doc in _GAUGE_HELP.items()
    ),
    *(
        Family("counter", name, doc, (), _one(lambda s: s.accounted, name))
        for name, doc in HELD_COUNTERS.items()
    ),
    *(
        Family("gauge", name, doc, ("window", "basis"), _ledger(name))
        for name, doc in LEDGER_GAUGES.items()
    ),
)

WORKLOADS = WorkloadCollector()


def exposition() -> Iterator[bytes]:
    """What a scrape of the operator reads: the registry's metrics, then every workload's."""
    yield generate_latest(REGISTRY)
    yield from WORKLOADS.exposition()
