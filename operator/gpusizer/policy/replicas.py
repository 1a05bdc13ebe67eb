"""The replica policy: how many replicas a workload should have now.

Pure: the caller passes the spec, what the cluster and Prometheus showed, the decision history
and the clock; the result is plain data. The operator and the simulator run this same code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from gpusizer.api.v1alpha1 import ReplicasSpec, WorkloadSizingSpec
from gpusizer.policy.warmth import Warmth, expected_onset, observe
from gpusizer.vocabulary import Reason

# How far back scale events are kept and read for recurring shortfalls (see _recurring_hold).
RECURRENCE_LOOKBACK_SECONDS = 3600.0


@dataclass(frozen=True)
class ReplicaCounts:
    """Replicas as the cluster shows them."""

    current: int  # what the target asks for (its /scale spec.replicas)
    ready: int  # pods serving
    starting: int  # pods pending or running but not ready: capacity on its way
    # ready pods that became ready after the metrics were sampled: the metrics do not show
    # their capacity yet, so they are counted like starting ones
    unobserved: int = 0
    # ready pods whose samples are an earlier read's, their series gone from the latest answers
    # (a failed scrape): decided on while fresh, but no reason to remove capacity
    unscraped: int = 0
    # measured time from a pod's creation to Ready, the newest seen; None when none measured
    startup_seconds: float | None = None

    @property
    def arriving(self) -> int:
        """Capacity the metrics do not reflect yet."""
        return self.starting + self.unobserved


@dataclass(frozen=True)
class Signals:
    """What Prometheus showed for one workload; None means unknown, never zero."""

    gpu_utilization: float | None = None  # mean percent over ready pods
    queue_total: float | None = None  # waiting requests summed over pods
    wake_demand: float | None = None  # value of the wake query
    kv_cache_usage: float | None = None  # mean share (0-1) of the KV cache in use, ready pods
    # requests arriving per second (the gateway's, else the servers' completions); None when
    # not read: the idle rule then rests on utilisation and queue alone
    request_rate: float | None = None
    unknown_reasons: tuple[str, ...] = ()  # why a signal is unknown, for the user


@dataclass(frozen=True)
class ScaleEventRecord:
    time: float
    from_replicas: int
    to_replicas: int


@dataclass(frozen=True)
class History:
    """Everything a decision depends on besides the present: persisted in the status.

    `recommendations` are runs of equal values. Every entry but the last is a finished run,
    stamped with the last time its value was recommended; the last entry is the run still going
    on, stamped with its start, and its value holds until the decision that reads it. So the
    persisted list changes only when the recommendation does, and a steady workload costs no
    status write.
    """

    recommendations: tuple[tuple[float, int], ...] = ()
    scale_events: tuple[ScaleEventRecord, ...] = ()
    last_active_time: float | None = None
    # When this process last decided: closes the running entry exactly. None after a restart
    # (or for a new object): the decision then holds what the target has for one down window,
    # because the operator did not see the time it was away.
    decided_at: float | None = None
    warmth: Warmth = field(default_factory=Warmth)  # idle gaps, onsets, start-up

    def with_scale_event(self, now: float, from_replicas: int, to_replicas: int) -> History:
        """Record a change that was actually made (Recommend mode records none)."""
        event = ScaleEventRecord(now, from_replicas, to_replicas)
        return replace(self, scale_events=(*self.scale_events, event))


@dataclass(frozen=True)
class ReplicaDecision:
    desired: int
    reason: Reason
    message: str
    limited_by: Reason = Reason.NOT_LIMITED
    metrics_known: bool = True
    idle: bool = False
    history: History = field(default_factory=History)

    # the same decision at any later time on the same readings, pods and replicas: they are
    # where the readings put them, so no window, step limit, recurring hold or idle clock can
    # move them as time passes (fleet.py: such a workload's turns may wait)
    steady: bool = False


_DecisionFactory = Callable[[int, Reason, str, Reason], "ReplicaDecision"]


def decide_replicas(
    spec: WorkloadSizingSpec,
    counts: ReplicaCounts,
    signals: Signals,
    history: History,
    now: float,
) -> ReplicaDecision:
    """Desired replicas for one workload at time `now`."""
    rules = spec.replicas
    stz = spec.scale_to_zero
    zero_allowed = stz.enabled and rules.minimum == 0
    missing = _missing_signals(spec, counts, signals, zero_allowed)
    metrics_known = not missing
    demand_outside = signals.wake_demand is not None and signals.wake_demand > stz.wake_threshold
    idle = metrics_known and _is_idle(spec, counts, signals, demand_outside)
    last_active = history.last_active_time
    if last_active is None or not idle:
        last_active = now
    previous_decision = history.decided_at
    warmth = observe(
        history.warmth,
        now,
        since=previous_decision,
        quiet=_quiet(spec, counts, signals, demand_outside) if metrics_known else None,
        request_rate=signals.request_rate,
        startup_seconds=counts.startup_seconds,
        serving=counts.ready > 0,
        budget_percent=stz.max_cold_start_percent if zero_allowed else None,
    )
    history = History(
        recommendations=_prune_recommendations(history.recommendations, rules, now),
        scale_events=_prune_events(history.scale_events, rules, now),
        last_active_time=last_active,
        decided_at=now,
        warmth=warmth,
    )
    learned = warmth.idle_seconds_at(last_active)
    idle_seconds = stz.idle_seconds if learned is None else learned
    onset = expected_onset(warmth, now) if zero_allowed and stz.pre_warm else None
    unknown_note = f"; unknown: {', '.join(signals.unknown_reasons or missing)}" if missing else ""

    def decision(desired: int, reason: Reason, message: str, limited: Reason) -> ReplicaDecision:
        return ReplicaDecision(
            desired=desired,
            reason=reason,
            message=message + unknown_note,
            limited_by=limited,
            metrics_known=metrics_known,
            idle=idle,
            history=history,
        )

    if counts.current == 0:
        if zero_allowed and onset is not None and not demand_outside and metrics_known:
            # a recurring return from idle is due within a start-up: be ready for it; the
            # replica then counts as active from now, so it stays the idle time after Ready
            history = replace(history, last_active_time=now)
            message = (
                f"demand came back at this time before (expected in {onset - now:.0f}s, "
                f"start-up {warmth.startup:.0f}s): pre-warming 1"
            )
            return decision(1, Reason.PRE_WARM, message, Reason.NOT_LIMITED)
        return _decide_at_zero(spec, signals, history, now, zero_allowed, demand_outside, decision)

    idle_for = now - last_active
    if zero_allowed and idle and idle_for >= idle_seconds and counts.unscraped == 0:
        source = (
            f"learned for a {stz.max_cold_start_percent:g}% cold-start budget"
            if learned is not None
            else "idleSeconds"
        )
        if onset is None:
            message = (
                f"idle for {idle_for:.0f}s (>= {idle_seconds:.0f}s, {source}): scaling to zero"
            )
            return decision(0, Reason.SCALE_TO_ZERO, message, Reason.NOT_LIMITED)
        message = (
            f"idle for {idle_for:.0f}s, but demand came back at this time before "
            f"(expected in {onset - now:.0f}s): staying warm"
        )
        return decision(counts.current, Reason.PRE_WARM, message, Reason.NOT_LIMITED)

    proposal, notes, waiting = _proposal(spec, counts, signals)
    raw = proposal
    if missing or counts.starting > 0:
        raw = max(raw, counts.current)
    floor = 1 if zero_allowed else rules.minimum
    limited = Reason.NOT_LIMITED
    if raw > rules.maximum:
        raw, limited = rules.maximum, Reason.AT_MAX
    elif raw < floor:
        raw, limited = floor, Reason.AT_MIN
    recommendations = history.recommendations
    if (previous_decision is None or not recommendations) and raw < counts.current:
        # The replicas the target has count as recommended now, so the first reading of a
        # new object, after a restart or after a wake, never scales down inside the window.
        recommendations = _recommend(recommendations, counts.current, None, now)
        previous_decision = now
    history = replace(
        history, recommendations=_recommend(recommendations, raw, previous_decision, now)
    )

    desired = _stabilize(history.recommendations, rules, counts.current, now)
    if desired != raw:
        limited = Reason.STABILIZATION_WINDOW
    hold = _recurring_hold(history.scale_events, rules, now)
    if hold is not None and desired < min(counts.current, hold.level):
        desired, limited = min(counts.current, hold.level), Reason.RECURRING_SHORTFALL
        notes.append(hold.note)
    stepped = _step_limit(history.scale_events, rules, counts.current, desired, now)
    if stepped != desired:
        desired, limited = stepped, Reason.STEP_LIMIT
    if (counts.unobserved > 0 or counts.unscraped > 0) and desired < counts.current:
        # Metrics older than the newest ready pods say nothing about them, and a pod's last
        # samples say nothing of the load since its scrape failed: wait for a sample, without
        # recording it, so the down window is not pinned by the wait.
        desired, limited = counts.current, Reason.NOT_LIMITED
    # The bounds are hard: a step limit shapes moves inside them, never keeps the workload out.
    if desired > rules.maximum:
        desired, limited = rules.maximum, Reason.AT_MAX
    elif desired < floor:
        desired, limited = floor, Reason.AT_MIN

    message = "; ".join(notes) if notes else "no signal proposes a change"
    if desired > counts.current:
        reason = Reason.SCALE_UP
    elif desired < counts.current:
        reason = Reason.SCALE_DOWN
    elif missing:
        reason = Reason.HOLDING_ON_UNKNOWN_METRICS
        message += "; holding: never scale down on unknown metrics"
    elif waiting:
        reason = Reason.WAITING_FOR_STARTING_REPLICAS
    else:
        reason = Reason.WITHIN_TOLERANCE
    if counts.arriving > 0:
        message += f"; {counts.arriving} replica(s) starting or unseen count as capacity"
    steady = (
        reason == Reason.WITHIN_TOLERANCE
        and raw == counts.current
        and counts.arriving == 0
        and counts.unscraped == 0
        and not zero_allowed
    )
    return replace(decision(desired, reason, f"{message} -> {desired}", limited), steady=steady)


def _missing_signals(
    spec: WorkloadSizingSpec, counts: ReplicaCounts, signals: Signals, zero_allowed: bool
) -> list[str]:
    """Signals the decision needs but does not have."""
    rules = spec.replicas
    missing = []
    if counts.ready > 0:
        if rules.target_gpu_utilization is not None and signals.gpu_utilization is None:
            missing.append("gpuUtilization")
        if rules.target_kv_cache_usage is not None and signals.kv_cache_usage is None:
            missing.append("kvCacheUsage")
        if rules.target_queue_per_replica is not None and signals.queue_total is None:
            missing.append("queue")
    if zero_allowed and signals.wake_demand is None:
        missing.append("wakeQuery")
    return missing


def _is_idle(
    spec: WorkloadSizingSpec, counts: ReplicaCounts, signals: Signals, demand_outside: bool
) -> bool:
    """Idle needs positive evidence: low utilisation seen, no queue, nothing starting."""
    if counts.arriving > 0:
        return False
    return _quiet(spec, counts, signals, demand_outside) is True


def _quiet(
    spec: WorkloadSizingSpec, counts: ReplicaCounts, signals: Signals, demand_outside: bool
) -> bool | None:
    """No demand seen: no wake demand, no request arriving (when the rate is read), no queue,
    utilisation under idleUtilization. None when it cannot be told (no replica reports)."""
    if demand_outside:
        return False
    if signals.request_rate is not None and signals.request_rate > 0:
        return False
    if counts.current == 0:
        return True
    if signals.gpu_utilization is None or counts.ready == 0:
        return None
    if signals.gpu_utilization >= spec.scale_to_zero.idle_utilization:
        return False
    return not (signals.queue_total is not None and signals.queue_total > 0)


def _decide_at_zero(
    spec: WorkloadSizingSpec,
    signals: Signals,
    history: History,
    now: float,
    zero_allowed: bool,
    demand_outside: bool,
    decision: _DecisionFactory,
) -> ReplicaDecision:
    rules = spec.replicas
    if not zero_allowed:
        return decision(
            0,
            Reason.STAYING_AT_ZERO,
            "the target has 0 replicas and scale to zero is not enabled: left alone, as HPA does",
            Reason.NOT_LIMITED,
        )
    if not demand_outside or signals.wake_demand is None:
        shown = "unknown" if signals.wake_demand is None else f"{signals.wake_demand:g}"
        return decision(
            0,
            Reason.STAYING_AT_ZERO,
            f"wake query {shown} (threshold {spec.scale_to_zero.wake_threshold:g})",
            Reason.NOT_LIMITED,
        )
    wanted = 1
    if rules.target_queue_per_replica is not None:
        wanted = max(1, math.ceil(signals.wake_demand / rules.target_queue_per_replica))
    stepped = _step_limit(history.scale_events, rules, 0, wanted, now)
    desired = min(wanted, rules.maximum, max(1, stepped))
    limited = Reason.NOT_LIMITED
    if desired < wanted:
        limited = Reason.AT_MAX if desired == rules.maximum else Reason.STEP_LIMIT
    message = (
        f"wake query {signals.wake_demand:g} > {spec.scale_to_zero.wake_threshold:g}: "
        f"waking to {desired}"
    )
    return decision(desired, Reason.WAKE, message, limited)


def _proposal(
    spec: WorkloadSizingSpec, counts: ReplicaCounts, signals: Signals
) -> tuple[int, list[str], bool]:
    """Replicas each known signal asks for (the largest wins), with a note per signal.

    Returns (proposal, notes, waiting) where waiting says a queue-driven rise was held back
    because replicas are still starting: the queue they will drain is not a reason to add more.
    """
    rules = spec.replicas
    proposals: list[int] = []
    notes: list[str] = []
    waiting = False
    util = signals.gpu_utilization
    # the utilisation is a mean over the pods that were ready when it was sampled
    observed = counts.ready - counts.unobserved
    if rules.target_gpu_utilization is not None and util is not None and observed > 0:
        target = rules.target_gpu_utilization
        ratio = util / target
        if abs(ratio - 1) <= rules.tolerance:
            wanted = counts.current
        else:
            wanted = math.ceil(observed * ratio)
        proposals.append(wanted)
        notes.append(f"utilisation {util:.1f}% vs target {target:g}% on {observed} ready")
    kv = signals.kv_cache_usage
    if rules.target_kv_cache_usage is not None and kv is not None and observed > 0:
        target = rules.target_kv_cache_usage
        ratio = 100.0 * kv / target
        wanted = (
            counts.current if abs(ratio - 1) <= rules.tolerance else math.ceil(observed * ratio)
        )
        proposals.append(wanted)
        notes.append(f"KV cache {100.0 * kv:.1f}% vs target {target:g}% on {observed} ready")
    queue = signals.queue_total
    target_queue = rules.target_queue_per_replica
    if target_queue is not None and queue is not None:
        per_replica = queue / max(counts.ready, 1)
        if counts.ready > 0 and abs(per_replica / target_queue - 1) <= rules.tolerance:
            wanted = counts.current
        else:
            wanted = math.ceil(queue / target_queue)
        if counts.arriving > 0 and wanted > counts.current:
            wanted, waiting = counts.current, True
        proposals.append(wanted)
        notes.append(f"queue {queue:g} vs {target_queue:g} per replica")
    return (max(proposals) if proposals else counts.current), notes, waiting


def _stabilize(
    recommendations: tuple[tuple[float, int], ...],
    rules: ReplicasSpec,
    current: int,
    now: float,
) -> int:
    """HPA's rule: up to the lowest recommendation of the up window, down to the highest of
    the down window, so a brief dip or spike does not move the workload. The running entry is
    the recommendation made now."""
    up_window = rules.scale_up.stabilization_window_seconds
    down_window = rules.scale_down.stabilization_window_seconds
    finished, running = recommendations[:-1], recommendations[-1][1]
    up_values = [running, *(n for t, n in finished if t > now - up_window and up_window > 0)]
    down_values = [
        running,
        *(n for t, n in finished if t > now - down_window and down_window > 0),
    ]
    desired = current
    up_recommendation = min(up_values)
    down_recommendation = max(down_values)
    if desired < up_recommendation:
        desired = up_recommendation
    if desired > down_recommendation:
        desired = down_recommendation
    return desired


def _step_limit(
    events: Iterable[ScaleEventRecord],
    rules: ReplicasSpec,
    current: int,
    desired: int,
    now: float,
) -> int:
    """At most maxReplicasPerStep added (or removed) within each periodSeconds."""
    up = rules.scale_up
    down = rules.scale_down
    recent = list(events)
    if desired > current:
        added = sum(
            e.to_replicas - e.from_replicas
            for e in recent
            if e.to_replicas > e.from_replicas and e.time > now - up.period_seconds
        )
        return min(desired, max(current, current - added + up.max_replicas_per_step))
    if desired < current:
        removed = sum(
            e.from_replicas - e.to_replicas
            for e in recent
            if e.to_replicas < e.from_replicas and e.time > now - down.period_seconds
        )
        return max(desired, min(current, current + removed - down.max_replicas_per_step))
    return desired


@dataclass(frozen=True)
class _Hold:
    level: int  # no scale-down below this
    note: str


def _recurring_hold(
    events: Iterable[ScaleEventRecord], rules: ReplicasSpec, now: float
) -> _Hold | None:
    """Keep capacity that the recent past shows is needed again soon after it is released.

    Releasing a GPU replica that is needed again costs its start-up in GPU time and, worse, the
    requests that wait for it; so the scale events of the last hour are read for *shortfalls*:
    a scale-down (or a run of them) ended by a scale-up beyond what a fully busy fleet's
    utilisation asks for (ceil(from x 100 / targetGPUUtilization); with a queue target only,
    any rise), which only the queue or the gateway asks: requests waited. A wake from zero is
    not one (scale to zero has its own idle rule). The account is kept per replica: each
    replica bought back was released by the descent step that crossed its level, and it is a
    regret if it came back within a down window of that step. A rise with no regret is not a
    shortfall: the window is about one start-up, and holding an idle replica for longer than
    two start-ups costs more than starting it again (ski rental). A long descent whose first
    steps are older than a window still ends in a shortfall when the replicas it released last
    are bought back within one. One shortfall is an accident; two in the hour are a pattern:
    bursts that recur with gaps longer than the down window. Then a scale-down below the
    highest level those scale-ups reached waits until the down window plus the longest regret
    (the longest a replica was away before it was bought back, at most a window) has passed
    since the last scale event: capacity is let go a step at a time, each step one gap after
    the last change, so a burst that recurs within the gaps seen finds it. Otherwise, and once
    the evidence is an hour old, the down window alone rules.
    """
    recent = [e for e in events if e.time > now - RECURRENCE_LOOKBACK_SECONDS]
    target = rules.target_gpu_utilization
    window = rules.scale_down.stabilization_window_seconds
    descent: list[ScaleEventRecord] = []  # the scale-downs since the last rise
    levels: list[int] = []
    gaps: list[float] = []
    for e in recent:
        if e.to_replicas < e.from_replicas:
            descent.append(e)
        elif e.to_replicas > e.from_replicas:
            fully_busy = e.from_replicas
            if target is not None:
                fully_busy = math.ceil(e.from_replicas * 100.0 / target - 1e-9)
            if e.from_replicas > 0 and e.to_replicas > fully_busy:
                # each replica bought back was released by the step that crossed its level;
                # those back within a window of their release are the regrets
                regrets = [
                    e.time - d.time
                    for d in descent
                    if d.to_replicas < e.to_replicas
                    and d.from_replicas > e.from_replicas
                    and e.time - d.time <= window
                ]
                if regrets:
                    levels.append(e.to_replicas)
                    gaps.append(max(regrets))
            descent = []
    if len(levels) < 2 or not recent:
        return None
    until = recent[-1].time + window + max(gaps)
    if now >= until:
        return None
    note = (
        f"{len(levels)} shortfalls in the last {RECURRENCE_LOOKBACK_SECONDS:.0f}s came back "
        f"up to {max(levels)} within {max(gaps):.0f}s of a scale-down: holding "
        f"{max(levels)} for {until - now:.0f}s more"
    )
    return _Hold(level=max(levels), note=note)


def _prune_recommendations(
    recommendations: tuple[tuple[float, int], ...], rules: ReplicasSpec, now: float
) -> tuple[tuple[float, int], ...]:
    """Finished runs the windows can no longer see go; the running one stays."""
    keep = max(
        rules.scale_up.stabilization_window_seconds, rules.scale_down.stabilization_window_seconds
    )
    finished = tuple((t, n) for t, n in recommendations[:-1] if t > now - keep)
    return finished + recommendations[-1:]


def _recommend(
    recommendations: tuple[tuple[float, int], ...],
    replicas: int,
    previous_decision: float | None,
    now: float,
) -> tuple[tuple[float, int], ...]:
    """Continue the running entry, or finish it and start a new one.

    A finished run is stamped with the previous decision; unknown (after a restart) it is
    taken to have lasted until now, which only ever holds more replicas for longer."""
    if recommendations and recommendations[-1][1] == replicas:
        return recommendations
    if recommendations:
        last_seen = now if previous_decision is None else previous_decision
        recommendations = (*recommendations[:-1], (last_seen, recommendations[-1][1]))
    return (*recommendations, (now, replicas))


def _prune_events(
    events: tuple[ScaleEventRecord, ...], rules: ReplicasSpec, now: float
) -> tuple[ScaleEventRecord, ...]:
    keep = max(
        rules.scale_up.period_seconds, rules.scale_down.period_seconds, RECURRENCE_LOOKBACK_SECONDS
    )
    return tuple(e for e in events if e.time > now - keep)
