"""`gpusizer recommend`: every GPU workload in the cluster, what it runs on, what it uses and
what it should run on, with the monthly cost now and after, so a platform team sees the whole
fleet's waste in one command. Workloads without a WorkloadSizing get the default policy."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
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
from gpusizer.policy.slices import choose_slice
from gpusizer.rightsizing import current_slice
from gpusizer.signals.discovery import NodeInfo, node_info, offers
from gpusizer.signals.pods import PodInfo, pod_info
from gpusizer.signals.prometheus import PrometheusSource
from gpusizer.signals.reader import HistoryCache
from gpusizer.signals.usage import usage

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
    owner_of = owners(pods_raw, replica_sets)
    groups: dict[WorkloadKey, list[PodInfo]] = {}
    for uid, info in infos.items():
        if info.gpu_resource and not info.terminating:
            groups.setdefault(owner_of[uid], []).append(info)
    sizings = _sizings(sizings_raw)
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
        server = sized[1].metrics.server if sized else MetricsSpec().server
        if sized:
            target = sized[1].replicas.target_gpu_utilization or target
            minimum = max(1, sized[1].replicas.minimum)
        current, _ = current_slice(catalog, pods, nodes, None)
        window = spec.history_seconds if sized else history_seconds
        measured, problems = usage(histories[window], pods, server, now)
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
        )
        reason = choice.message + (f" ({'; '.join(problems)})" if problems else "")
        rows.append(_row(key, sized, current, measured, choice, reason))
    return rows


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


def render_json(rows: Sequence[FleetRow]) -> str:
    now, after = totals(rows)
    return json.dumps(
        {
            "workloads": [asdict(r) for r in rows],
            "total": {"cost_per_month_now": round(now, 2), "cost_per_month_after": round(after, 2)},
        },
        indent=2,
    )


def render_table(rows: Sequence[FleetRow]) -> str:
    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

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
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]
    total_now, total_after = totals(rows)
    lines.append(f"\nTotal: ${total_now:,.0f}/month now, ${total_after:,.0f}/month after.")
    for r in rows:
        lines.append(f"  {r.namespace}/{r.name}: {r.reason}")
    return "\n".join(lines)
