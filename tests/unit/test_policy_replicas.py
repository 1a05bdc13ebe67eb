"""The replica policy, rule by rule as tables of (state in, decision out), plus properties."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.policy.replicas import (
    History,
    ReplicaCounts,
    ScaleEventRecord,
    Signals,
    decide_replicas,
)
from gpusizer.report.status import history_from_status
from gpusizer.vocabulary import Reason
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_report_status import history_json

NOW = 10_000.0


def make_spec(
    *,
    util: float | None = 70,
    queue: float | None = None,
    minimum: int = 1,
    maximum: int = 100,
    tolerance: float = 0.1,
    up: tuple[int, int, int] = (0, 100, 15),
    down: tuple[int, int, int] = (0, 100, 15),
    zero: bool = False,
    idle_seconds: int = 600,
    wake_threshold: float = 0,
) -> WorkloadSizingSpec:
    """A spec whose limits stay out of the way unless a test sets them."""
    replicas: dict[str, Any] = {
        "min": minimum,
        "max": maximum,
        "tolerance": tolerance,
        "scaleUp": dict(zip(("stabilizationWindowSeconds", "maxReplicasPerStep",
                             "periodSeconds"), up, strict=True)),
        "scaleDown": dict(zip(("stabilizationWindowSeconds", "maxReplicasPerStep",
                               "periodSeconds"), down, strict=True)),
    }  # fmt: skip
    if util is not None:
        replicas["targetGPUUtilization"] = util
    if queue is not None:
        replicas["targetQueuePerReplica"] = queue
    document: dict[str, Any] = {"targetRef": {"name": "chat"}, "replicas": replicas}
    if zero:
        document["scaleToZero"] = {
            "enabled": True,
            "idleSeconds": idle_seconds,
            "wakeQuery": "sum(gateway_pending_requests)",
            "wakeThreshold": wake_threshold,
        }
    return WorkloadSizingSpec.model_validate(document)


def counts(
    current: int, ready: int | None = None, starting: int = 0, unobserved: int = 0
) -> ReplicaCounts:
    return ReplicaCounts(
        current=current,
        ready=current - starting if ready is None else ready,
        starting=starting,
        unobserved=unobserved,
    )


# --- utilisation formula: ceil(ready x util / target) ------------------------------------------


@pytest.mark.parametrize(
    ("ready", "util", "target", "desired"),
    [
        (4, 140.0, 70, 8),
        (4, 35.0, 70, 2),
        (3, 100.0, 70, 5),  # ceil(4.29)
        (5, 50.0, 70, 4),  # ceil(3.57)
        (10, 7.0, 70, 1),
        (2, 100.0, 50, 4),
        (4, 75.0, 70, 4),  # within tolerance
    ],
)
def test_utilisation_formula(ready: int, util: float, target: float, desired: int) -> None:
    decision = decide_replicas(
        make_spec(util=target), counts(ready), Signals(gpu_utilization=util), History(), NOW
    )
    assert decision.desired == desired


# --- queue formula: ceil(total queue / targetQueuePerReplica) ----------------------------------


@pytest.mark.parametrize(
    ("current", "queue", "target", "desired"),
    [
        (2, 20.0, 4, 5),
        (2, 9.0, 4, 3),
        (6, 0.0, 4, 1),  # an empty queue asks for none; min is 1
        (1, 100.0, 10, 10),
        (5, 19.0, 4, 5),  # 3.8 per replica: within tolerance of 4
    ],
)
def test_queue_formula(current: int, queue: float, target: float, desired: int) -> None:
    spec = make_spec(util=None, queue=target)
    decision = decide_replicas(spec, counts(current), Signals(queue_total=queue), History(), NOW)
    assert decision.desired == desired


@pytest.mark.parametrize(
    ("util", "queue", "desired"),
    [
        (140.0, 4.0, 8),  # utilisation asks 8, queue 1
        (35.0, 40.0, 10),  # utilisation asks 2, queue 10
        (70.0, 0.0, 4),  # utilisation within tolerance keeps 4; queue asks 0
        (10.0, 0.0, 1),
    ],
)
def test_larger_proposal_wins(util: float, queue: float, desired: int) -> None:
    spec = make_spec(util=70, queue=4)
    signals = Signals(gpu_utilization=util, queue_total=queue)
    assert decide_replicas(spec, counts(4), signals, History(), NOW).desired == desired


@pytest.mark.parametrize(
    ("util", "tolerance", "desired", "reason"),
    [
        (76.0, 0.1, 4, Reason.WITHIN_TOLERANCE),  # ratio 1.086
        (78.0, 0.1, 5, Reason.SCALE_UP),  # ratio 1.114
        (64.0, 0.1, 4, Reason.WITHIN_TOLERANCE),  # ratio 0.914
        (62.0, 0.1, 4, Reason.WITHIN_TOLERANCE),  # outside, but ceil(3.54) is 4
        (50.0, 0.1, 3, Reason.SCALE_DOWN),
        (83.0, 0.2, 4, Reason.WITHIN_TOLERANCE),
        (85.0, 0.2, 5, Reason.SCALE_UP),
        (71.0, 0.0, 5, Reason.SCALE_UP),
    ],
)
def test_tolerance(util: float, tolerance: float, desired: int, reason: Reason) -> None:
    spec = make_spec(util=70, tolerance=tolerance)
    decision = decide_replicas(spec, counts(4), Signals(gpu_utilization=util), History(), NOW)
    assert (decision.desired, decision.reason) == (desired, reason)


# --- stabilisation windows, per direction ------------------------------------------------------


@pytest.mark.parametrize(
    ("past", "down_window", "up_window", "util", "desired", "held"),
    [
        # down (util asks 4): the highest recommendation of the window holds the workload up
        (((NOW - 100, 8),), 300, 0, 35.0, 8, True),
        (((NOW - 100, 6),), 300, 0, 35.0, 6, True),
        (((NOW - 400, 8),), 300, 0, 35.0, 4, False),  # outside the window
        (((NOW - 299, 8), (NOW - 200, 5)), 300, 0, 35.0, 8, True),
        (((NOW - 100, 8),), 0, 0, 35.0, 4, False),  # no window
        # up (util asks 32): the lowest recommendation of the window holds it down
        (((NOW - 30, 8),), 0, 60, 280.0, 8, True),
        (((NOW - 30, 10),), 0, 60, 280.0, 10, True),
        (((NOW - 90, 8),), 0, 60, 280.0, 32, False),  # outside the window
    ],
)
def test_stabilisation_windows(
    past: tuple[tuple[float, int], ...],
    down_window: int,
    up_window: int,
    util: float,
    desired: int,
    held: bool,
) -> None:
    spec = make_spec(util=70, up=(up_window, 100, 15), down=(down_window, 100, 15))
    # decided at the last entry's time: each entry is one reading, as in HPA's list
    history = History(recommendations=past, decided_at=past[-1][0])
    decision = decide_replicas(spec, counts(8), Signals(gpu_utilization=util), history, NOW)
    assert decision.desired == desired
    assert (decision.limited_by == Reason.STABILIZATION_WINDOW) == held


# --- step limits per period ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "util", "events", "desired"),
    [
        (2, 350.0, (), 6),  # wants 10: +4 per 15 s
        (2, 350.0, ((NOW - 10, 0, 2),), 4),  # 2 already added in this period
        (4, 350.0, ((NOW - 10, 0, 4),), 4),  # the period's 4 are used up
        (2, 350.0, ((NOW - 20, 0, 2),), 6),  # that step was in the previous period
        (10, 14.0, (), 8),  # wants 2: -2 per 15 s
        (10, 14.0, ((NOW - 5, 12, 10),), 10),
        (10, 14.0, ((NOW - 5, 11, 10),), 9),
        (10, 14.0, ((NOW - 16, 12, 10),), 8),
    ],
)
def test_step_limits(
    current: int, util: float, events: tuple[tuple[float, int, int], ...], desired: int
) -> None:
    spec = make_spec(util=70, up=(0, 4, 15), down=(0, 2, 15))
    history = History(scale_events=tuple(ScaleEventRecord(*e) for e in events))
    decision = decide_replicas(spec, counts(current), Signals(gpu_utilization=util), history, NOW)
    assert decision.desired == desired
    assert decision.limited_by == Reason.STEP_LIMIT


@pytest.mark.parametrize(
    ("current", "util", "minimum", "maximum", "desired", "limit"),
    [
        (8, 350.0, 1, 16, 16, Reason.AT_MAX),
        (8, 5.0, 3, 16, 3, Reason.AT_MIN),
        (20, 70.0, 1, 16, 16, Reason.AT_MAX),  # above max: brought back
        (2, 70.0, 3, 16, 3, Reason.AT_MIN),
    ],
)
def test_min_and_max(
    current: int, util: float, minimum: int, maximum: int, desired: int, limit: Reason
) -> None:
    spec = make_spec(util=70, minimum=minimum, maximum=maximum)
    decision = decide_replicas(spec, counts(current), Signals(gpu_utilization=util), History(), NOW)
    assert (decision.desired, decision.limited_by) == (desired, limit)


# --- starting replicas count as capacity --------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "ready", "starting", "util", "queue", "desired", "reason"),
    [
        # 4 ready at 100 % want 6; 2 are starting: already asked for
        (6, 4, 2, 100.0, 0.0, 6, Reason.WITHIN_TOLERANCE),
        # the queue built while they load is theirs to drain: no repeated scale-up
        (6, 4, 2, 100.0, 40.0, 6, Reason.WAITING_FOR_STARTING_REPLICAS),
        # utilisation that outgrows ready + starting still scales up
        (6, 4, 2, 140.0, 0.0, 8, Reason.SCALE_UP),
        # never down while a replica starts
        (6, 4, 2, 10.0, 0.0, 6, Reason.WITHIN_TOLERANCE),
        # the first replica starting: no metrics yet, nothing to do
        (1, 0, 1, None, None, 1, Reason.WITHIN_TOLERANCE),
    ],
)
def test_starting_replicas_count_as_capacity(
    current: int,
    ready: int,
    starting: int,
    util: float | None,
    queue: float | None,
    desired: int,
    reason: Reason,
) -> None:
    spec = make_spec(util=70, queue=4)
    decision = decide_replicas(
        spec,
        counts(current, ready, starting),
        Signals(gpu_utilization=util, queue_total=queue),
        History(),
        NOW,
    )
    assert (decision.desired, decision.reason) == (desired, reason)


@pytest.mark.parametrize(
    ("ready", "unobserved", "util", "queue", "desired", "reason"),
    [
        # 4 of 8 became ready after the sample: 4 x 100 % / 70 % = 6 <= 8, no scale-up
        (8, 4, 100.0, 0.0, 8, Reason.WITHIN_TOLERANCE),
        # the queue the metrics show predates them: theirs to drain
        (8, 4, 100.0, 40.0, 8, Reason.WAITING_FOR_STARTING_REPLICAS),
        # load that outgrows them still scales up: 4 x 280 / 70 = 16
        (8, 4, 280.0, 0.0, 16, Reason.SCALE_UP),
        # never down before the metrics have seen them
        (8, 4, 35.0, 0.0, 8, Reason.WITHIN_TOLERANCE),
        # all observed: the plain formula, 8 x 100 / 70 = 12 (queue 40 asks 10)
        (8, 0, 100.0, 40.0, 12, Reason.SCALE_UP),
    ],
)
def test_replicas_the_metrics_have_not_seen_count_as_arriving(
    ready: int, unobserved: int, util: float, queue: float, desired: int, reason: Reason
) -> None:
    spec = make_spec(util=70, queue=4)
    decision = decide_replicas(
        spec,
        counts(ready, ready, 0, unobserved),
        Signals(gpu_utilization=util, queue_total=queue),
        History(),
        NOW,
    )
    assert (decision.desired, decision.reason) == (desired, reason)


@pytest.mark.parametrize(
    ("util", "desired", "reason"),
    [
        (35.0, 8, Reason.WITHIN_TOLERANCE),  # 8 x 35 / 70 = 4: not on a failed scrape's sample
        (140.0, 16, Reason.SCALE_UP),  # 8 x 140 / 70 = 16: up, on the samples there are
    ],
)
def test_replicas_whose_scrape_failed_are_never_scaled_down_on_their_last_samples(
    util: float, desired: int, reason: Reason
) -> None:
    decision = decide_replicas(
        make_spec(util=70, queue=4, maximum=16),
        ReplicaCounts(current=8, ready=8, starting=0, unscraped=1),
        Signals(gpu_utilization=util, queue_total=0.0),
        History(),
        NOW,
    )
    assert (decision.desired, decision.reason) == (desired, reason)


def test_a_replica_whose_scrape_failed_is_not_scaled_to_zero_on_its_last_samples() -> None:
    spec = make_spec(util=70, queue=4, minimum=0, zero=True, idle_seconds=600)
    history = History(last_active_time=NOW - 900)
    unscraped = ReplicaCounts(current=1, ready=1, starting=0, unscraped=1)
    decision = decide_replicas(spec, unscraped, IDLE, history, NOW)
    assert decision.desired == 1 and decision.idle, "idle still, so its idle time goes on"
    scraped = decide_replicas(spec, counts(1), IDLE, history, NOW)
    assert (scraped.desired, scraped.reason) == (0, Reason.SCALE_TO_ZERO)


# --- scale to zero and wake ---------------------------------------------------------------------

IDLE = Signals(gpu_utilization=1.0, queue_total=0.0, wake_demand=0.0)


@pytest.mark.parametrize(
    ("current", "starting", "signals", "active_ago", "desired", "reason"),
    [
        (2, 0, IDLE, 600, 0, Reason.SCALE_TO_ZERO),
        (2, 0, IDLE, 900, 0, Reason.SCALE_TO_ZERO),
        (2, 0, IDLE, 599, 1, Reason.SCALE_DOWN),  # idle, but not for long enough
        (1, 0, IDLE, 599, 1, Reason.WITHIN_TOLERANCE),
        # unknown is never idle
        (2, 0, Signals(gpu_utilization=None, queue_total=0.0, wake_demand=0.0), 900, 2, None),
        (2, 0, Signals(gpu_utilization=1.0, queue_total=None, wake_demand=0.0), 900, 2, None),
        (2, 0, Signals(gpu_utilization=1.0, queue_total=0.0, wake_demand=None), 900, 2, None),
        # a replica starting is not idle
        (2, 1, IDLE, 900, 2, None),
        # demand waiting outside, or a queue, or work: not idle
        (2, 0, Signals(gpu_utilization=1.0, queue_total=0.0, wake_demand=3.0), 900, 1, None),
        (2, 0, Signals(gpu_utilization=1.0, queue_total=2.0, wake_demand=0.0), 900, 1, None),
        (2, 0, Signals(gpu_utilization=6.0, queue_total=0.0, wake_demand=0.0), 900, 1, None),
    ],
)
def test_scale_to_zero(
    current: int,
    starting: int,
    signals: Signals,
    active_ago: float,
    desired: int,
    reason: Reason | None,
) -> None:
    spec = make_spec(util=70, queue=4, minimum=0, zero=True, idle_seconds=600)
    history = History(last_active_time=NOW - active_ago)
    decision = decide_replicas(spec, counts(current, starting=starting), signals, history, NOW)
    assert decision.desired == desired
    if reason is not None:
        assert decision.reason == reason
    else:
        assert decision.reason != Reason.SCALE_TO_ZERO


def test_idleness_is_measured_from_the_last_activity() -> None:
    spec = make_spec(util=70, queue=4, minimum=0, zero=True, idle_seconds=600)
    busy = Signals(gpu_utilization=60.0, queue_total=0.0, wake_demand=0.0)
    history = decide_replicas(spec, counts(1), busy, History(), NOW).history
    assert history.last_active_time == NOW
    for t in (NOW + 300, NOW + 599):
        decision = decide_replicas(spec, counts(1), IDLE, history, t)
        assert decision.desired == 1
        history = decision.history
    assert decide_replicas(spec, counts(1), IDLE, history, NOW + 600).desired == 0


@pytest.mark.parametrize(
    ("wake", "threshold", "queue_target", "maximum", "desired", "reason"),
    [
        (10.0, 0, 4, 100, 3, Reason.WAKE),
        (1.0, 0, 4, 100, 1, Reason.WAKE),
        (0.5, 0, 4, 100, 1, Reason.WAKE),
        (0.0, 0, 4, 100, 0, Reason.STAYING_AT_ZERO),
        (None, 0, 4, 100, 0, Reason.STAYING_AT_ZERO),
        (5.0, 5, 4, 100, 0, Reason.STAYING_AT_ZERO),  # strictly above the threshold
        (6.0, 5, 4, 100, 2, Reason.WAKE),
        (40.0, 0, None, 100, 1, Reason.WAKE),  # no queue target: one replica
        (400.0, 0, 4, 5, 5, Reason.WAKE),
        (400.0, 0, 4, 100, 100, Reason.WAKE),
    ],
)
def test_wake_from_zero(
    wake: float | None,
    threshold: float,
    queue_target: float | None,
    maximum: int,
    desired: int,
    reason: Reason,
) -> None:
    spec = make_spec(
        util=70,
        queue=queue_target,
        minimum=0,
        maximum=maximum,
        zero=True,
        wake_threshold=threshold,
    )
    decision = decide_replicas(spec, counts(0), Signals(wake_demand=wake), History(), NOW)
    assert (decision.desired, decision.reason) == (desired, reason)


def test_zero_without_scale_to_zero_is_left_alone() -> None:
    decision = decide_replicas(
        make_spec(util=70), counts(0), Signals(wake_demand=50.0), History(), NOW
    )
    assert (decision.desired, decision.reason) == (0, Reason.STAYING_AT_ZERO)


# --- history survives a restart -----------------------------------------------------------------


def _persisted(history: History) -> History:
    """Through the status and back, as a restarted operator reads it."""
    status = history_json(history)
    status["conditions"] = [{"type": "ScaledToZero", "reason": "Idle"}]
    return history_from_status(json.loads(json.dumps(status)))


def test_a_steady_recommendation_changes_no_persisted_field() -> None:
    spec = make_spec(util=70, down=(120, 100, 15))
    history = History()
    written = []
    for i in range(20):
        decision = decide_replicas(
            spec, counts(4), Signals(gpu_utilization=70.0), history, NOW + 15 * i
        )
        history = decision.history
        written.append(history_json(replace(history, last_active_time=None)))
    assert all(w == written[0] for w in written)


def test_a_restart_loses_nothing_and_never_scales_down_sooner() -> None:
    spec = make_spec(util=70, queue=4, minimum=0, zero=True, up=(0, 4, 15), down=(120, 2, 15))
    loads = [300.0, 300.0, *[20.0] * 10, 1.0]
    history = History()
    current = 2
    trajectory = []
    for i, util in enumerate(loads):
        now = NOW + 15 * i
        signals = Signals(gpu_utilization=util, queue_total=0.0, wake_demand=0.0)
        kept = decide_replicas(spec, counts(current), signals, history, now)
        trajectory.append(kept.desired)
        restarted = decide_replicas(spec, counts(current), signals, _persisted(history), now)
        # a restart holds what the target has for one down window, and changes nothing else
        assert restarted.desired == max(kept.desired, current)
        history = kept.history
        if kept.desired != current:
            history = history.with_scale_event(now, current, kept.desired)
            current = kept.desired
        back = _persisted(history)
        assert (back.recommendations, back.scale_events) == (
            history.recommendations,
            history.scale_events,
        )
    # +4 per period; 10 held for 120 s after the last reading that asked for it (t=15);
    # then -2 per period, and at t=180 the window's highest reading (3) holds
    assert trajectory == [6, 10, *[10] * 7, 8, 6, 4, 3]


# --- properties ---------------------------------------------------------------------------------

rules = st.tuples(st.integers(0, 600), st.integers(1, 8), st.integers(1, 120))
maybe_util = st.one_of(st.none(), st.floats(0, 100))
maybe_queue = st.one_of(st.none(), st.floats(0, 500))


@st.composite
def situations(draw: st.DrawFn) -> tuple[WorkloadSizingSpec, ReplicaCounts, Signals, History]:
    zero = draw(st.booleans())
    minimum = draw(st.integers(0 if zero else 1, 5))
    maximum = draw(st.integers(max(minimum, 1), 30))
    spec = make_spec(
        util=draw(st.sampled_from([None, 50.0, 70.0, 90.0])) or 70.0,
        queue=draw(st.sampled_from([None, 1.0, 4.0])),
        minimum=minimum,
        maximum=maximum,
        tolerance=draw(st.sampled_from([0.0, 0.1, 0.3])),
        up=draw(rules),
        down=draw(rules),
        zero=zero,
        idle_seconds=draw(st.integers(0, 900)),
    )
    current = draw(st.integers(0 if zero and minimum == 0 else 1, maximum))
    starting = draw(st.integers(0, current))
    unobserved = draw(st.integers(0, current - starting))
    recs = draw(st.lists(st.tuples(st.floats(NOW - 700, NOW - 1), st.integers(0, 40)), max_size=8))
    events = draw(
        st.lists(
            st.tuples(st.floats(NOW - 200, NOW - 1), st.integers(0, 40), st.integers(0, 40)),
            max_size=4,
        )
    )
    recommendations = tuple(sorted(recs))
    last_reading = recommendations[-1][0] if recommendations else NOW - 1
    history = History(
        recommendations=recommendations,
        scale_events=tuple(ScaleEventRecord(*e) for e in sorted(events)),
        last_active_time=draw(st.one_of(st.none(), st.floats(NOW - 2000, NOW))),
        decided_at=draw(st.one_of(st.none(), st.floats(last_reading, NOW - 1))),
    )
    signals = Signals(
        gpu_utilization=draw(maybe_util),
        queue_total=draw(maybe_queue),
        wake_demand=draw(st.one_of(st.none(), st.floats(0, 50))),
    )
    return spec, counts(current, starting=starting, unobserved=unobserved), signals, history


@settings(max_examples=400)
@given(situations())
def test_never_outside_bounds(
    situation: tuple[WorkloadSizingSpec, ReplicaCounts, Signals, History],
) -> None:
    spec, replica_counts, signals, history = situation
    desired = decide_replicas(spec, replica_counts, signals, history, NOW).desired
    rules = spec.replicas
    zero_allowed = spec.scale_to_zero.enabled and rules.minimum == 0
    if desired == 0:
        assert zero_allowed
    else:
        assert (1 if zero_allowed else rules.minimum) <= desired <= rules.maximum


@settings(max_examples=400)
@given(situations())
def test_never_down_on_unknown_metrics(
    situation: tuple[WorkloadSizingSpec, ReplicaCounts, Signals, History],
) -> None:
    spec, replica_counts, signals, history = situation
    decision = decide_replicas(spec, replica_counts, signals, history, NOW)
    if not decision.metrics_known and replica_counts.current > 0:
        assert decision.desired >= replica_counts.current
        assert decision.reason != Reason.SCALE_TO_ZERO


@settings(max_examples=400)
@given(situations())
def test_never_more_than_the_step_limit(
    situation: tuple[WorkloadSizingSpec, ReplicaCounts, Signals, History],
) -> None:
    spec, replica_counts, signals, history = situation
    decision = decide_replicas(spec, replica_counts, signals, history, NOW)
    current = replica_counts.current
    if current == 0 or decision.desired == 0:
        return  # waking and scale to zero are not steps
    up, down = spec.replicas.scale_up, spec.replicas.scale_down
    added = sum(
        e.to_replicas - e.from_replicas
        for e in history.scale_events
        if e.to_replicas > e.from_replicas and e.time > NOW - up.period_seconds
    )
    removed = sum(
        e.from_replicas - e.to_replicas
        for e in history.scale_events
        if e.to_replicas < e.from_replicas and e.time > NOW - down.period_seconds
    )
    if decision.desired > current and decision.limited_by != Reason.AT_MIN:
        assert decision.desired - current <= max(0, up.max_replicas_per_step - added)
    if decision.desired < current and current <= spec.replicas.maximum:
        assert decision.limited_by == Reason.AT_MIN or current - decision.desired <= max(
            0, down.max_replicas_per_step - removed
        )


def _seen_by_window(history: History, window: float) -> list[int]:
    """The recommendations of the history passed in that a window ending now still sees: the
    finished runs stamped inside it, and the running one, which held until the previous
    decision (until now when this process made none, as after a restart)."""
    if window <= 0 or not history.recommendations:
        return []
    finished, (_, running) = history.recommendations[:-1], history.recommendations[-1]
    seen = [n for t, n in finished if t > NOW - window]
    held_until = NOW if history.decided_at is None else history.decided_at
    if held_until > NOW - window:
        seen.append(running)
    return seen


@st.composite
def moving(draw: st.DrawFn) -> tuple[WorkloadSizingSpec, ReplicaCounts, Signals, History]:
    """Situations where only the windows stand between the reading and the change: known
    utilisation, nothing starting, this process's own recent history, steps that do not bind.
    Most of `situations()` hold for other reasons, and would leave the windows untested."""
    window = st.integers(1, 600)
    spec = make_spec(
        util=70.0,
        minimum=1,
        maximum=40,
        tolerance=0.0,
        up=(draw(window), 40, 15),
        down=(draw(window), 40, 15),
    )
    current = draw(st.integers(1, 20))
    times = draw(st.lists(st.floats(NOW - 700, NOW - 2), min_size=1, max_size=8, unique=True))
    recommendations = tuple((t, draw(st.integers(1, 40))) for t in sorted(times))
    history = History(
        recommendations=recommendations,
        decided_at=draw(st.floats(recommendations[-1][0], NOW - 1)),
    )
    signals = Signals(gpu_utilization=draw(st.floats(0, 100)))
    return spec, counts(current), signals, history


@settings(max_examples=400)
@given(st.one_of(situations(), moving()))
def test_stabilisation_respected(
    situation: tuple[WorkloadSizingSpec, ReplicaCounts, Signals, History],
) -> None:
    """HPA's windows, against the history passed in (not the one the decision returns): no
    scale-down below a recommendation the down window still sees, no scale-up above one the
    up window sees."""
    spec, replica_counts, signals, history = situation
    decision = decide_replicas(spec, replica_counts, signals, history, NOW)
    current = replica_counts.current
    bounded = decision.limited_by in (Reason.AT_MIN, Reason.AT_MAX)
    if current == 0 or decision.desired == 0 or bounded:
        return  # the bounds are hard and come after stabilisation
    rules = spec.replicas
    if decision.desired < current:
        seen = _seen_by_window(history, rules.scale_down.stabilization_window_seconds)
        assert all(n <= decision.desired for n in seen), (seen, decision)
    if decision.desired > current:
        seen = _seen_by_window(history, rules.scale_up.stabilization_window_seconds)
        assert all(n >= decision.desired for n in seen), (seen, decision)


@pytest.mark.parametrize(
    ("history", "desired_at", "label"),
    [
        (History(), {0: 4, 119: 4, 121: 1}, "a new object: the present counts, the window holds"),
        (History(recommendations=((-500.0, 4),)), {0: 4, 119: 4, 121: 1}, "restart, old history"),
        (History(recommendations=((-10.0, 1),)), {0: 4, 119: 4, 121: 1}, "restart, low history"),
        (
            History(recommendations=((-10.0, 1),), decided_at=-10.0),
            {0: 1},
            "same process: its recent history is used as it is",
        ),
    ],
)
def test_a_first_decision_holds_the_target_for_one_down_window(
    history: History, desired_at: dict[int, int], label: str
) -> None:
    spec = make_spec(down=(120, 100, 15))
    low = Signals(gpu_utilization=5.0, queue_total=0.0)
    current = 4
    for t in sorted(desired_at):
        decision = decide_replicas(spec, counts(current), low, history, float(t))
        assert decision.desired == desired_at[t], f"{label} at t={t}"
        history = decision.history


@settings(max_examples=400)
@given(st.one_of(situations(), moving()), st.floats(min_value=0.5, max_value=86_400))
def test_a_steady_decision_is_the_same_later_on_the_same_readings(
    situation: tuple[WorkloadSizingSpec, ReplicaCounts, Signals, History], later: float
) -> None:
    """What lets a steady workload's turns wait (fleet.py): on the same spec, replicas and
    readings, with the history it left, the decision is the same at any later time, and
    steady again."""
    spec, replica_counts, signals, history = situation
    decision = decide_replicas(spec, replica_counts, signals, history, NOW)
    if not decision.steady:
        return
    again = decide_replicas(spec, replica_counts, signals, decision.history, NOW + later)
    assert (again.desired, again.reason, again.steady) == (decision.desired, decision.reason, True)
    assert decision.desired == replica_counts.current


@pytest.mark.parametrize(
    ("spec", "replica_counts", "util", "steady"),
    [
        (make_spec(), counts(2), 70.0, True),
        (make_spec(maximum=2), counts(2), 200.0, True),
        (make_spec(minimum=2), counts(2), 10.0, True),
        (make_spec(), counts(2), 90.0, False),
        (make_spec(down=(300, 100, 15)), counts(2), 10.0, False),
        (make_spec(), counts(2, starting=1), 70.0, False),
        (make_spec(), counts(2, unobserved=1), 70.0, False),
        (make_spec(), counts(2), None, False),
        (make_spec(zero=True, minimum=0), counts(2), 70.0, False),
    ],
    ids=[
        "where the readings put it",
        "at its max",
        "at its min",
        "a scale up",
        "held by the down window",
        "a replica starting",
        "a replica not seen yet",
        "unknown metrics",
        "an idle clock that may run",
    ],
)
def test_steady_only_where_the_readings_put_the_replicas(
    spec: WorkloadSizingSpec, replica_counts: ReplicaCounts, util: float | None, steady: bool
) -> None:
    signals = Signals(gpu_utilization=util, wake_demand=0.0)
    decision = decide_replicas(spec, replica_counts, signals, History(), NOW)
    assert decision.steady == steady, decision
