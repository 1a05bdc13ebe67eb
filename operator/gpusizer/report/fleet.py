"""`gpusizer recommend`: every GPU workload in the cluster, what it runs on, what it uses and
what it should run on, with the monthly cost and the cost and energy per result now (measured)
and after (estimated), so a platform team sees the whole fleet's waste in one command; with
`--ledger`, what the operator saved against static provisioning. Workloads without a
WorkloadSizing get the default policy."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpusizer.api.v1alpha1 import (
    GROUP,
    PLURAL,
    VERSION,
    MetricsSpec,
    RightSizingSpec,
    WorkloadSizingSpec,
)
from gpusizer.catalog import Catalog
from gpusizer.efficiency import Efficiency, Figures, efficiency
from gpusizer.ledger import LedgerRow, fleet
from gpusizer.measurement import (
    measure_on_one_slice,
    measurements_from_status,
    pod_slice,
    serving_pods,
)
from gpusizer.policy.slices import SliceChoice, choose_slice
from gpusizer.rightsizing import current_slice, estimated_after
from gpusizer.signals.discovery import NodeInfo, node_info, offers
from gpusizer.signals.pods import PodInfo, pod_info
from gpusizer.signals.prometheus import PrometheusSource
from gpusizer.signals.reader import HistoryCache, read_ledger
from gpusizer.signals.usage import usage
from gpusizer.throughput import ThroughputBook, capacities, fingerprint

HOURS_PER_MONTH = 730.0
DEFAULT_TARGET_UTILIZATION = 70.0

WorkloadKey = tuple[str, str, str]  # (namespace, kind, name)


@dataclass(frozen=True)
class FleetRow:
    namespace: str
    kind: str
    name: str
    sized_by: str | None  # the WorkloadSizing whose rightSizing settings applied
    current_slice: str | None
    current_product: str | None
    replicas: int
    peak_memory_mib: float | None
    mean_utilization: float | None
    served_rps: float | None
    recommended_slice: str | None
    recommended_product: str | None
    recommended_replicas: int | None
    cost_per_month_now: float | None
    cost_per_month_after: float | None
    reason: str
    # what a result costs: measured now, estimated after the recommended move
    per_result_now: dict[str, float | None] = field(default_factory=dict)
    per_result_after: dict[str, float | None] = field(default_factory=dict)
    unknown: str = ""  # why a measured figure is missing
    throughput: str | None = None  # Measured or Estimated: what the recommendation rests on


def owners(
    pods: Sequence[Mapping[str, Any]], replica_sets: Sequence[Mapping[str, Any]]
) -> dict[str, WorkloadKey]:
    """pod uid -> the workload that owns it (a ReplicaSet's Deployment, else its direct owner)."""
    rs_owner: dict[tuple[str, str], tuple[str, str]] = {}
    for rs in replica_sets:
        meta = rs.get("metadata") or {}
        for ref in meta.get("owner_references") or meta.get("ownerReferences") or []:
            if ref.get("controller"):
                rs_owner[(meta.get("namespace", ""), meta.get("name", ""))] = (
                    ref.get("kind", ""),
                    ref.get("name", ""),
                )
    out: dict[str, WorkloadKey] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace", "")
        key: WorkloadKey = (namespace, "Pod", meta.get("name", ""))
        for ref in meta.get("owner_references") or meta.get("ownerReferences") or []:
            if not ref.get("controller"):
                continue
            kind, name = ref.get("kind", ""), ref.get("name", "")
            if kind == "ReplicaSet" and (namespace, name) in rs_owner:
                kind, name = rs_owner[(namespace, name)]
            key = (namespace, kind, name)
        out[meta.get("uid", "")] = key
    return out


def _sizings(
    items: Sequence[Mapping[str, Any]],
) -> dict[WorkloadKey, tuple[str, WorkloadSizingSpec]]:
    found = {}
    for item in items:
        meta = item.get("metadata") or {}
        try:
            spec = WorkloadSizingSpec.model_validate(item.get("spec") or {})
        except ValueError:
            continue
        key = (meta.get("namespace", ""), spec.target_ref.kind, spec.target_ref.name)
        found[key] = (meta.get("name", ""), spec)
    return found


def _learned(items: Sequence[Mapping[str, Any]]) -> ThroughputBook:
    """The throughput every WorkloadSizing measured, as the operator learned it."""
    book = ThroughputBook()
    for item in items:
        meta = item.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        book.learn(key, measurements_from_status(item.get("status")))
    return book


def _per_result(figures: Figures | None) -> dict[str, float | None]:
    return {} if figures is None else figures.as_dict()


def _list_cluster(api_client: k8s.ApiClient) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    core, apps = k8s.CoreV1Api(api_client), k8s.AppsV1Api(api_client)
    serialize = api_client.sanitize_for_serialization
    pods = serialize(core.list_pod_for_all_namespaces().items)
    replica_sets = serialize(apps.list_replica_set_for_all_namespaces().items)
    nodes = serialize(core.list_node().items)
    try:
        sizings = k8s.CustomObjectsApi(api_client).list_cluster_custom_object(
            GROUP, VERSION, PLURAL
        )["items"]
    except ApiException as exc:
        if exc.status != 404:
            raise
        sizings = []
    return pods, replica_sets, nodes, sizings


async def fleet_report(
    api_client: k8s.ApiClient,
    prometheus: PrometheusSource,
    catalog: Catalog,
    history_seconds: int,
) -> list[FleetRow]:
    pods_raw, replica_sets, nodes_raw, sizings_raw = await asyncio.to_thread(
        _list_cluster, api_client
    )
    nodes: dict[str, NodeInfo] = {}
    for raw in nodes_raw:
        node = node_info(raw)
        if node.allocatable:
            nodes[node.name] = node
    infos = {(raw.get("metadata") or {}).get("uid", ""): pod_info(raw) for raw in pods_raw}
    specs = {(raw.get("metadata") or {}).get("uid", ""): raw.get("spec") for raw in pods_raw}
    owner_of = owners(pods_raw, replica_sets)
    groups: dict[WorkloadKey, list[PodInfo]] = {}
    alike: dict[WorkloadKey, str | None] = {}
    for uid, info in infos.items():
        if info.gpu_resource and not info.terminating:
            groups.setdefault(owner_of[uid], []).append(info)
            alike.setdefault(owner_of[uid], fingerprint(specs[uid], info.gpu_container))
    sizings = _sizings(sizings_raw)
    book = _learned(sizings_raw)
    now = time.time()
    windows = {history_seconds} | {s.right_sizing.history_seconds for _, s in sizings.values()}
    cache = HistoryCache(prometheus, period_seconds=0)
    histories = {w: await cache.get(w) for w in windows}
    cluster_offers = offers(catalog, nodes.values(), infos.values())
    rows = []
    for key in sorted(groups):
        pods = groups[key]
        sized = sizings.get(key)
        spec = sized[1].right_sizing if sized else RightSizingSpec()
        target = DEFAULT_TARGET_UTILIZATION
        minimum = 1
        if sized:
            target = sized[1].replicas.target_gpu_utilization or target
            minimum = max(1, sized[1].replicas.minimum)
        current, _ = current_slice(catalog, pods, nodes, None)
        history = histories[spec.history_seconds if sized else history_seconds]
        measured, problems = usage(history, pods, now)
        slices = {(p.namespace, p.name): pod_slice(catalog, p, nodes) for p in pods}
        max_age = (sized[1].metrics if sized else MetricsSpec()).max_sample_age_seconds
        found = efficiency(history, serving_pods(pods, slices, history, max_age), catalog)
        fresh = measure_on_one_slice(history, pods, slices, alike[key])
        if fresh is not None:
            book.learn(("", f"{key[0]}/{key[1]}/{key[2]}"), [fresh])
        if current is None:
            rows.append(_row(key, sized, None, measured, None, "GPU or product not in the catalog"))
            continue
        choice = choose_slice(
            current,
            measured,
            cluster_offers,
            spec,
            target_utilization=target,
            min_replicas=minimum,
            now=now,
            measured=capacities(book.measured(alike[key])).per_slice,
        )
        reason = choice.message + (f" ({'; '.join(problems)})" if problems else "")
        row = _row(key, sized, current, measured, choice, reason)
        rows.append(_with_results(row, choice, found, estimated_after(choice, measured, found)))
    return rows


def _with_results(
    row: FleetRow, choice: SliceChoice, now: Efficiency, after: Figures | None
) -> FleetRow:
    best = choice.recommended
    return replace(
        row,
        per_result_now=_per_result(now.figures),
        per_result_after=_per_result(after),
        unknown="; ".join(now.unknown),
        throughput=None if best is None else ("Measured" if best.measured else "Estimated"),
    )


def _row(
    key: WorkloadKey, sized: Any, current: Any, measured: Any, choice: Any, reason: str
) -> FleetRow:
    namespace, kind, name = key
    best = choice.recommended if choice else None
    now_cost = choice.current_cost_per_hour if choice else None
    return FleetRow(
        namespace=namespace,
        kind=kind,
        name=name,
        sized_by=sized[0] if sized else None,
        current_slice=current.name if current else None,
        current_product=current.product.key if current else None,
        replicas=measured.replicas,
        peak_memory_mib=measured.peak_memory_mib,
        mean_utilization=measured.mean_utilization,
        served_rps=measured.served_rps,
        recommended_slice=best.slice.name if best else None,
        recommended_product=best.slice.product.key if best else None,
        recommended_replicas=best.replicas if best else None,
        cost_per_month_now=round(now_cost * HOURS_PER_MONTH, 2) if now_cost is not None else None,
        cost_per_month_after=round(best.cost_per_hour * HOURS_PER_MONTH, 2) if best else None,
        reason=reason,
    )


def totals(rows: Sequence[FleetRow]) -> tuple[float, float]:
    """Monthly cost now and after; a workload without a recommendation keeps its cost."""
    now = sum(r.cost_per_month_now or 0 for r in rows)
    after = sum(
        (r.cost_per_month_after if r.cost_per_month_after is not None else r.cost_per_month_now)
        or 0
        for r in rows
    )
    return now, after


def render_json(
    rows: Sequence[FleetRow],
    currency: str,
    ledger: Sequence[LedgerRow] | None = None,
    problems: Sequence[str] = (),
) -> str:
    now, after = totals(rows)
    document: dict[str, Any] = {
        "currency": currency,
        "workloads": [asdict(r) for r in rows],
        "total": {"cost_per_month_now": round(now, 2), "cost_per_month_after": round(after, 2)},
    }
    if ledger is not None:
        document["ledger"] = [asdict(r) for r in ledger]
        document["ledger_not_read"] = list(problems)
    return json.dumps(document, indent=2)


def _cells(table: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render_table(rows: Sequence[FleetRow]) -> str:
    num = _num
    header = [
        "NAMESPACE",
        "WORKLOAD",
        "SLICE",
        "REPLICAS",
        "PEAK MiB",
        "GPU%",
        "RECOMMENDED",
        "$/MONTH NOW",
        "$/MONTH AFTER",
        "$/1K REQ NOW",
        "AFTER",
        "kWh/1K REQ NOW",
        "AFTER",
    ]
    table = [header]
    for r in rows:
        current = f"{r.current_slice}@{r.current_product}" if r.current_slice else "-"
        recommended = (
            f"{r.recommended_replicas} x {r.recommended_slice}@{r.recommended_product}"
            if r.recommended_slice
            else "-"
        )
        table.append(
            [
                r.namespace,
                f"{r.kind.lower()}/{r.name}",
                current,
                str(r.replicas),
                num(r.peak_memory_mib, ".0f"),
                num(r.mean_utilization, ".1f"),
                recommended,
                num(r.cost_per_month_now, ",.0f"),
                num(r.cost_per_month_after, ",.0f"),
                num(r.per_result_now.get("cost_per_1k_requests"), ".4g"),
                num(r.per_result_after.get("cost_per_1k_requests"), ".4g"),
                num(r.per_result_now.get("kwh_per_1k_requests"), ".4g"),
                num(r.per_result_after.get("kwh_per_1k_requests"), ".4g"),
            ]
        )
    lines = _cells(table)
    total_now, total_after = totals(rows)
    lines.append(f"\nTotal: ${total_now:,.0f}/month now, ${total_after:,.0f}/month after.")
    lines.append(
        "Per 1K requests: measured over each workload's window now; after the recommended move "
        "estimated, from throughput measured or estimated as each line says."
    )
    for r in rows:
        lines.append(f"  {r.namespace}/{r.name}: {r.reason}")
        if r.unknown:
            lines.append(f"    unknown: {r.unknown}")
    return "\n".join(lines)


async def ledger_report(prometheus: PrometheusSource) -> tuple[list[LedgerRow], list[str]]:
    """Every followed workload's ledger over each window, then the fleet's."""
    rows, problems = await read_ledger(prometheus)
    windows = list(dict.fromkeys(r.window for r in rows))
    return rows + [fleet(w, [r for r in rows if r.window == w]) for w in windows], problems


def render_ledger(rows: Sequence[LedgerRow], problems: Sequence[str], currency: str) -> str:
    """Used against static provisioning for the observed peak, per workload and fleet-wide."""
    if not rows:
        why = "; ".join(problems) or (
            "Prometheus has no gpusizer_tracked_seconds_total: it must scrape the operator's "
            "/metrics (chart: metrics.serviceMonitor.enabled)"
        )
        return f"\nNo savings ledger: {why}."
    header = ["WINDOW", "WORKLOAD", "GPU-H USED", "STATIC", f"{currency} USED", "STATIC"]
    header += ["kWh USED", "STATIC", "SAVED"]
    table = [header]
    for r in rows:
        saved = r.saved(r.cost_used, r.cost_static)
        share = None if saved is None or not r.cost_static else saved / r.cost_static
        table.append(
            [
                r.window,
                f"{r.namespace}/{r.name}" if r.name else "fleet",
                _num(r.gpu_hours_used, ".3f"),
                _num(r.gpu_hours_static, ".3f"),
                _num(r.cost_used, ",.2f"),
                _num(r.cost_static, ",.2f"),
                _num(r.kwh_used, ".3f"),
                _num(r.kwh_static, ".3f"),
                "-" if share is None else f"{share:.0%}",
            ]
        )
    note = (
        "Used: what the pods held (GPU-equivalents), at catalog prices, and their measured GPU "
        "energy; static: the observed peak held for as long as the operator followed the workload."
    )
    return "\n".join(["", *_cells(table), note, *(f"  not read: {p}" for p in problems)])
