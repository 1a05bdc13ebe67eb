"""observe -> decide -> actuate -> report, for one WorkloadSizing.

Kopf-free: the handler passes the object's parts in and posts the events and status patch this
returns, so the flow is testable and the handlers stay thin.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from gpusizer.actuate.targets import (
    ScaleConflict,
    TargetNotFound,
    TargetProblem,
    Targets,
    TargetView,
    cached_kind,
)
from gpusizer.api.v1alpha1 import Mode, TargetRef, WorkloadSizingSpec
from gpusizer.policy.replicas import ReplicaCounts, ReplicaDecision, decide_replicas
from gpusizer.report import metrics
from gpusizer.report.events import EventIntent
from gpusizer.report.status import (
    ConditionState,
    flipped,
    history_from_status,
    history_to_status,
    merge_conditions,
    refresh_seconds,
    status_patch,
)
from gpusizer.rightsizing import RightSizingOutcome, RightSizingSettings, right_size
from gpusizer.signals.autoscalers import TargetKey
from gpusizer.signals.discovery import NodeInfo
from gpusizer.signals.join import WorkloadSignals, moved_pods, workload_signals
from gpusizer.signals.parse import PodKey
from gpusizer.signals.pods import PodInfo, equality_term, matches_selector
from gpusizer.signals.promql import InvalidQuery, Tenancy, UserQueries, user_queries
from gpusizer.signals.source import PrometheusSource, Snapshot, SnapshotReader
from gpusizer.timefmt import iso
from gpusizer.vocabulary import ConditionType, EventReason, Reason

log = logging.getLogger(__name__)

PAUSE_ANNOTATION = "gpusizer.io/paused"
# The observation and condition wording are rewritten at most this often without another change.
STATUS_REFRESH_SECONDS = 60.0


@dataclass
class Outcome:
    status_patch: dict[str, Any]
    events: list[EventIntent] = field(default_factory=list)
    pods: tuple[PodKey, ...] = ()  # the pods the decision read: see Cycle.moved


@dataclass
class Cycle:
    """What one sync period's shared reads returned, for every workload."""

    snapshot: Snapshot
    autoscalers: Mapping[TargetKey, str]
    error: str | None = None
    workloads: int = 0  # how many decide on it
    # pods whose readings moved since the previous cycle: their workloads are decided first
    moved: frozenset[PodKey] = frozenset()


async def fetch_cycle(
    reader: SnapshotReader,
    list_autoscalers: Callable[[], Awaitable[Mapping[TargetKey, str]]],
) -> Cycle:
    """The batched Prometheus snapshot and the list of other autoscalers, for every workload."""
    started = time.monotonic()
    snapshot = await reader.read()
    metrics.CYCLE_SECONDS.labels(read="full" if snapshot.full else "moved").observe(
        time.monotonic() - started
    )
    try:
        owners = await list_autoscalers()
        error = None
    except Exception as exc:  # the API server is down or refusing: say so, act on nothing
        log.warning("listing HPAs and ScaledObjects failed: %s", exc)
        owners, error = {}, f"listing HPAs and ScaledObjects failed: {exc}"
    return Cycle(snapshot=snapshot, autoscalers=owners, error=error)


Urgency = Callable[[Cycle], bool]  # whether a workload's turn in a cycle comes first


class CycleClock:
    """One snapshot per read period, handed to every workload the moment it arrives.

    Each workload waits here for the next cycle instead of running on a timer of its own: with
    timers a change waited up to a period for the shared snapshot and up to another for the
    workload's own tick (bench/scale.py). Nothing is fetched while no workload listens (a
    replica paused behind its peer).

    A workload decides on every `decide_every`-th cycle (one sync period's worth of reads) and
    on any cycle in which it changed: a load change is acted on at the next read, while the
    workloads that did not change cost one decision per sync period (at 5,000 workloads one
    round of decisions takes most of a 5 s period, bench/scale.py `cycle_s`).

    A cycle wakes every workload at once and most decisions never wait, so one pass of the
    event loop would run all of them back to back (seconds at 5,000 workloads) while the
    watches, the event poster and the next snapshot wait: workloads take turns, one decision
    starting per pass, the others queued in order. Urgent ones (a workload whose readings
    moved) queue ahead of the rest: a load change would otherwise wait behind up to a whole
    round of unchanged decisions, about 5 s at 5,000 workloads (bench/scale.py `cycle_s`)."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[Cycle]],
        period_seconds: float,
        monotonic: Callable[[], float] = time.monotonic,
        decide_every: int = 1,
    ) -> None:
        self._fetch = fetch
        self._period = period_seconds
        self._decide_every = decide_every
        self._monotonic = monotonic  # for a cycle's age
        self._turn_taken = False
        # workloads waiting for their turn, each with what says whether a cycle is urgent to it
        self._turns: collections.deque[tuple[asyncio.Future[None], Urgency]] = collections.deque()
        self._urgent_turns: collections.deque[asyncio.Future[None]] = collections.deque()
        self._listeners = 0
        self._number = 0
        self._latest: Cycle | None = None
        self._published_at = 0.0
        self._arrived: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._wanted = asyncio.Event()

    async def run(self) -> None:
        """Fetch at every period while a workload listens; runs until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._listeners:
                self._wanted.clear()
                await self._wanted.wait()
            started = loop.time()
            try:
                self.publish(await self._fetch())
            except Exception:  # a bug, not an outage (fetch reports those): keep the beat
                log.exception("fetching the cycle's metrics failed")
            # the beat itself: the next period starts one period after this one did
            await asyncio.sleep(max(0.0, self._period - (loop.time() - started)))

    def publish(self, cycle: Cycle) -> None:
        before = self._latest.snapshot if self._latest is not None else None
        self._latest = replace(
            cycle, workloads=self._listeners, moved=moved_pods(before, cycle.snapshot)
        )
        # those still waiting from the last round (most of them, when a round of decisions
        # takes nearly a period) move up if this cycle is urgent to them
        waiting, self._turns = self._turns, collections.deque()
        for turn, urgent in waiting:
            self._queue(turn, urgent)
        self._published_at = self._monotonic()
        self._number += 1
        arrived, self._arrived = self._arrived, asyncio.get_running_loop().create_future()
        arrived.set_result(None)

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        self._listeners += 1
        self._wanted.set()
        try:
            yield
        finally:
            self._listeners -= 1

    async def cycles(
        self,
        until: asyncio.Future[Any],
        urgent: Urgency = lambda _: False,
        changed: Callable[[Cycle], bool] = lambda _: False,
    ) -> AsyncIterator[Cycle]:
        """The cycles to decide on from now on, until `until` is done: every `decide_every`-th
        since the last one decided on, and any in which `changed` says the workload changed,
        the turn taken ahead of the others when `urgent` says so. One that arrives while the
        caller is still busy with the previous is skipped for the newest, which is then decided
        on: what changed in the skipped one is not in the newest's changes. The first is the
        latest if it is at most a period old: after a pause it may be hours old.

        No cycle is kept here while waiting, for a turn or for the next cycle: every waiting
        workload held the one it last saw, and each cycle's snapshot with it (up to seven snapshots
        alive during the first round at 1,000 workloads, bench/README.md)."""
        decided = looked = 0  # the numbers of the cycles last decided on and last looked at
        while not until.done():
            if (
                self._latest is not None
                and self._number > looked
                and (decided or not self._stale())
            ):
                skipped = self._number > looked + 1
                looked = self._number
                if (
                    not decided
                    or skipped
                    or looked - decided >= self._decide_every
                    or changed(self._latest)
                ):
                    await self._turn(urgent)
                    if until.done():
                        return
                    # the newest: another may have come while this workload waited for its turn
                    decided = looked = self._number
                    yield self._latest
                    continue
            await asyncio.wait((self._arrived, until), return_when=asyncio.FIRST_COMPLETED)

    async def _turn(self, urgent: Urgency) -> None:
        """Returns when it is this workload's turn; the next one's comes at the next pass of
        the loop, whether this decision is done by then or waits for a write."""
        loop = asyncio.get_running_loop()
        if self._turn_taken:
            waiting = loop.create_future()
            self._queue(waiting, urgent)
            await waiting  # the turn is handed over taken
        else:
            self._turn_taken = True
        loop.call_soon(self._pass_turn)

    def _queue(self, waiting: asyncio.Future[None], urgent: Urgency) -> None:
        """Ahead of the rest if the latest cycle is urgent to it."""
        if self._latest is not None and urgent(self._latest):
            self._urgent_turns.append(waiting)
        else:
            self._turns.append((waiting, urgent))

    def _pass_turn(self) -> None:
        while self._urgent_turns or self._turns:
            waiting = (
                self._urgent_turns.popleft() if self._urgent_turns else self._turns.popleft()[0]
            )
            if not waiting.done():  # done: its workload was cancelled while it waited
                waiting.set_result(None)
                return
        self._turn_taken = False

    def _stale(self) -> bool:
        return self._monotonic() - self._published_at > self._period


class SpecCache:
    """Each workload's spec as validated at its generation: validating every spec every cycle
    was a fifth of a decision's time at 1,000 workloads (bench/scale.py profile). The API
    server bumps the generation at every change of the spec, so once per generation suffices."""

    def __init__(self) -> None:
        self._specs: dict[tuple[str, str], tuple[int, WorkloadSizingSpec]] = {}

    def get(
        self, namespace: str, name: str, generation: int | None, raw: Mapping[str, Any]
    ) -> WorkloadSizingSpec:
        """The validated spec; raises ValidationError, and then validates again next time."""
        known = self._specs.get((namespace, name))
        if known is not None and generation is not None and known[0] == generation:
            return known[1]
        spec = WorkloadSizingSpec.model_validate(raw)
        if generation is not None:
            self._specs[(namespace, name)] = (generation, spec)
        return spec

    def forget(self, namespace: str, name: str) -> None:
        self._specs.pop((namespace, name), None)


@dataclass
class Dependencies:
    prometheus: PrometheusSource
    targets: Targets
    rightsizing: RightSizingSettings
    tenancy: Tenancy = field(default_factory=Tenancy)
    status_refresh_seconds: float = STATUS_REFRESH_SECONDS
    # when this process last decided each workload: see History.decided_at
    decided: dict[tuple[str, str], float] = field(default_factory=dict)
    specs: SpecCache = field(default_factory=SpecCache)
    # the resourceVersion of each workload's target as the watch showed it when a scale write
    # found the API server's copy newer: see watched_target
    watch_behind: dict[tuple[str, str], str] = field(default_factory=dict)

    def forget(self, namespace: str, name: str) -> None:
        self.decided.pop((namespace, name), None)
        self.specs.forget(namespace, name)
        self.watch_behind.pop((namespace, name), None)

    def watched_target(
        self, namespace: str, name: str, ref: TargetRef, view: ClusterView
    ) -> TargetView | None:
        """The watch's copy of the target, unless a write found it out of date and the watch
        has shown nothing newer since. A watch whose connection a partition left silent shows
        an old copy until kopf's 70 s inactivity timeout: deciding on that copy meant a
        conflicting write every cycle and no scaling at all."""
        cached = view.target(namespace, ref)
        behind = self.watch_behind.get((namespace, name))
        if cached is None or behind is None:
            return cached
        if cached.resource_version == behind:
            return None
        del self.watch_behind[(namespace, name)]
        return cached

    def found_behind(self, namespace: str, name: str, watched: TargetView) -> None:
        """A write found the API server's copy of the target newer than the watch's."""
        self.watch_behind[(namespace, name)] = watched.resource_version


PodLabelKey = tuple[str, str, str]  # namespace, label key, label value


@dataclass(frozen=True)
class ClusterView:
    """What the watches show: pods by namespace and by label, GPU nodes by name, and
    Deployments and StatefulSets by kind, then (namespace, name)."""

    pods_by_namespace: Mapping[str, Iterable[PodInfo]]
    nodes: Mapping[str, NodeInfo]
    pods_by_label: Mapping[PodLabelKey, Iterable[PodInfo]] | None = None
    targets: Mapping[str, Mapping[tuple[str, str], TargetView]] | None = None

    def target(self, namespace: str, ref: TargetRef) -> TargetView | None:
        """The target as the watch shows it, so a cycle over thousands of workloads sends no
        GET for them; None (another kind, or one the watch has not shown yet) means read it
        from the API server, which also says exactly why when it does not exist."""
        if self.targets is None or not cached_kind(ref):
            return None
        return self.targets.get(ref.kind, {}).get((namespace, ref.name))

    def pods(self, namespace: str) -> Iterable[PodInfo]:
        return self.pods_by_namespace.get(namespace, ())

    def selected(self, namespace: str, selector: str) -> list[PodInfo]:
        """The namespace's pods a target's selector matches: through the label index when the
        selector has a key=value term, so a cycle over every workload of a namespace does not
        match each selector against each pod of it."""
        term = equality_term(selector)
        if term is None or self.pods_by_label is None:
            candidates = self.pods(namespace)
        else:
            candidates = self.pods_by_label.get((namespace, *term), ())
        return [p for p in candidates if matches_selector(p.labels, selector)]

    def all_pods(self) -> Iterable[PodInfo]:
        for pods in self.pods_by_namespace.values():
            yield from pods


def _spec_error(error: ValidationError) -> str:
    parts = []
    for err in error.errors()[:3]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"spec.{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return "; ".join(parts)


async def reconcile(
    namespace: str,
    name: str,
    spec_raw: Mapping[str, Any],
    status_raw: Mapping[str, Any] | None,
    annotations: Mapping[str, str],
    generation: int | None,
    view: ClusterView,
    cycle: Cycle,
    deps: Dependencies,
    now: float | None = None,
) -> Outcome:
    now = time.time() if now is None else now
    old_conditions = (status_raw or {}).get("conditions")
    events: list[EventIntent] = []
    read_pods: tuple[PodKey, ...] = ()

    def finish(status: dict[str, Any], conditions: list[ConditionState]) -> Outcome:
        for state in conditions:
            if state.status is False and flipped(old_conditions, state.type, False, state.reason):
                event = _warning_for(state)
                if event is not None:
                    events.append(event)
        metrics_now = next(
            (s for s in conditions if s.type == ConditionType.METRICS_AVAILABLE), None
        )
        if (
            metrics_now is not None
            and metrics_now.status
            and _was_false(old_conditions, ConditionType.METRICS_AVAILABLE)
        ):
            events.append(
                EventIntent("Normal", EventReason.METRICS_RECOVERED, "all signals are known again")
            )
        merged = merge_conditions(old_conditions, conditions, now, generation)
        metrics.WORKLOADS.set_conditions(namespace, name, merged)
        status = {**status, "observedGeneration": generation, "conditions": merged}
        refresh = refresh_seconds(deps.status_refresh_seconds, cycle.workloads)
        patch = status_patch(status_raw, status, now, refresh)
        return Outcome(status_patch=patch, events=events, pods=read_pods)

    try:
        spec = deps.specs.get(namespace, name, generation, spec_raw)
    except ValidationError as exc:
        message = _spec_error(exc)
        return finish(
            {}, [ConditionState(ConditionType.READY, False, Reason.INVALID_SPEC, message)]
        )

    try:
        queries = user_queries(spec, namespace, deps.tenancy)
    except InvalidQuery as exc:
        return finish(
            {}, [ConditionState(ConditionType.READY, False, Reason.INVALID_SPEC, str(exc))]
        )

    if spec.mode == Mode.OFF:
        return finish(
            {}, [ConditionState(ConditionType.READY, True, Reason.MODE_OFF, "mode is Off")]
        )

    try:
        watched = deps.watched_target(namespace, name, spec.target_ref, view)
        target = watched or await deps.targets.read(namespace, spec.target_ref)
    except TargetNotFound as exc:
        return finish(
            {}, [ConditionState(ConditionType.READY, False, Reason.TARGET_NOT_FOUND, str(exc))]
        )
    except TargetProblem as exc:
        return finish(
            {}, [ConditionState(ConditionType.READY, False, Reason.TARGET_NOT_SCALABLE, str(exc))]
        )

    if cycle.error is not None:
        return finish(
            {"currentReplicas": target.replicas},
            [
                ConditionState(
                    ConditionType.READY, False, Reason.AUTOSCALER_CHECK_FAILED, cycle.error
                )
            ],
        )
    owner = cycle.autoscalers.get((namespace, spec.target_ref.kind, spec.target_ref.name))
    if owner is not None:
        message = (
            f"{owner} already scales {spec.target_ref.kind} {spec.target_ref.name}; standing back"
        )
        return finish(
            {"currentReplicas": target.replicas},
            [ConditionState(ConditionType.READY, False, Reason.CONFLICTING_AUTOSCALER, message)],
        )

    owned = view.selected(namespace, target.selector)
    read_pods = tuple((p.namespace, p.name) for p in owned)
    signals = await _workload_signals(spec, queries, owned, cycle.snapshot, deps.prometheus, now)
    counts = ReplicaCounts(
        current=target.replicas,
        ready=sum(1 for p in owned if p.ready and not p.terminating),
        starting=sum(1 for p in owned if p.starting),
        unobserved=signals.unobserved,
    )
    history = replace(
        history_from_status(status_raw), decided_at=deps.decided.get((namespace, name))
    )
    decision = decide_replicas(spec, counts, signals.signals, history, now)
    deps.decided[(namespace, name)] = now
    metrics.WORKLOADS.decided(
        namespace,
        name,
        decision.reason.value,
        desired=decision.desired,
        current=target.replicas,
        known=decision.metrics_known,
    )

    paused_by = _paused_by(annotations, target)
    sizing = RightSizingOutcome()
    if spec.right_sizing.mode != Mode.OFF:
        sizing = await right_size(
            spec,
            namespace,
            target,
            owned,
            view.all_pods,
            view.nodes,
            deps.rightsizing,
            deps.targets,
            may_act=spec.mode == Mode.AUTO and paused_by is None,
            now=now,
        )
        events.extend(sizing.events)
    history = decision.history
    current = target.replicas
    last_scale_time = (status_raw or {}).get("lastScaleTime")
    ready_state = ConditionState(ConditionType.READY, True, Reason.ACTING, decision.message)
    if spec.mode == Mode.RECOMMEND:
        ready_state = ConditionState(
            ConditionType.READY,
            True,
            Reason.RECOMMEND_ONLY,
            f"would set {decision.desired}: {decision.message}",
        )
    elif paused_by is not None:
        ready_state = ConditionState(
            ConditionType.READY,
            True,
            Reason.PAUSED,
            f"paused by the {PAUSE_ANNOTATION} annotation on {paused_by}",
        )
        if flipped(old_conditions, ConditionType.READY, True, Reason.PAUSED):
            events.append(EventIntent("Normal", EventReason.PAUSED, ready_state.message))
    elif sizing.reshaping:
        ready_state = ConditionState(
            ConditionType.READY,
            True,
            Reason.RESHAPING,
            f"replicas wait for the slice change to roll out (would set {decision.desired})",
        )
    elif decision.desired != target.replicas:
        try:
            await deps.targets.write(namespace, spec.target_ref, target.replicas, decision.desired)
        except ScaleConflict as exc:
            if watched is not None:
                deps.found_behind(namespace, name, watched)
            metrics.WORKLOADS.scale_written(namespace, name, "conflict")
            log.info("%s/%s: %s", namespace, name, exc)
            ready_state = ConditionState(ConditionType.READY, True, Reason.ACTING, str(exc))
        except TargetProblem as exc:
            metrics.WORKLOADS.scale_written(namespace, name, "error")
            ready_state = ConditionState(ConditionType.READY, False, Reason.SCALE_FAILED, str(exc))
        else:
            metrics.WORKLOADS.scale_written(namespace, name, "ok")
            history = history.with_scale_event(now, target.replicas, decision.desired)
            current = decision.desired
            last_scale_time = iso(now)
            events.append(_scale_event(target.replicas, decision))

    status: dict[str, Any] = {
        "currentReplicas": current,
        "desiredReplicas": decision.desired,
        "observation": _observation(signals, now),
        "lastScaleTime": last_scale_time,
        **history_to_status(history),
    }
    if sizing.recommendation is not None:
        status["recommendation"] = sizing.recommendation
    metrics_state = _metrics_condition(signals, decision, queries.restricted)
    if queries.restricted and flipped(
        old_conditions,
        ConditionType.METRICS_AVAILABLE,
        metrics_state.status is True,
        Reason.QUERY_RESTRICTED,
    ):
        events.append(
            EventIntent("Warning", EventReason.QUERY_RESTRICTED, "; ".join(queries.restricted))
        )
    conditions = [
        ready_state,
        metrics_state,
        ConditionState(
            ConditionType.SCALED_TO_ZERO,
            current == 0,
            Reason.SCALE_TO_ZERO
            if current == 0
            else (Reason.IDLE if decision.idle else Reason.ACTIVE),
            "scaled to zero; the wake query brings it back" if current == 0 else "",
        ),
        ConditionState(
            ConditionType.SCALING_LIMITED,
            decision.limited_by != Reason.NOT_LIMITED,
            decision.limited_by,
            decision.message if decision.limited_by != Reason.NOT_LIMITED else "",
        ),
    ]
    sized = sizing.condition or _out_of_memory(owned)
    if sized is not None:
        conditions.append(sized)
    return finish(status, conditions)


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


def _was_false(conditions: Any, type_: ConditionType) -> bool:
    return any(
        isinstance(c, Mapping) and c.get("type") == type_.value and c.get("status") == "False"
        for c in conditions or []
    )


async def _workload_signals(
    spec: WorkloadSizingSpec,
    queries: UserQueries,
    pods: list[PodInfo],
    snapshot: Snapshot,
    prometheus: PrometheusSource,
    now: float,
) -> WorkloadSignals:
    custom = await prometheus.custom_per_pod(queries.queue) if queries.queue else None
    wake = None
    if spec.scale_to_zero.enabled and queries.wake:
        wake = await prometheus.scalar(queries.wake)
    return workload_signals(spec, pods, snapshot, now, custom_queue=custom, wake=wake)


def _paused_by(annotations: Mapping[str, str], target: TargetView) -> str | None:
    if str(annotations.get(PAUSE_ANNOTATION, "")).lower() == "true":
        return "the WorkloadSizing"
    if str(target.annotations.get(PAUSE_ANNOTATION, "")).lower() == "true":
        return "the target"
    return None


def _observation(signals: WorkloadSignals, now: float) -> dict[str, Any]:
    def rounded(value: float | None, digits: int = 1) -> float | None:
        return None if value is None else round(value, digits)

    return {
        "gpuUtilization": rounded(signals.signals.gpu_utilization),
        "queuePerReplica": rounded(signals.queue_per_replica, 2),
        "memoryPeakMiB": rounded(signals.memory_peak_mib, 0),
        "sampleAgeSeconds": rounded(signals.sample_age_seconds, 0),
        "time": iso(now),
    }


def _metrics_condition(
    signals: WorkloadSignals, decision: ReplicaDecision, restricted: tuple[str, ...]
) -> ConditionState:
    """A query confined to its namespace is named first: it is the likely cause of what
    follows, and the user must hear of it even while the metrics are known."""
    notes = [*restricted]
    reason = Reason.QUERY_RESTRICTED if restricted else Reason.METRICS_OK
    if signals.problems and not decision.metrics_known:
        notes.extend(str(p) for p in signals.problems)
        return ConditionState(
            ConditionType.METRICS_AVAILABLE,
            False,
            reason if restricted else signals.problems[0].reason,
            f"{'; '.join(notes)}. Holding replicas: no scale-down or scale to zero on unknown "
            "metrics",
        )
    return ConditionState(ConditionType.METRICS_AVAILABLE, True, reason, "; ".join(notes))


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


_WARNINGS: dict[Reason, EventReason] = {
    Reason.TARGET_NOT_FOUND: EventReason.TARGET_NOT_FOUND,
    Reason.TARGET_NOT_SCALABLE: EventReason.TARGET_NOT_FOUND,
    Reason.CONFLICTING_AUTOSCALER: EventReason.CONFLICTING_AUTOSCALER,
    Reason.INVALID_SPEC: EventReason.INVALID_SPEC,
    Reason.SCALE_FAILED: EventReason.SCALE_FAILED,
    Reason.OUT_OF_MEMORY: EventReason.OUT_OF_MEMORY,
}


def _warning_for(state: ConditionState) -> EventIntent | None:
    if state.type == ConditionType.METRICS_AVAILABLE:
        return EventIntent("Warning", EventReason.METRICS_UNAVAILABLE, state.message)
    reason = _WARNINGS.get(state.reason)
    return None if reason is None else EventIntent("Warning", reason, state.message)
