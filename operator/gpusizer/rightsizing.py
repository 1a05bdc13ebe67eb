"""Right-sizing for one workload: measure, choose a slice, and in Auto move there or roll back.

The in-flight reshape and the previous slice live in annotations on the target
(`api.annotations`), so a restarted operator picks up a rollout where the last one left it and
never starts a second one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError

from gpusizer.actuate.target_view import (
    SliceChange,
    TargetProblem,
    TargetUnanswered,
    TargetView,
)
from gpusizer.api.annotations import (
    PREVIOUS_SLICE_ANNOTATION,
    RESHAPE_ANNOTATION,
    Placement,
    Prediction,
    ReshapeRecord,
    ReshapeState,
)
from gpusizer.api.v1alpha1 import Mode, Recommendation, ResultCosts, WorkloadSizingSpec
from gpusizer.catalog import Catalog, Slice
from gpusizer.catalog.models import PRODUCT_LABEL
from gpusizer.cluster import ClusterView
from gpusizer.efficiency import Efficiency, Figures, after_move, rounded, slice_watts
from gpusizer.measurement import Measured, Measurer
from gpusizer.policy.reshape import NewPods, Progress, reshape_progress
from gpusizer.policy.slices import Candidate, SliceChoice, Usage, busy_units, choose_slice
from gpusizer.ports import TargetClient
from gpusizer.report.events import EventIntent
from gpusizer.report.status import ConditionState
from gpusizer.signals.discovery import NodeInfo, OfferCache
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.reader import HistoryCache
from gpusizer.signals.usage import usage
from gpusizer.throughput import (
    DEFAULT_SURPRISE_SHARE,
    TOKENS_UNIT,
    ThroughputBook,
    predicted_rate,
    surprise,
)
from gpusizer.timefmt import iso, parse_time
from gpusizer.vocabulary import ConditionType, EventReason, Reason

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sized:
    """The workload being sized: its target as read this turn, the pods it owns, and the
    cluster they run in."""

    namespace: str
    target: TargetView
    pods: Sequence[PodInfo]
    cluster: ClusterView


@dataclass(frozen=True)
class Move:
    """A move Auto may start: from the current slice (with its units per pod) to `best`."""

    current: Slice
    units: int
    best: Candidate
    message: str


@dataclass
class RightSizingOutcome:
    condition: ConditionState | None = None
    recommendation: Recommendation | None = None
    events: list[EventIntent] = field(default_factory=list)
    reshaping: bool = False  # replica changes wait while a rollout is in flight
    # the target was changed (a move, its end, or its rollback), or may have been: a write
    # the API server did not answer
    wrote: bool = False


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


def reshape_record(target: TargetView) -> ReshapeRecord | None:
    """The target's reshape record; one that cannot be read is ignored, and said so."""
    raw = target.annotations.get(RESHAPE_ANNOTATION)
    if not raw:
        return None
    try:
        return ReshapeRecord.parse(raw)
    except (ValidationError, ValueError):
        log.warning("ignoring unreadable %s annotation: %r", RESHAPE_ANNOTATION, raw[:200])
        return None


def _placement(slice_: Slice, replicas: int) -> Placement:
    return Placement(
        slice=slice_.name,
        product=slice_.product.key,
        resource=slice_.resource,
        product_label=slice_.product.gfd_label,
        replicas=replicas,
    )


def _finished_move_to(record: ReshapeRecord | None, current: Slice) -> str | None:
    """What the last reshape said, if it finished by moving the workload to `current`."""
    if record is None or record.state != ReshapeState.DONE:
        return None
    if (record.to.slice, record.to.product) != (current.name, current.product.key):
        return None
    return record.moved_message()


def _gpu_container(spec: WorkloadSizingSpec, target: TargetView) -> str | None:
    if spec.container:
        return spec.container
    for container in (target.pod_spec or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        if any(str(r).startswith("nvidia.com/") for r in limits):
            return str(container.get("name"))
    return None


def _recommendation(choice: SliceChoice, used: Usage, measured: Measured) -> Recommendation:
    best = choice.recommended
    return Recommendation(
        slice=best.slice.name if best else None,
        resource=best.slice.resource if best else None,
        node_selector=best.slice.node_selector if best else {},
        replicas=best.replicas if best else None,
        cost_per_hour=round(best.cost_per_hour, 2) if best else None,
        current_cost_per_hour=round(choice.current_cost_per_hour, 2)
        if choice.current_cost_per_hour is not None
        else None,
        reason=choice.message,
        throughput=None if best is None else ("Measured" if best.measured else "Estimated"),
        after=_result_costs(estimated_after(choice, used, measured.efficiency)),
    )


def estimated_after(choice: SliceChoice, used: Usage, now: Efficiency | None) -> Figures | None:
    """What a result would cost on the recommended slice: an estimate from what it costs now,
    the recommended replicas' cost and their estimated draw."""
    best, units = choice.recommended, busy_units(used)
    if best is None or now is None or units is None:
        return None
    watts = slice_watts(best.slice, best.replicas, units / best.speed)
    return after_move(now, choice.current_cost_per_hour, best.cost_per_hour, watts)


def _result_costs(figures: Figures | None) -> ResultCosts | None:
    if figures is None:
        return None
    shown = rounded(figures)
    return ResultCosts(**asdict(shown))


def _prediction(measured: Measured, move: Move) -> Prediction | None:
    capacity = measured.capacity
    rate = predicted_rate(capacity, move.current, move.best.slice)
    if rate is None or rate <= 0:
        return None
    basis = "Measured" if move.best.measured else "Estimated"
    return Prediction(rate=rate, unit=capacity.unit, basis=basis)


def _condition(status: bool | None, reason: Reason, message: str) -> ConditionState:
    return ConditionState(ConditionType.RIGHT_SIZED, status, reason, message)


class RightSizer:
    """Right-sizing's collaborators: the catalog, the measured history and what it shows
    (`measurement.Measurer`), the cluster's free slices and the target client, with the
    reshape settings."""

    def __init__(
        self,
        catalog: Catalog,
        history: HistoryCache,
        offers: OfferCache,
        targets: TargetClient,
        reshape_deadline_seconds: float = 600.0,
        min_reshape_interval_seconds: float = 3600.0,
        measurer: Measurer | None = None,
        surprise_share: float = DEFAULT_SURPRISE_SHARE,
    ) -> None:
        self.catalog = catalog
        self._history = history
        self._offers = offers
        self._targets = targets
        self._deadline = reshape_deadline_seconds
        self._min_interval = min_reshape_interval_seconds
        self._measurer = measurer or Measurer(catalog, history)
        self._surprise_share = surprise_share

    async def measure(
        self,
        spec: WorkloadSizingSpec,
        sized: Sized,
        key: tuple[str, str],
        status: Mapping[str, Any],
        book: ThroughputBook,
        previous_turn: float | None,
        now: float,
    ) -> Measured:
        """What the workload's results cost, and its throughput (`measurement.Measurer`)."""
        return await self._measurer.measure(
            spec,
            key,
            sized.target,
            sized.pods,
            sized.cluster.nodes,
            status,
            book,
            previous_turn,
            now,
        )

    async def size(
        self,
        spec: WorkloadSizingSpec,
        sized: Sized,
        now: float,
        may_act: bool,
        measured: Measured | None = None,
    ) -> RightSizingOutcome:
        """`may_act` is False in Recommend mode and while paused: then this only reports."""
        measured = measured or Measured()
        record = reshape_record(sized.target)
        if record is not None and record.state == ReshapeState.IN_PROGRESS:
            return await self._follow(spec, sized, record, now)
        current, units = current_slice(self.catalog, sized.pods, sized.cluster.nodes, sized.target)
        if current is None:
            return RightSizingOutcome(
                _condition(
                    None,
                    Reason.UNKNOWN_SLICE,
                    "the workload's GPU resource and node product are not in the catalog",
                )
            )
        choice, message, used = await self._choose(spec, sized, current, record, now, measured)
        out = RightSizingOutcome(recommendation=_recommendation(choice, used, measured))
        right = choice.reason in (Reason.RIGHT_SIZED, Reason.SAVING_TOO_SMALL)
        out.condition = _condition(
            None if choice.reason == Reason.NO_MEASUREMENT else right, choice.reason, message
        )
        if record is not None:
            if record.state == ReshapeState.ROLLED_BACK and choice.reason == Reason.TOO_SOON:
                out.condition = _condition(
                    False, Reason.RESHAPE_ROLLED_BACK, f"{record.message}; {choice.message}"
                )
            moved_here = _finished_move_to(record, current)
            if choice.reason == Reason.NO_MEASUREMENT and moved_here is not None:
                # the move stands, with the recommendation that made it, until it is measured
                out.recommendation = None
                out.condition = _condition(True, Reason.RIGHT_SIZED, moved_here)
            if moved_here is not None:
                out.events += await self._check_prediction(spec, sized, record, measured)
        best = choice.recommended
        if choice.apply and best is not None and spec.right_sizing.mode == Mode.AUTO and may_act:
            move = Move(current, units, best, message)
            moving = await self._move(spec, sized, move, now, measured)
            moving.recommendation = out.recommendation
            return moving
        return out

    async def _choose(
        self,
        spec: WorkloadSizingSpec,
        sized: Sized,
        current: Slice,
        record: ReshapeRecord | None,
        now: float,
        measured: Measured,
    ) -> tuple[SliceChoice, str, Usage]:
        """The slice choice on the measured history, its message with the measurement's
        problems, and the use it was made on."""
        history = await self._history.get(spec.right_sizing.history_seconds)
        used, problems = usage(history, sized.pods, now)
        rules = spec.replicas
        choice = choose_slice(
            current=current,
            usage=used,
            offers=self._offers.get(sized.cluster.nodes.values(), sized.cluster.all_pods, now),
            spec=spec.right_sizing,
            target_utilization=rules.target_gpu_utilization or 70.0,
            min_replicas=max(1, rules.minimum),
            now=now,
            last_reshape_time=parse_time(record.started) if record is not None else None,
            min_interval_seconds=self._min_interval,
            measured=measured.capacity.per_slice,
        )
        problems_note = f" (measurement problems: {'; '.join(problems)})" if problems else ""
        return choice, choice.message + problems_note, used

    async def _check_prediction(
        self, spec: WorkloadSizingSpec, sized: Sized, record: ReshapeRecord, measured: Measured
    ) -> list[EventIntent]:
        """Once the new slice is measured after a move, its throughput against the move's
        prediction: a miss by more than the surprise share is an Event (the measurement has
        already replaced the estimate). Checked once: the record says so."""
        prediction = record.prediction
        if prediction is None or prediction.checked:
            return []
        started = parse_time(record.started) or 0.0
        outcome = next(
            (
                m
                for m in measured.throughput
                if (m.slice, m.product) == (record.to.slice, record.to.product) and m.time > started
            ),
            None,
        )
        rate = outcome.rate(prediction.unit) if outcome is not None else None
        if rate is None:
            return []
        checked = record.model_copy(
            update={"prediction": prediction.model_copy(update={"checked": True})}
        )
        try:
            await self._targets.annotate(
                sized.namespace, spec.target_ref, {RESHAPE_ANNOTATION: checked.annotation()}
            )
        except TargetProblem as exc:
            log.warning("recording the checked prediction failed: %s", exc)
            return []
        missed = surprise(prediction.rate, rate)
        if abs(missed) <= self._surprise_share:
            return []
        unit = "output tokens/s" if prediction.unit == TOKENS_UNIT else "req/s"
        direction = "more" if missed > 0 else "less"
        message = (
            f"on {record.to.slice} a fully busy replica serves {rate:.3g} {unit}, "
            f"{abs(missed):.0%} {direction} than the {prediction.rate:.3g} predicted "
            f"({prediction.basis.lower()} throughput); the measured figure now replaces the "
            "estimate"
        )
        return [EventIntent("Warning", EventReason.THROUGHPUT_MISPREDICTED, message)]

    async def _move(
        self, spec: WorkloadSizingSpec, sized: Sized, move: Move, now: float, measured: Measured
    ) -> RightSizingOutcome:
        """Start a move: one template change that carries the record, with the throughput it
        predicts on the new slice when the current one's was measured."""
        container = _gpu_container(spec, sized.target)
        if container is None:
            return RightSizingOutcome(
                _condition(False, Reason.UNKNOWN_SLICE, "no container requests a GPU")
            )
        rules = spec.replicas
        best = move.best
        replicas = min(rules.maximum, max(best.replicas, rules.minimum, 1))
        origin = _placement(move.current, sized.target.replicas)
        record = ReshapeRecord(
            state=ReshapeState.IN_PROGRESS,
            origin=origin,
            to=_placement(best.slice, replicas),
            units=move.units,
            container=container,
            started=iso(now),
            deadline_seconds=self._deadline,
            message=move.message,
            prediction=_prediction(measured, move),
        )
        change = SliceChange(
            container=container,
            old_resource=move.current.resource,
            new_resource=best.slice.resource,
            count=move.units,
            product_label=best.slice.product.gfd_label,
            replicas=replicas,
            annotations={
                RESHAPE_ANNOTATION: record.annotation(),
                PREVIOUS_SLICE_ANNOTATION: origin.annotation(),
            },
        )
        try:
            await self._targets.reshape(sized.namespace, spec.target_ref, change)
        except TargetProblem as exc:
            return RightSizingOutcome(
                _condition(False, Reason.SCALE_FAILED, str(exc)),
                wrote=isinstance(exc, TargetUnanswered),
            )
        started = (
            f"moving from {sized.target.replicas} x {move.current.name} to {replicas} x "
            f"{best.slice.name}: {move.message}"
        )
        return RightSizingOutcome(
            _condition(False, Reason.RESHAPING, started),
            events=[EventIntent("Normal", EventReason.RESHAPE_STARTED, started)],
            reshaping=True,
            wrote=True,
        )

    async def _follow(
        self, spec: WorkloadSizingSpec, sized: Sized, record: ReshapeRecord, now: float
    ) -> RightSizingOutcome:
        """A reshape in flight: wait, finish it, or roll it back."""
        out = RightSizingOutcome(reshaping=True)
        new = [p for p in sized.pods if p.gpu_resource == record.to.resource and not p.terminating]
        progress, detail = reshape_progress(
            NewPods(
                ready=sum(1 for p in new if p.ready),
                total=len(new),
                unschedulable=[p.unschedulable for p in new if p.unschedulable],
                oom_kills=sum(p.oom_kills for p in new),
            ),
            wanted=record.to.replicas,
            started=parse_time(record.started) or now,
            deadline_seconds=record.deadline_seconds,
            now=now,
        )
        if progress == Progress.WAITING:
            out.condition = _condition(False, Reason.RESHAPING, detail)
            return out
        if progress == Progress.DONE:
            done = record.model_copy(update={"state": ReshapeState.DONE, "message": detail})
            await self._targets.annotate(
                sized.namespace, spec.target_ref, {RESHAPE_ANNOTATION: done.annotation()}
            )
            moved = done.moved_message()
            out.events.append(EventIntent("Normal", EventReason.RESHAPED, moved))
            out.condition = _condition(True, Reason.RIGHT_SIZED, moved)
            out.reshaping, out.wrote = False, True
            return out
        return await self._roll_back(spec, sized, record, detail, out)

    async def _roll_back(
        self,
        spec: WorkloadSizingSpec,
        sized: Sized,
        record: ReshapeRecord,
        detail: str,
        out: RightSizingOutcome,
    ) -> RightSizingOutcome:
        """Restore the slice, node selector and replicas the record says the workload had."""
        origin = record.origin
        back = record.model_copy(update={"state": ReshapeState.ROLLED_BACK, "message": detail})
        change = SliceChange(
            container=record.container,
            old_resource=record.to.resource,
            new_resource=origin.resource,
            count=record.units,
            product_label=origin.product_label,
            replicas=max(1, origin.replicas),
            annotations={RESHAPE_ANNOTATION: back.annotation()},
        )
        try:
            await self._targets.reshape(sized.namespace, spec.target_ref, change)
        except TargetProblem as exc:
            out.condition = _condition(False, Reason.SCALE_FAILED, f"rolling back: {exc}")
            out.wrote = isinstance(exc, TargetUnanswered)
            return out
        restored = f"restored {origin.slice} ({origin.product}): {detail}"
        out.events.append(EventIntent("Warning", EventReason.RESHAPE_ROLLED_BACK, restored))
        out.condition = _condition(False, Reason.RESHAPE_ROLLED_BACK, restored)
        out.wrote = True
        return out
