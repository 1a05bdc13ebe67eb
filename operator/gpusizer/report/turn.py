"""What a turn reports: its status patch and its events. Conditions are merged with the ones the
object has, a Warning goes out for each that turns False, and nothing is written unless
something material changed.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpusizer.api.v1alpha1 import WorkloadSizingStatus
from gpusizer.cluster import WorkloadObject
from gpusizer.policy.replicas import ReplicaDecision
from gpusizer.report import metrics
from gpusizer.report.events import EventIntent
from gpusizer.report.status import (
    STATUS_REFRESHES_PER_SECOND,
    ConditionState,
    RefreshBudget,
    flipped,
    merge_conditions,
    refresh_seconds,
    status_json,
    status_patch,
)
from gpusizer.signals.health import SETTLE_SECONDS, Outage, PrometheusState
from gpusizer.signals.join import SignalProblem, WorkloadSignals
from gpusizer.signals.parse import PodKey, Problem
from gpusizer.timefmt import parse_time
from gpusizer.vocabulary import ConditionType, EventReason, Reason


@dataclass(frozen=True)
class OutageDamping:
    """How slowly the workloads' statuses follow an outage of Prometheus (signals.health):
    MetricsAvailable turns False once the outage has lasted `grace_seconds`, and back to True
    within the spread of its end, each workload at an offset of its own within the spread
    (the same in every process), with no Event either way. The spread is `spread_seconds`, or
    longer when there are so many workloads that it would be more than STATUS_REFRESHES_PER_
    SECOND writes a second. A short outage then writes nothing, and neither end of a long one
    writes every workload at once."""

    grace_seconds: float = 300.0
    spread_seconds: float = 60.0

    def spread(self, workloads: int) -> float:
        return max(self.spread_seconds, workloads / STATUS_REFRESHES_PER_SECOND)

    def offset(self, namespace: str, name: str, workloads: int) -> float:
        return self.spread(workloads) * zlib.crc32(f"{namespace}/{name}".encode()) / 2**32

    def wrote(self, state: PrometheusState, since: float) -> bool:
        """Whether a loss a workload's status has shown since `since` may be an outage's (written
        quietly once it had lasted the grace): `since` falls inside an outage the replica knows.
        A loss from an earlier outage stays shown past its end when no replica was in charge to
        follow it (the soak, seed 31: the Lease changed hands across the end, and the next
        outage's end brought 148 MetricsRecovered Events, each loss taken for the workload's
        own)."""
        return any(
            outage.since <= since and (outage.until is None or since <= outage.until)
            for outage in state.outages()
        )

    def shown(self, outage: Outage, namespace: str, name: str, workloads: int, now: float) -> bool:
        """Whether this workload's status says the outage's present state (down or over)."""
        offset = self.offset(namespace, name, workloads)
        if outage.until is None:
            return now >= outage.since + self.grace_seconds + offset
        return now >= outage.until + offset


@dataclass
class Outcome:
    status_patch: dict[str, Any]
    events: list[EventIntent] = field(default_factory=list)
    pods: tuple[PodKey, ...] = ()  # the pods the decision read: see Cycle.moved
    # nothing to do that time alone, on the same inputs, could change: see fleet.Member.quiet
    quiet: bool = False


class Report:
    """The turn's status patch and events: conditions merged with the ones the object has,
    a Warning for each that turns False, and nothing written unless something changed."""

    def __init__(
        self,
        obj: WorkloadObject,
        workloads: int,
        refresh_minimum: float,
        now: float,
        prometheus: PrometheusState | None = None,
        damping: OutageDamping | None = None,
        budget: RefreshBudget | None = None,
    ) -> None:
        self._obj = obj
        self._old_conditions = obj.status.get("conditions")
        self._refresh = refresh_seconds(refresh_minimum, workloads)
        self._workloads = workloads
        self._now = now
        self._prometheus = prometheus or PrometheusState()
        self._damping = damping or OutageDamping()
        self._budget = budget or RefreshBudget()
        self._outage_says_it = False  # MetricsAvailable follows an outage: no Event of its own
        self._readings_stand = False  # a shared query failing inside its grace (`_damped`)
        self.events: list[EventIntent] = []

    def metrics_condition(
        self,
        signals: WorkloadSignals,
        decision: ReplicaDecision,
        restricted: tuple[str, ...],
        first_failure: bool = False,
    ) -> ConditionState:
        """MetricsAvailable, and a QueryRestricted Warning when a query was confined to its
        namespace: the likely cause of what follows, so it is named first, even while the
        metrics are known. On the first turn whose queries fail (`Memory.first_failure`) the
        condition stays as it was, and while the only problems are shared queries failing for
        less than the outage grace (`SignalProblem.shared_since`), too."""
        notes = [*restricted]
        reason = Reason.QUERY_RESTRICTED if restricted else Reason.METRICS_OK
        state = ConditionState(ConditionType.METRICS_AVAILABLE, True, reason, "; ".join(notes))
        if signals.problems and not decision.metrics_known:
            notes.extend(str(p) for p in signals.problems)
            state = ConditionState(
                ConditionType.METRICS_AVAILABLE,
                False,
                reason if restricted else signals.problems[0].reason,
                f"{'; '.join(notes)}. Holding replicas: no scale-down or scale to zero on "
                "unknown metrics",
            )
        shared = None if restricted else _shared_since(signals.problems)
        state = self._damped(state, first_failure, shared)
        if restricted and flipped(
            self._old_conditions,
            ConditionType.METRICS_AVAILABLE,
            state.status is True,
            Reason.QUERY_RESTRICTED,
        ):
            self.events.append(
                EventIntent("Warning", EventReason.QUERY_RESTRICTED, "; ".join(restricted))
            )
        return state

    def _damped(
        self, state: ConditionState, first_failure: bool, shared_since: float | None
    ) -> ConditionState:
        """MetricsAvailable around an outage of Prometheus, or a query every workload shares
        failing since `shared_since`: the False it causes shows only after the grace, and goes
        back to True at this workload's offset after its end; until then the condition stays as
        it was. Neither move posts an Event: the outage is said once for the fleet."""
        outage = self._prometheus.outage
        shown = _condition(self._old_conditions, ConditionType.METRICS_AVAILABLE)
        if shown is None:
            return state
        old, since = shown
        if (
            state.status is False
            and old.status is not False
            and shared_since is not None
            and not self._after_grace(shared_since)
        ):
            self._readings_stand = True
            return old  # a shared query failing: said for the fleet, and slowly
        if first_failure and state.status is False and self._prometheus.down is None:
            return old  # an outage that is over says nothing of this failure
        if outage is None:
            return state
        lost_to_outage = since is not None and self._damping.wrote(self._prometheus, since)
        if outage.until is None:
            if state.status is not False:
                if old.status is False and lost_to_outage:
                    self._outage_says_it = True  # its loss was the outage's: back as quietly
                return state
        elif (
            state.status is False
            and (old.status is not False or lost_to_outage)
            and self._now < outage.until + SETTLE_SECONDS
        ):
            # a Prometheus just back is still catching up: a restarted one answers with the
            # samples it had, stale by now, until it has scraped again (the soak, seed 28: 166
            # StaleSamples Events), whether the status shows the metrics known or the outage's
            # loss (seed 39: 119, the loss's reason giving way to StaleSamples); a failure that
            # outlasts this is the workload's own
            return old
        elif not (state.status is True and old.status is False and lost_to_outage):
            return state  # known all along, or unknown for a reason of its own: said as usual
        self._outage_says_it = True
        obj = self._obj
        shown_now = self._damping.shown(outage, obj.namespace, obj.name, self._workloads, self._now)
        return state if shown_now else old

    def _as_shown(
        self, status: Mapping[str, Any], conditions: list[ConditionState]
    ) -> tuple[dict[str, Any], list[ConditionState]]:
        """While MetricsAvailable stands through a shared query's grace, so do the observation
        and the conditions that follow from the readings, unless the replicas changed: the
        readings went unknown for the fleet, not for this workload. At 10,000 workloads a
        Prometheus too busy to answer for longer than the samples it held made every workload
        write its readings gone and back, and its ScaledToZero and ScalingLimited reasons with
        them (bench/README.md, "Issue 29: a memory read that timed out")."""
        shown = {k: v for k, v in status.items() if k != "observation"}
        if status.get("current_replicas") != self._obj.status.get("currentReplicas"):
            return shown, conditions
        kept = []
        for state in conditions:
            before = None
            if state.type in _FOLLOW_THE_READINGS:
                before = _condition(self._old_conditions, state.type)
            kept.append(state if before is None else before[0])
        return shown, kept

    def says(self, since: float) -> bool:
        """Whether the status says a failure of a read shared by every workload that began
        at `since` (the list of other autoscalers, while the API server is away): only once it
        has lasted the grace, as for an outage of Prometheus. Until then the turn holds and
        writes nothing, so a restart of the API server flips no workload's Ready, and
        re-announces nothing when it comes back (a Paused or ConflictingAutoscaler Event per
        workload)."""
        if _condition(self._old_conditions, ConditionType.READY) is None:
            return True
        return self._after_grace(since)

    def _after_grace(self, since: float) -> bool:
        """Whether this workload's status says a failure shared by the fleet that began at
        `since`: once it has lasted the grace, at the workload's offset within the spread."""
        obj = self._obj
        failure = Outage(Problem(Reason.AUTOSCALER_CHECK_FAILED, ""), since)  # only `since` counts
        return self._damping.shown(failure, obj.namespace, obj.name, self._workloads, self._now)

    def finish(
        self,
        status: Mapping[str, Any],
        conditions: list[ConditionState],
        pods: tuple[PodKey, ...] = (),
    ) -> Outcome:
        """`status`: the WorkloadSizingStatus fields the turn sets (None deletes one)."""
        old = self._old_conditions
        if self._readings_stand:
            status, conditions = self._as_shown(status, conditions)
        quiet = {ConditionType.METRICS_AVAILABLE} if self._outage_says_it else set()
        for state in conditions:
            if (
                state.status is False
                and state.type not in quiet
                and flipped(old, state.type, False, state.reason)
            ):
                event = _warning_for(state)
                if event is not None:
                    self.events.append(event)
        known = next((s for s in conditions if s.type == ConditionType.METRICS_AVAILABLE), None)
        if (
            known is not None
            and known.status
            and known.type not in quiet
            and _was_false(old, known.type)
        ):
            self.events.append(
                EventIntent("Normal", EventReason.METRICS_RECOVERED, "all signals are known again")
            )
        obj = self._obj
        merged = merge_conditions(old, conditions, self._now, obj.generation)
        metrics.WORKLOADS.set_conditions(obj.namespace, obj.name, merged)
        written = WorkloadSizingStatus(
            **status, observed_generation=obj.generation, conditions=merged
        )
        patch = status_patch(
            obj.status,
            status_json(written),
            self._now,
            self._refresh,
            # no refresh while Prometheus is out (there is nothing new to show), and few at a
            # time once it is back (every workload's readings are due then)
            lambda: self._prometheus.down is None and self._budget.take(self._now),
        )
        return Outcome(status_patch=patch, events=self.events, pods=pods)


# the conditions a decision on unknown readings changes by itself (idleness, the limit met)
_FOLLOW_THE_READINGS = frozenset({ConditionType.SCALED_TO_ZERO, ConditionType.SCALING_LIMITED})


def _shared_since(problems: Sequence[SignalProblem]) -> float | None:
    """When the earliest of a turn's problems began, if every one is a query shared by the
    fleet failing (`SignalProblem.shared_since`); None otherwise."""
    sinces = [p.shared_since for p in problems if p.shared_since is not None]
    return min(sinces) if sinces and len(sinces) == len(problems) else None


def _condition(conditions: Any, type_: ConditionType) -> tuple[ConditionState, float | None] | None:
    """The condition of `type_` in a status and its last transition, None if absent or not
    one this operator wrote."""
    for c in conditions or []:
        if isinstance(c, Mapping) and c.get("type") == type_.value:
            try:
                reason = Reason(str(c.get("reason")))
            except ValueError:
                return None
            status = {"True": True, "False": False}.get(str(c.get("status")))
            state = ConditionState(type_, status, reason, str(c.get("message") or ""))
            return state, parse_time(c.get("lastTransitionTime"))
    return None


def _was_false(conditions: Any, type_: ConditionType) -> bool:
    return any(
        isinstance(c, Mapping) and c.get("type") == type_.value and c.get("status") == "False"
        for c in conditions or []
    )


_WARNINGS: dict[Reason, EventReason] = {
    Reason.TARGET_NOT_FOUND: EventReason.TARGET_NOT_FOUND,
    Reason.TARGET_NOT_SCALABLE: EventReason.TARGET_NOT_FOUND,
    Reason.CONFLICTING_AUTOSCALER: EventReason.CONFLICTING_AUTOSCALER,
    Reason.INVALID_SPEC: EventReason.INVALID_SPEC,
    Reason.SCALE_FAILED: EventReason.SCALE_FAILED,
    Reason.OUT_OF_MEMORY: EventReason.OUT_OF_MEMORY,
    Reason.ACTIVATOR_ROUTE_FAILED: EventReason.ACTIVATOR_ROUTE_FAILED,
}


def _warning_for(state: ConditionState) -> EventIntent | None:
    if state.type == ConditionType.METRICS_AVAILABLE:
        return EventIntent("Warning", EventReason.METRICS_UNAVAILABLE, state.message)
    reason = _WARNINGS.get(state.reason)
    return None if reason is None else EventIntent("Warning", reason, state.message)
