"""One turn of one WorkloadSizing: the checks that end it, then observe, measure, decide, route,
act, report.

Kopf-free: the caller passes the object and the cycle's shared reads in, and posts the events
and the status patch this returns. Every step is a function of its inputs and the ports it is
given (`gpusizer.ports`), so each branch has a table test (tests/unit/test_reconcile.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from gpusizer.activation import (
    ACTIVATOR_SIGNAL,
    ActivatorRoute,
    RouteProblem,
    activator_port,
    service_of,
    uses_activator,
    wake_demand,
)
from gpusizer.actuate.target_view import (
    ScaleConflict,
    TargetNotFound,
    TargetProblem,
    TargetUnanswered,
    TargetView,
)
from gpusizer.api.annotations import PAUSE_ANNOTATION, Held, held_requests
from gpusizer.api.v1alpha1 import (
    ActivatorStatus,
    Mode,
    Observation,
    Routing,
    WorkloadSizingSpec,
)
from gpusizer.clock import Cycle
from gpusizer.cluster import ClusterView, WorkloadObject
from gpusizer.measurement import Measured
from gpusizer.memory import Memory, SpecCache
from gpusizer.policy.replicas import History, ReplicaCounts, ReplicaDecision, decide_replicas
from gpusizer.ports import MetricsSource, RouteClient, TargetClient
from gpusizer.report import metrics
from gpusizer.report.events import EventIntent
from gpusizer.report.status import (
    ConditionState,
    RefreshBudget,
    flipped,
    history_fields,
    history_from_status,
)
from gpusizer.report.turn import OutageDamping, Outcome, Report
from gpusizer.rightsizing import RightSizer, RightSizingOutcome, Sized
from gpusizer.settings import Tenancy
from gpusizer.signals.join import WorkloadSignals, workload_signals
from gpusizer.signals.parse import PodSamples, Problem
from gpusizer.signals.pods import PodInfo
from gpusizer.signals.reader import read_custom_queue
from gpusizer.signals.user_queries import InvalidQuery, UserQueries, user_queries
from gpusizer.timefmt import iso
from gpusizer.vocabulary import ConditionType, EventReason, Reason

log = logging.getLogger(__name__)

# The observation and condition wording are rewritten at most this often without another change.
STATUS_REFRESH_SECONDS = 60.0
# Queries that failed, rather than answered without what was asked: Prometheus may be out.
QUERY_FAILURES = frozenset({Reason.PROMETHEUS_UNREACHABLE, Reason.QUERY_ERROR})


@dataclass(frozen=True)
class Services:
    """The ports a turn reads and writes through, and the rules it reports by."""

    metrics: MetricsSource
    targets: TargetClient
    routes: RouteClient
    right_sizer: RightSizer
    tenancy: Tenancy = field(default_factory=Tenancy)
    status_refresh_seconds: float = STATUS_REFRESH_SECONDS
    damping: OutageDamping = field(default_factory=OutageDamping)
    refresh_budget: RefreshBudget = field(default_factory=RefreshBudget)


class TurnEnded(Exception):
    """A check ended the turn before any decision; the condition says why."""

    def __init__(self, condition: ConditionState, **status: Any) -> None:
        super().__init__(condition.message)
        self.condition = condition
        self.status = status  # WorkloadSizingStatus fields the turn still reports


@dataclass(frozen=True)
class Checked:
    """What the checks established: the workload may be decided on this turn."""

    obj: WorkloadObject
    spec: WorkloadSizingSpec
    queries: UserQueries  # the spec's PromQL as it is sent
    target: TargetView
    watched: TargetView | None  # the watch's copy the target came from, if it did


@dataclass(frozen=True)
class Routed:
    """Where the workload's Service sends its traffic after the route step."""

    port: int | None  # the activator's port for the workload
    routing: Routing
    problem: ConditionState | None = None  # the route could not be put in place or taken out
    hold: ConditionState | None = None  # what keeps the last replica: the route is not there
    service_port: str | None = None  # the Service port's name, once read


@dataclass(frozen=True)
class Acted:
    """What the act step did: the Ready condition it leaves, and the replicas and history
    after any write."""

    ready: ConditionState
    current: int
    history: History
    last_scale_time: str | None
    events: tuple[EventIntent, ...] = ()


async def reconcile(
    obj: WorkloadObject,
    view: ClusterView,
    cycle: Cycle,
    services: Services,
    memory: Memory,
    now: float,
    unchanged_until: float | None = None,
) -> Outcome:
    """A valid spec, a target that can be read and that no other autoscaler owns; then what
    its pods show, the replica decision, right-sizing, the write the mode and the pause allow,
    and the status and events that say so. `unchanged_until`: the fleet saw nothing the
    workload reads change from its last turn until then (fleet.Member.saw_unchanged)."""
    report = Report(
        obj,
        cycle.workloads,
        services.status_refresh_seconds,
        now,
        cycle.prometheus,
        services.damping,
        services.refresh_budget,
    )
    try:
        checked = await checks(obj, view, cycle, services, memory)
    except TurnEnded as ended:
        fleet = ended.condition.reason == Reason.AUTOSCALER_CHECK_FAILED
        if fleet and cycle.error_since is not None and not report.says(cycle.error_since):
            return Outcome(status_patch={})
        return report.finish(ended.status, [ended.condition])
    spec, target = checked.spec, checked.target
    pods = view.selected(obj.namespace, target.selector)
    held = held_requests(obj.annotations, now)
    signals = await observe(checked, pods, cycle, services, memory, held, now)
    subject = Sized(obj.namespace, target, pods, view)
    measured = await measure(checked, subject, services, memory, now)
    decision = decide(checked, pods, signals, memory, now, unchanged_until)
    paused_by = pause_source(obj.annotations, target)
    sizing = RightSizingOutcome()
    if spec.right_sizing.mode != Mode.OFF:
        sizing = await services.right_sizer.size(
            spec,
            subject,
            now,
            may_act=spec.mode == Mode.AUTO and paused_by is None,
            measured=measured,
        )
        if sizing.wrote:
            written_behind_the_watch(checked, memory)
    hold = holding(checked, decision, paused_by, sizing.reshaping)
    routed = await route(checked, pods, decision, hold, services.routes, view, memory)
    if hold is None and routed is not None and routed.hold is not None:
        hold = routed.hold, ()
    acted = await act(checked, decision, hold, services.targets, memory, now)
    report.events.extend([*sizing.events, *acted.events])
    status: dict[str, Any] = {
        "current_replicas": acted.current,
        "desired_replicas": decision.desired,
        "last_scale_time": acted.last_scale_time,
        **history_fields(acted.history, learned=spec.scale_to_zero.enabled),
        **measured.status_fields(),
    }
    if cycle.prometheus.down is None:  # while Prometheus is out, the last observation stands
        status["observation"] = _observation(signals, now)
    if sizing.recommendation is not None:
        status["recommendation"] = sizing.recommendation
    ready = acted.ready
    if routed is not None:
        status["activator"] = _activator_status(obj, routed, held, target.replicas, acted, now)
        if routed.problem is not None and ready.status:
            ready = routed.problem
    elif obj.status.get("activator") is not None:
        status["activator"] = None  # the activator was turned off: its part of the status goes
    failing = bool(signals.problems) and all(p.reason in QUERY_FAILURES for p in signals.problems)
    first = memory.first_failure(obj.namespace, obj.name, failing)
    conditions = [
        ready,
        report.metrics_condition(signals, decision, checked.queries.restricted, first),
        _scaled_to_zero(acted.current, decision, spec),
        _scaling_limited(decision),
    ]
    sized = sizing.condition or _out_of_memory(pods)
    if sized is not None:
        conditions.append(sized)
    outcome = report.finish(status, conditions, pods=tuple((p.namespace, p.name) for p in pods))
    outcome.quiet = (
        decision.steady
        and hold is None
        and routed is None
        and not acted.events
        and not outcome.status_patch
        and not outcome.events
        and quiet_inputs(checked, pods, signals, cycle)
    )
    return outcome


def quiet_inputs(
    checked: Checked, pods: list[PodInfo], signals: WorkloadSignals, cycle: Cycle
) -> bool:
    """Whether every input of the turn but the time is one the fleet sees change: the pods'
    readings in the shared snapshot, and the watches' copies of the object, its target and
    its pods. Not its own queries, the window reads of right-sizing, or scale to zero's wake
    and idle clocks; nor a target read from the API server while the watch lags."""
    spec, queries = checked.spec, checked.queries
    return (
        checked.watched is not None
        and spec.right_sizing.mode == Mode.OFF
        and not spec.scale_to_zero.enabled
        and not queries.queue
        and not queries.wake
        and not signals.problems
        and cycle.prometheus.down is None
        and all(p.ready and not p.terminating for p in pods)
    )


async def checks(
    obj: WorkloadObject,
    view: ClusterView,
    cycle: Cycle,
    services: Services,
    memory: Memory,
) -> Checked:
    """The checks that end the turn, in order; raises TurnEnded."""
    spec, queries = valid_spec(obj, memory.specs, services.tenancy)
    target, watched = await readable_target(obj, spec, view, services.targets, memory)
    stand_back_from_other_autoscalers(obj.namespace, spec, target, cycle)
    return Checked(obj, spec, queries, target, watched)


def _ended(reason: Reason, message: str, ready: bool = False, **status: Any) -> TurnEnded:
    return TurnEnded(ConditionState(ConditionType.READY, ready, reason, message), **status)


def valid_spec(
    obj: WorkloadObject, specs: SpecCache, tenancy: Tenancy
) -> tuple[WorkloadSizingSpec, UserQueries]:
    """The spec and its queries as they will be sent; a spec that is invalid, or Off, ends
    the turn."""
    try:
        spec = specs.get(obj.namespace, obj.name, obj.generation, obj.spec)
        queries = user_queries(spec, obj.namespace, tenancy)
    except ValidationError as exc:
        raise _ended(Reason.INVALID_SPEC, _spec_error(exc)) from exc
    except InvalidQuery as exc:
        raise _ended(Reason.INVALID_SPEC, str(exc)) from exc
    if spec.mode == Mode.OFF:
        raise _ended(Reason.MODE_OFF, "mode is Off", ready=True)
    return spec, queries


def _spec_error(error: ValidationError) -> str:
    parts = []
    for err in error.errors()[:3]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"spec.{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return "; ".join(parts)


async def readable_target(
    obj: WorkloadObject,
    spec: WorkloadSizingSpec,
    view: ClusterView,
    targets: TargetClient,
    memory: Memory,
) -> tuple[TargetView, TargetView | None]:
    """The target, from the watch when it holds an up-to-date copy, else from the API server;
    and the watch's copy (None when it was read). One that is gone or has no /scale ends the
    turn."""
    try:
        watched = memory.watched_target(obj.namespace, obj.name, spec.target_ref, view)
        if watched is None and memory.first_lag(obj.namespace, obj.name):
            ref = spec.target_ref
            log.info(
                "%s/%s: the watch still shows %s %s as it was before its last change: reading "
                "it from the API server until the watch shows it",
                obj.namespace,
                obj.name,
                ref.kind,
                ref.name,
            )
        target = watched or await targets.read(obj.namespace, spec.target_ref)
    except TargetNotFound as exc:
        raise _ended(Reason.TARGET_NOT_FOUND, str(exc)) from exc
    except TargetProblem as exc:
        raise _ended(Reason.TARGET_NOT_SCALABLE, str(exc)) from exc
    return target, watched


def stand_back_from_other_autoscalers(
    namespace: str, spec: WorkloadSizingSpec, target: TargetView, cycle: Cycle
) -> None:
    """Ends the turn when an HPA or ScaledObject scales the target, or when the list that
    would say so failed: a target not proven unowned is not touched."""
    if cycle.error is not None:
        raise _ended(Reason.AUTOSCALER_CHECK_FAILED, cycle.error, current_replicas=target.replicas)
    ref = spec.target_ref
    owner = cycle.autoscalers.get((namespace, ref.kind, ref.name))
    if owner is not None:
        raise _ended(
            Reason.CONFLICTING_AUTOSCALER,
            f"{owner} already scales {ref.kind} {ref.name}; standing back",
            current_replicas=target.replicas,
        )


async def observe(
    checked: Checked,
    pods: list[PodInfo],
    cycle: Cycle,
    services: Services,
    memory: Memory,
    held: Held,
    now: float,
) -> WorkloadSignals:
    """The workload's signals: the shared snapshot joined to its pods, plus its own queue and
    wake queries, if it has them, and the requests the activator holds for it. While
    Prometheus answers nothing those queries are not sent: each would fail too, after the
    timeout, and a round of them held up every decision."""
    spec, queries, source = checked.spec, checked.queries, services.metrics
    down = cycle.prometheus.down
    custom: PodSamples | Problem | None = None
    if queries.queue:
        custom = down.problem if down else await read_custom_queue(source, queries.queue)
    wake, wake_signal = None, "wakeQuery"
    if spec.scale_to_zero.enabled:
        query: tuple[float | None, Problem | None] | None = None
        if queries.wake:
            answer = (None, down.problem) if down else await source.scalar(queries.wake)
            obj = checked.obj
            max_age = spec.metrics.max_sample_age_seconds
            query = memory.wake_answer(obj.namespace, obj.name, answer, now, max_age)
        activator = spec.scale_to_zero.activator
        wake = wake_demand(activator, held, services.routes.activators(), query)
        if activator.enabled and (query is None or query[1] is None):
            wake_signal = ACTIVATOR_SIGNAL
    last = cycle.prometheus.outage
    outage = (last.since, last.until) if last is not None and last.until is not None else None
    return workload_signals(
        spec,
        pods,
        cycle.snapshot,
        now,
        custom_queue=custom,
        wake=wake,
        wake_signal=wake_signal,
        outage=outage,
    )


async def measure(
    checked: Checked, sized: Sized, services: Services, memory: Memory, now: float
) -> Measured:
    """What the workload's results cost over the right-sizing window, the throughput it
    showed, and what its pods held since this process last decided it (`measurement`)."""
    obj = checked.obj
    key = (obj.namespace, obj.name)
    return await services.right_sizer.measure(
        checked.spec, sized, key, obj.status, memory.throughput, memory.decided.get(key), now
    )


def decide(
    checked: Checked,
    pods: list[PodInfo],
    signals: WorkloadSignals,
    memory: Memory,
    now: float,
    unchanged_until: float | None = None,
) -> ReplicaDecision:
    """The replica policy on what the cluster and the metrics show, with the history the
    status carries. Its running decision was last seen at the later of this process's last
    decision and `unchanged_until`."""
    obj, target = checked.obj, checked.target
    counts = ReplicaCounts(
        current=target.replicas,
        ready=sum(1 for p in pods if p.ready and not p.terminating),
        starting=sum(1 for p in pods if p.starting),
        unobserved=signals.unobserved,
        unscraped=signals.unscraped,
        startup_seconds=measured_startup(pods),
    )
    key = (obj.namespace, obj.name)
    seen = memory.decided.get(key)
    if seen is not None and unchanged_until is not None:
        seen = max(seen, unchanged_until)
    history = replace(history_from_status(obj.status), decided_at=seen)
    decision = decide_replicas(checked.spec, counts, signals.signals, history, now)
    memory.decided[key] = now
    metrics.WORKLOADS.decided(
        obj.namespace,
        obj.name,
        decision.reason.value,
        desired=decision.desired,
        current=target.replicas,
        known=decision.metrics_known,
    )
    return decision


def measured_startup(pods: list[PodInfo]) -> float | None:
    """Seconds from creation to Ready of the workload's newest ready pod: how long a new
    replica takes, measured on this workload rather than assumed."""
    measured = [
        (p.created, p.ready_since - p.created)
        for p in pods
        if p.ready and p.created is not None and p.ready_since is not None
    ]
    return max(0.0, max(measured)[1]) if measured else None


def pause_source(annotations: Mapping[str, str], target: TargetView) -> str | None:
    """Which object carries the pause annotation, if either does."""
    if str(annotations.get(PAUSE_ANNOTATION, "")).lower() == "true":
        return "the WorkloadSizing"
    if str(target.annotations.get(PAUSE_ANNOTATION, "")).lower() == "true":
        return "the target"
    return None


def holding(
    checked: Checked, decision: ReplicaDecision, paused_by: str | None, reshaping: bool
) -> tuple[ConditionState, tuple[EventIntent, ...]] | None:
    """What holds the replicas where they are, if anything does: the Ready condition that says
    so, and the Event when a pause begins."""
    if checked.spec.mode == Mode.RECOMMEND:
        message = f"would set {decision.desired}: {decision.message}"
        return _ready(Reason.RECOMMEND_ONLY, message), ()
    if paused_by is not None:
        message = f"paused by the {PAUSE_ANNOTATION} annotation on {paused_by}"
        old = checked.obj.status.get("conditions")
        events: tuple[EventIntent, ...] = ()
        if flipped(old, ConditionType.READY, True, Reason.PAUSED):
            events = (EventIntent("Normal", EventReason.PAUSED, message),)
        return _ready(Reason.PAUSED, message), events
    if reshaping:
        message = f"replicas wait for the slice change to roll out (would set {decision.desired})"
        return _ready(Reason.RESHAPING, message), ()
    return None


async def route(
    checked: Checked,
    pods: list[PodInfo],
    decision: ReplicaDecision,
    hold: tuple[ConditionState, tuple[EventIntent, ...]] | None,
    routes: RouteClient,
    view: ClusterView,
    memory: Memory,
) -> Routed | None:
    """While no replica is ready the Service's traffic goes to the activator: the route goes
    in before the last replica goes (a request must never find neither) and comes out once a
    replica is ready. None for a workload that does not use the activator (a route it had is
    taken out)."""
    obj, spec, target = checked.obj, checked.spec, checked.target
    service = service_of(spec)
    if not uses_activator(spec):
        if obj.status.get("activator") is not None:
            try:
                await routes.route(obj.namespace, service, None)
            except RouteProblem as exc:
                log.warning("%s/%s: taking out the activator's route: %s", *_key(obj), exc)
        return None
    recorded = (obj.status.get("activator") or {}).get("port")
    port = activator_port(_key(obj), recorded, view.activator_ports or {}, memory.activator_ports)
    if port is None:
        problem = _route_failed(
            "spec.scaleToZero.activator: every activator port is held by another WorkloadSizing"
        )
        return Routed(None, Routing.DIRECT, problem, problem)
    memory.activator_ports[_key(obj)] = port
    ready = sum(1 for p in pods if p.ready and not p.terminating)
    to_zero = hold is None and decision.desired == 0 and target.replicas > 0
    if ready > 0 and not to_zero:
        try:
            await routes.route(obj.namespace, service, None)
        except RouteProblem as exc:
            return Routed(port, Routing.ACTIVATOR, _route_failed(f"{exc}; the activator stays"))
        return Routed(port, Routing.DIRECT)
    if port != recorded:
        # the activator listens on the ports the statuses show: this one is not shown yet
        waiting = _ready(Reason.ACTING, f"the activator takes port {port} before replicas go")
        return Routed(port, Routing.DIRECT, hold=waiting if to_zero else None)
    try:
        addresses = routes.activators()
        if not addresses:
            raise RouteProblem(
                "spec.scaleToZero.activator: no activator replica is ready to hold requests"
            )
        service_port = await routes.service_port(
            obj.namespace, service, spec.scale_to_zero.activator.port
        )
        await routes.route(
            obj.namespace,
            service,
            ActivatorRoute(obj.name, obj.uid, service, service_port, port, addresses),
        )
    except RouteProblem as exc:
        problem = _route_failed(str(exc))
        return Routed(port, Routing.DIRECT, problem, problem if to_zero else None)
    return Routed(port, Routing.ACTIVATOR, service_port=service_port)


def _key(obj: WorkloadObject) -> tuple[str, str]:
    return obj.namespace, obj.name


def _route_failed(why: str) -> ConditionState:
    return ConditionState(
        ConditionType.READY,
        False,
        Reason.ACTIVATOR_ROUTE_FAILED,
        f"{why}; replicas do not go to zero without the route",
    )


def _activator_status(
    obj: WorkloadObject, routed: Routed, held: Held, before: int, acted: Acted, now: float
) -> ActivatorStatus:
    """The port, the routing and the requests held; at a wake from zero, the time from the
    first request held to the /scale write (also in the operator's metrics)."""
    previous = obj.status.get("activator") or {}
    wake_seconds, wake_time = previous.get("lastWakeSeconds"), previous.get("lastWakeTime")
    service_port = routed.service_port
    if service_port is None:
        service_port = previous.get("servicePort")
    if before == 0 and acted.current > 0 and held.since is not None:
        wake_seconds, wake_time = round(max(0.0, now - held.since), 3), iso(now)
        metrics.ACTIVATOR_WAKE_SECONDS.observe(wake_seconds)
    return ActivatorStatus(
        port=routed.port,
        service_port=service_port,
        routing=routed.routing,
        pending_requests=held.pending,
        last_wake_seconds=wake_seconds,
        last_wake_time=wake_time,
    )


async def act(
    checked: Checked,
    decision: ReplicaDecision,
    hold: tuple[ConditionState, tuple[EventIntent, ...]] | None,
    targets: TargetClient,
    memory: Memory,
    now: float,
) -> Acted:
    """Writes the decided replicas, unless something holds them; a write that conflicts or
    fails is said in the Ready condition."""
    obj, target = checked.obj, checked.target
    unchanged = Acted(
        _ready(Reason.ACTING, decision.message),
        target.replicas,
        decision.history,
        obj.status.get("lastScaleTime"),
    )
    if hold is not None:
        ready, events = hold
        return replace(unchanged, ready=ready, events=events)
    if decision.desired == target.replicas:
        return unchanged
    namespace, name, ref = obj.namespace, obj.name, checked.spec.target_ref
    try:
        await targets.write(namespace, ref, target.replicas, decision.desired)
    except ScaleConflict as exc:
        if checked.watched is not None:
            memory.found_behind(namespace, name, checked.watched)
        metrics.WORKLOADS.scale_written(namespace, name, "conflict")
        log.info("%s/%s: %s", namespace, name, exc)
        return replace(unchanged, ready=_ready(Reason.ACTING, str(exc)))
    except TargetProblem as exc:
        if isinstance(exc, TargetUnanswered):  # it may have landed: the watch's copy may be older
            written_behind_the_watch(checked, memory)
        metrics.WORKLOADS.scale_written(namespace, name, "error")
        return replace(unchanged, ready=_ready(Reason.SCALE_FAILED, str(exc), ready=False))
    metrics.WORKLOADS.scale_written(namespace, name, "ok")
    written_behind_the_watch(checked, memory)
    return Acted(
        unchanged.ready,
        decision.desired,
        decision.history.with_scale_event(now, target.replicas, decision.desired),
        iso(now),
        (_scale_event(target.replicas, decision),),
    )


def written_behind_the_watch(checked: Checked, memory: Memory) -> None:
    """The turn changed its target: the watch's copy is older than the change until the watch
    shows it, and the next turn, a read period later, reads the target from the API server
    instead. Deciding again on the older copy started a second reshape a second after the
    first (the soak, bench/README.md), and met a conflict after each scale."""
    if checked.watched is not None:
        memory.found_behind(checked.obj.namespace, checked.obj.name, checked.watched)


def _ready(reason: Reason, message: str, ready: bool = True) -> ConditionState:
    return ConditionState(ConditionType.READY, ready, reason, message)


def _observation(signals: WorkloadSignals, now: float) -> Observation:
    def rounded(value: float | None, digits: int = 1) -> float | None:
        return None if value is None else round(value, digits)

    return Observation(
        gpu_utilization=rounded(signals.signals.gpu_utilization),
        queue_per_replica=rounded(signals.queue_per_replica, 2),
        memory_peak_mib=rounded(signals.memory_peak_mib, 0),
        sample_age_seconds=rounded(signals.sample_age_seconds, 0),
        time=iso(now),
    )


def _scaled_to_zero(
    current: int, decision: ReplicaDecision, spec: WorkloadSizingSpec
) -> ConditionState:
    if current == 0:
        back = "the wake query brings it back"
        if uses_activator(spec):
            back = "the activator holds its requests and brings it back"
        return ConditionState(
            ConditionType.SCALED_TO_ZERO, True, Reason.SCALE_TO_ZERO, f"scaled to zero; {back}"
        )
    return ConditionState(
        ConditionType.SCALED_TO_ZERO, False, Reason.IDLE if decision.idle else Reason.ACTIVE, ""
    )


def _scaling_limited(decision: ReplicaDecision) -> ConditionState:
    limited = decision.limited_by != Reason.NOT_LIMITED
    return ConditionState(
        ConditionType.SCALING_LIMITED,
        limited,
        decision.limited_by,
        decision.message if limited else "",
    )


def _out_of_memory(pods: list[PodInfo]) -> ConditionState | None:
    """Pods killed for lack of GPU memory: their slice is too small for the model."""
    victims = [p for p in pods if p.oom_kills > 0 and not p.terminating]
    if not victims:
        return None
    shown = ", ".join(f"{p.name} ({p.oom_kills}x on {p.gpu_resource})" for p in victims[:5])
    return ConditionState(
        ConditionType.RIGHT_SIZED,
        False,
        Reason.OUT_OF_MEMORY,
        f"out of memory: {shown}; the model needs a slice with more GPU memory",
    )


def _scale_event(before: int, decision: ReplicaDecision) -> EventIntent:
    if decision.desired == 0:
        return EventIntent("Normal", EventReason.SCALED_TO_ZERO, decision.message)
    if before == 0:
        return EventIntent("Normal", EventReason.WOKE, decision.message)
    return EventIntent(
        "Normal",
        EventReason.SCALED,
        f"scaled from {before} to {decision.desired}: {decision.message}",
    )
