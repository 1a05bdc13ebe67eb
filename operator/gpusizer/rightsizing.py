"""Right-sizing for one workload: measure, choose a slice, and in Auto move there or roll back.

The in-flight reshape and the previous slice live in annotations on the target, so a restarted
operator picks up a rollout where the last one left it and never starts a second one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpusizer.actuate.targets import SliceChange, TargetProblem, Targets, TargetView
from gpusizer.api.v1alpha1 import Mode, WorkloadSizingSpec
from gpusizer.catalog import Catalog, Slice
from gpusizer.catalog.models import PRODUCT_LABEL
from gpusizer.policy.reshape import NewPods, Progress, reshape_progress
from gpusizer.policy.slices import SliceChoice, choose_slice
from gpusizer.report.events import EventIntent
from gpusizer.report.status import ConditionState
from gpusizer.signals.discovery import NodeInfo, OfferCache
from gpusizer.signals.history import HistoryCache, usage
from gpusizer.signals.pods import PodInfo
from gpusizer.timefmt import iso, parse_time
from gpusizer.vocabulary import ConditionType, EventReason, Reason

log = logging.getLogger(__name__)

RESHAPE_ANNOTATION = "gpusizer.io/reshape"
PREVIOUS_SLICE_ANNOTATION = "gpusizer.io/previous-slice"


@dataclass(frozen=True)
class RightSizingSettings:
    catalog: Catalog
    history: HistoryCache
    offers: OfferCache
    reshape_deadline_seconds: float = 600.0
    min_reshape_interval_seconds: float = 3600.0


@dataclass
class RightSizingOutcome:
    condition: ConditionState | None = None
    recommendation: dict[str, Any] | None = None
    events: list[EventIntent] = field(default_factory=list)
    reshaping: bool = False  # replica changes wait while a rollout is in flight


def _placement(slice_: Slice, replicas: int) -> dict[str, Any]:
    return {
        "slice": slice_.name,
        "product": slice_.product.key,
        "resource": slice_.resource,
        "productLabel": slice_.product.gfd_label,
        "replicas": replicas,
    }


def _read_reshape(target: TargetView) -> dict[str, Any] | None:
    raw = target.annotations.get(RESHAPE_ANNOTATION)
    if not raw:
        return None
    try:
        state = json.loads(raw)
    except ValueError:
        log.warning("ignoring unreadable %s annotation: %r", RESHAPE_ANNOTATION, raw[:200])
        return None
    return state if isinstance(state, dict) else None


def _moved(record: Mapping[str, Any]) -> str:
    to = record.get("to") or {}
    return f"now on {to.get('slice')} ({to.get('product')}): {record.get('message')}"


def _finished_move_to(state: Mapping[str, Any] | None, current: Slice) -> str | None:
    """What the last reshape said, if it finished by moving the workload to `current`."""
    if state is None or state.get("state") != "Done":
        return None
    to = state.get("to") or {}
    if (to.get("slice"), to.get("product")) != (current.name, current.product.key):
        return None
    return _moved(state)


def current_slice(
    catalog: Catalog,
    pods: Iterable[PodInfo],
    nodes: Mapping[str, NodeInfo],
    target: TargetView | None,
) -> tuple[Slice | None, int]:
    """The slice the workload runs on (from a placed pod, else its template) and units/pod."""
    for pod in pods:
        node = nodes.get(pod.node or "")
        if pod.gpu_resource and node and node.product_label and not pod.terminating:
            found = catalog.slice_for(pod.gpu_resource, node.product_label)
            if found is not None:
                return found, max(1, pod.gpu_count)
    spec = (target.pod_spec if target else None) or {}
    product = (spec.get("nodeSelector") or {}).get(PRODUCT_LABEL)
    for container in spec.get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        for resource, count in limits.items():
            if str(resource).startswith("nvidia.com/") and product:
                found = catalog.slice_for(str(resource), product)
                if found is not None:
                    return found, max(1, int(str(count)))
    return None, 1


def _gpu_container(spec: WorkloadSizingSpec, target: TargetView) -> str | None:
    if spec.container:
        return spec.container
    for container in (target.pod_spec or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        if any(str(r).startswith("nvidia.com/") for r in limits):
            return str(container.get("name"))
    return None


def _recommendation(choice: SliceChoice) -> dict[str, Any]:
    best = choice.recommended
    return {
        "slice": best.slice.name if best else None,
        "resource": best.slice.resource if best else None,
        "nodeSelector": best.slice.node_selector if best else {},
        "replicas": best.replicas if best else None,
        "costPerHour": round(best.cost_per_hour, 2) if best else None,
        "currentCostPerHour": round(choice.current_cost_per_hour, 2)
        if choice.current_cost_per_hour is not None
        else None,
        "reason": choice.message,
    }


async def right_size(
    spec: WorkloadSizingSpec,
    namespace: str,
    target: TargetView,
    owned: Sequence[PodInfo],
    all_pods: Callable[[], Iterable[PodInfo]],
    nodes: Mapping[str, NodeInfo],
    settings: RightSizingSettings,
    targets: Targets,
    may_act: bool,
    now: float,
) -> RightSizingOutcome:
    """`may_act` is False in Recommend mode, while paused, and when another autoscaler owns
    the target: then this only reports."""
    rs = spec.right_sizing
    out = RightSizingOutcome()
    state = _read_reshape(target)
    if state is not None and state.get("state") == "InProgress":
        return await _follow_reshape(spec, namespace, target, owned, state, settings, targets, now)

    catalog = settings.catalog
    current, units = current_slice(catalog, owned, nodes, target)
    if current is None:
        out.condition = ConditionState(
            ConditionType.RIGHT_SIZED,
            None,
            Reason.UNKNOWN_SLICE,
            "the workload's GPU resource and node product are not in the catalog",
        )
        return out
    history = await settings.history.get(rs.history_seconds)
    measured, problems = usage(history, owned, spec.metrics.server, now)
    rules = spec.replicas
    choice = choose_slice(
        current=current,
        usage=measured,
        offers=settings.offers.get(nodes.values(), all_pods, now),
        spec=rs,
        target_utilization=rules.target_gpu_utilization or 70.0,
        min_replicas=max(1, rules.minimum),
        last_reshape_time=parse_time((state or {}).get("started")),
        min_interval_seconds=settings.min_reshape_interval_seconds,
        now=now,
    )
    out.recommendation = _recommendation(choice)
    message = choice.message + (
        f" (measurement problems: {'; '.join(problems)})" if problems else ""
    )
    right = choice.reason in (Reason.RIGHT_SIZED, Reason.SAVING_TOO_SMALL)
    status: bool | None = right
    if choice.reason == Reason.NO_MEASUREMENT:
        status = None
    out.condition = ConditionState(ConditionType.RIGHT_SIZED, status, choice.reason, message)
    if (state or {}).get("state") == "RolledBack" and choice.reason == Reason.TOO_SOON:
        out.condition = ConditionState(
            ConditionType.RIGHT_SIZED,
            False,
            Reason.RESHAPE_ROLLED_BACK,
            f"{state.get('message')}; {choice.message}" if state else choice.message,
        )
    moved_here = _finished_move_to(state, current)
    if choice.reason == Reason.NO_MEASUREMENT and moved_here is not None:
        # the move stands, with the recommendation that made it, until the slice is measured
        out.recommendation = None
        out.condition = ConditionState(
            ConditionType.RIGHT_SIZED, True, Reason.RIGHT_SIZED, moved_here
        )
    best = choice.recommended
    if not (choice.apply and best is not None and rs.mode == Mode.AUTO and may_act):
        return out
    container = _gpu_container(spec, target)
    if container is None:
        out.condition = ConditionState(
            ConditionType.RIGHT_SIZED, False, Reason.UNKNOWN_SLICE, "no container requests a GPU"
        )
        return out
    replicas = min(rules.maximum, max(best.replicas, rules.minimum, 1))
    origin = _placement(current, target.replicas)
    record = {
        "state": "InProgress",
        "from": origin,
        "to": _placement(best.slice, replicas),
        "units": units,
        "container": container,
        "started": iso(now),
        "deadlineSeconds": settings.reshape_deadline_seconds,
        "message": message,
    }
    change = SliceChange(
        container=container,
        old_resource=current.resource,
        new_resource=best.slice.resource,
        count=units,
        product_label=best.slice.product.gfd_label,
        replicas=replicas,
        annotations={
            RESHAPE_ANNOTATION: json.dumps(record, sort_keys=True),
            PREVIOUS_SLICE_ANNOTATION: json.dumps(origin, sort_keys=True),
        },
    )
    try:
        await targets.reshape(namespace, spec.target_ref, change)
    except TargetProblem as exc:
        out.condition = ConditionState(
            ConditionType.RIGHT_SIZED, False, Reason.SCALE_FAILED, str(exc)
        )
        return out
    started = (
        f"moving from {target.replicas} x {current.name} to {replicas} x {best.slice.name}: "
        f"{message}"
    )
    out.events.append(EventIntent("Normal", EventReason.RESHAPE_STARTED, started))
    out.condition = ConditionState(ConditionType.RIGHT_SIZED, False, Reason.RESHAPING, started)
    out.reshaping = True
    return out


async def _follow_reshape(
    spec: WorkloadSizingSpec,
    namespace: str,
    target: TargetView,
    owned: Sequence[PodInfo],
    state: dict[str, Any],
    settings: RightSizingSettings,
    targets: Targets,
    now: float,
) -> RightSizingOutcome:
    out = RightSizingOutcome(reshaping=True)
    to, origin = state.get("to") or {}, state.get("from") or {}
    new = [p for p in owned if p.gpu_resource == to.get("resource") and not p.terminating]
    progress, detail = reshape_progress(
        NewPods(
            ready=sum(1 for p in new if p.ready),
            total=len(new),
            unschedulable=[p.unschedulable for p in new if p.unschedulable],
            oom_kills=sum(p.oom_kills for p in new),
        ),
        wanted=int(to.get("replicas") or 1),
        started=parse_time(state.get("started")) or now,
        deadline_seconds=float(state.get("deadlineSeconds") or settings.reshape_deadline_seconds),
        now=now,
    )
    if progress == Progress.WAITING:
        out.condition = ConditionState(ConditionType.RIGHT_SIZED, False, Reason.RESHAPING, detail)
        return out
    if progress == Progress.DONE:
        record = {**state, "state": "Done", "message": detail}
        await targets.annotate(
            namespace, spec.target_ref, {RESHAPE_ANNOTATION: json.dumps(record, sort_keys=True)}
        )
        moved = _moved(record)
        out.events.append(EventIntent("Normal", EventReason.RESHAPED, moved))
        out.condition = ConditionState(ConditionType.RIGHT_SIZED, True, Reason.RIGHT_SIZED, moved)
        out.reshaping = False
        return out
    record = {**state, "state": "RolledBack", "message": detail}
    change = SliceChange(
        container=str(state.get("container") or _gpu_container(spec, target) or ""),
        old_resource=str(to.get("resource")),
        new_resource=str(origin.get("resource")),
        count=int(state.get("units") or 1),
        product_label=str(origin.get("productLabel")),
        replicas=int(origin.get("replicas") or 1),
        annotations={RESHAPE_ANNOTATION: json.dumps(record, sort_keys=True)},
    )
    try:
        await targets.reshape(namespace, spec.target_ref, change)
    except TargetProblem as exc:
        out.condition = ConditionState(
            ConditionType.RIGHT_SIZED, False, Reason.SCALE_FAILED, f"rolling back: {exc}"
        )
        return out
    back = f"restored {origin.get('slice')} ({origin.get('product')}): {detail}"
    out.events.append(EventIntent("Warning", EventReason.RESHAPE_ROLLED_BACK, back))
    out.condition = ConditionState(
        ConditionType.RIGHT_SIZED, False, Reason.RESHAPE_ROLLED_BACK, back
    )
    return out
