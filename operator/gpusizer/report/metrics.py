"""The operator's own Prometheus metrics, served on the metrics port."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping

from prometheus_client import Counter, Gauge, Histogram

DECISIONS = Counter(
    "gpusizer_decisions_total",
    "Replica decisions made, by outcome reason.",
    ["namespace", "name", "reason"],
)
DESIRED_REPLICAS = Gauge(
    "gpusizer_desired_replicas", "Replicas the operator wants.", ["namespace", "name"]
)
CURRENT_REPLICAS = Gauge(
    "gpusizer_current_replicas", "Replicas the target has.", ["namespace", "name"]
)
METRICS_AVAILABLE = Gauge(
    "gpusizer_metrics_available",
    "1 when every signal the workload needs is known, else 0.",
    ["namespace", "name"],
)
SCALE_WRITES = Counter(
    "gpusizer_scale_writes_total",
    "Writes to a target's /scale subresource, by result.",
    ["namespace", "name", "result"],
)
QUERY_SECONDS = Histogram(
    "gpusizer_prometheus_query_duration_seconds",
    "Latency of Prometheus queries, by signal.",
    ["signal"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
QUERY_ERRORS = Counter(
    "gpusizer_prometheus_query_errors_total",
    "Failed Prometheus queries, by signal and reason.",
    ["signal", "reason"],
)
RECONCILE_ERRORS = Counter(
    "gpusizer_reconcile_errors_total",
    "Reconcile cycles that ended in an unexpected error.",
    ["namespace", "name"],
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
    "Time to fetch one cycle's batched signals for all workloads.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


CONDITION = Gauge(
    "gpusizer_condition",
    "1 for each WorkloadSizing condition as it stands, so alerts can match type and reason.",
    ["namespace", "name", "type", "status", "reason"],
)
_condition_labels: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}


def set_conditions(namespace: str, name: str, conditions: Iterable[Mapping[str, str]]) -> None:
    """One series per condition; the previous status/reason series of a type is removed."""
    shown = _condition_labels.setdefault((namespace, name), {})
    for condition in conditions:
        type_, now = condition["type"], (condition["status"], condition["reason"])
        before = shown.get(type_)
        if before == now:  # already 1: label lookups for every condition of every workload
            continue  # each cycle were 3 % of the operator's time at 1,000 (bench/scale.py)
        if before is not None:
            with contextlib.suppress(KeyError):
                CONDITION.remove(namespace, name, type_, *before)
        CONDITION.labels(namespace, name, type_, *now).set(1)
        shown[type_] = now


def forget(namespace: str, name: str) -> None:
    """Drop a deleted workload's series so dashboards do not show ghosts."""
    for gauge in (DESIRED_REPLICAS, CURRENT_REPLICAS, METRICS_AVAILABLE):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
    for type_, (status, reason) in _condition_labels.pop((namespace, name), {}).items():
        with contextlib.suppress(KeyError):
            CONDITION.remove(namespace, name, type_, status, reason)
