"""The recurring-shortfall hold: capacity that came back within a down window of being released,
twice in the last hour, is kept for the down window plus the longest such gap
(policy/replicas.py)."""

from __future__ import annotations

import pytest
from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.policy.replicas import (
    History,
    ReplicaCounts,
    ScaleEventRecord,
    Signals,
    decide_replicas,
)
from gpusizer.vocabulary import Reason
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_policy_replicas import NOW, counts, make_spec

WINDOW = 180  # the down window of these tests
HOUR = 3600.0  # the look-back, as documented
QUIET = Signals(gpu_utilization=7.0)  # utilisation asks for 1 replica (target 70)
# the reading before this one, by the same process: what the signals asked for then
QUIET_READING = ((NOW - 15, 1),)

# Two bursts: each time the fleet went 10 -> 6 -> 2 and the queue brought it back to 10
# (more than ceil(2 x 100 / 70) = 3, which is all a fully busy fleet of 2 would ask for).
# The longest gap from the start of a descent to the rise that ended it is 150 s.
TWO_SHORTFALLS = (
    (NOW - 1500, 10, 6),
    (NOW - 1485, 6, 2),
    (NOW - 1400, 2, 10),  # 100 s after the descent began
    (NOW - 1000, 10, 6),
    (NOW - 985, 6, 2),
    (NOW - 850, 2, 9),  # 150 s
    (NOW - 100, 9, 10),  # the last change: held until NOW - 100 + 120 + 150
)
HELD_UNTIL = NOW - 100 + WINDOW + 150
# the same, but the second burst came back 200 s after its descent began: later than a window
LATE_SECOND = (*TWO_SHORTFALLS[:5], (NOW - 800, 2, 9), TWO_SHORTFALLS[6])


def decide(
    events: tuple[tuple[float, int, int], ...],
    *,
    current: int = 10,
    now: float = NOW,
    spec: WorkloadSizingSpec | None = None,
    signals: Signals = QUIET,
) -> tuple[int, Reason]:
    spec = spec or make_spec(util=70, down=(WINDOW, 100, 15))
    # decided a cycle ago by this process: no restart hold
    history = History(
        scale_events=tuple(ScaleEventRecord(*e) for e in events),
        decided_at=now - 15,
        recommendations=QUIET_READING,
    )
    decision = decide_replicas(spec, counts(current), signals, history, now)
    return decision.desired, decision.limited_by


@pytest.mark.parametrize(
    ("events", "current", "now", "desired", "limit"),
    [
        # held at the highest level the shortfalls reached (10) ...
        (TWO_SHORTFALLS, 10, NOW, 10, Reason.RECURRING_SHORTFALL),
        # ... until the window plus the longest gap (120 + 150 s) after the last change
        (TWO_SHORTFALLS, 10, HELD_UNTIL - 1, 10, Reason.RECURRING_SHORTFALL),
        (TWO_SHORTFALLS, 10, HELD_UNTIL, 1, Reason.NOT_LIMITED),
        # above the level: down to the level, not below
        (TWO_SHORTFALLS, 14, NOW, 10, Reason.RECURRING_SHORTFALL),
        # below the level: kept, never raised by the hold
        (TWO_SHORTFALLS, 6, NOW, 6, Reason.RECURRING_SHORTFALL),
        # one shortfall is not a pattern
        (TWO_SHORTFALLS[3:], 10, NOW, 1, Reason.NOT_LIMITED),
        # capacity needed again only after more than a window was cheaper to start again
        (LATE_SECOND, 10, NOW, 1, Reason.NOT_LIMITED),
        # evidence older than the look-back is forgotten, however recent the last change
        (
            (
                *((t - HOUR + 99, a, b) for t, a, b in TWO_SHORTFALLS),
                (NOW - 50, 10, 9),
            ),
            9,
            NOW,
            1,
            Reason.NOT_LIMITED,
        ),
        # rises a fully busy fleet's utilisation asks for (ceil(6 / 0.7) = 9) are headroom,
        # not shortfalls
        (
            ((NOW - 900, 8, 6), (NOW - 800, 6, 9), (NOW - 200, 9, 6), (NOW - 100, 6, 9)),
            9,
            NOW,
            1,
            Reason.NOT_LIMITED,
        ),
        # a rise not preceded by a scale-down is growth, not a regret
        (((NOW - 900, 2, 10), (NOW - 100, 10, 18)), 18, NOW, 2, Reason.NOT_LIMITED),
        # waking from zero is scale to zero's business
        (
            ((NOW - 900, 1, 0), (NOW - 800, 0, 4), (NOW - 200, 4, 0), (NOW - 100, 0, 4)),
            4,
            NOW,
            1,
            Reason.NOT_LIMITED,
        ),
    ],
)
def test_recurring_shortfall_hold(
    events: tuple[tuple[float, int, int], ...],
    current: int,
    now: float,
    desired: int,
    limit: Reason,
) -> None:
    assert decide(events, current=current, now=now) == (desired, limit)


def test_the_gap_is_the_longest_a_bought_back_replica_was_away() -> None:
    # 10 -> 6 released the replicas 7-10, which came back 100 s and 150 s later; 6 -> 2
    # released 3-6, back 85 s and 135 s later: the gaps are the longer ones
    assert decide(TWO_SHORTFALLS, now=HELD_UNTIL - 1)[0] == 10
    assert decide(TWO_SHORTFALLS, now=HELD_UNTIL)[0] == 1
    assert decide(TWO_SHORTFALLS, now=NOW - 100 + WINDOW + 135)[0] == 10


# Two bursts after long descents: each began more than a window (180 s) before the queue
# brought the fleet back (200 s and 250 s), but the replicas released last (6 -> 2) were
# bought back within one (50 s and 60 s): those are shortfalls, and the gap is the longest
# a replica bought back within a window was away, 60 s (10 -> 6's replicas are not regrets).
LONG_DESCENTS = (
    (NOW - 1500, 10, 6),
    (NOW - 1350, 6, 2),
    (NOW - 1300, 2, 10),  # 200 s after 10 -> 6, 50 s after 6 -> 2
    (NOW - 1000, 10, 6),
    (NOW - 810, 6, 2),
    (NOW - 750, 2, 10),  # 250 s after 10 -> 6, 60 s after 6 -> 2
    (NOW - 100, 10, 11),  # the last change: held until NOW - 100 + 180 + 60
)


def test_replicas_released_last_and_bought_back_within_a_window_are_a_shortfall() -> None:
    held_until = NOW - 100 + WINDOW + 60
    assert decide(LONG_DESCENTS, current=11) == (10, Reason.RECURRING_SHORTFALL)
    assert decide(LONG_DESCENTS, current=11, now=held_until - 1) == (
        10,
        Reason.RECURRING_SHORTFALL,
    )
    # utilisation 7 % of 11 replicas asks for 2
    assert decide(LONG_DESCENTS, current=11, now=held_until) == (2, Reason.NOT_LIMITED)


def test_the_signals_still_win_over_the_hold() -> None:
    # utilisation asks for 12: the hold only ever keeps replicas, it does not cap a rise
    busy = Signals(gpu_utilization=84.0)
    assert decide(TWO_SHORTFALLS, signals=busy) == (12, Reason.NOT_LIMITED)


def test_with_a_queue_target_only_any_rise_after_a_descent_is_a_shortfall() -> None:
    spec = make_spec(util=None, queue=4, down=(WINDOW, 100, 15))
    events = ((NOW - 900, 8, 6), (NOW - 800, 6, 7), (NOW - 200, 7, 6), (NOW - 100, 6, 7))
    quiet = Signals(queue_total=0.0)
    assert decide(events, current=7, spec=spec, signals=quiet) == (7, Reason.RECURRING_SHORTFALL)


def test_scale_events_are_kept_for_the_look_back() -> None:
    spec = make_spec(util=70, down=(WINDOW, 100, 15))
    kept = ScaleEventRecord(NOW - HOUR + 1, 2, 3)
    dropped = ScaleEventRecord(NOW - HOUR, 1, 2)
    history = History(
        scale_events=(dropped, kept), decided_at=NOW - 15, recommendations=QUIET_READING
    )
    decision = decide_replicas(spec, counts(3), Signals(gpu_utilization=70.0), history, NOW)
    assert decision.history.scale_events == (kept,)


def test_capacity_is_let_go_one_step_per_gap() -> None:
    """The operator's loop through a quiet spell after recurring bursts: each scale-down step is
    a change, so the next one waits the window plus the gap again, until the fleet is back to
    what the signals ask for or the shortfalls are an hour old."""
    spec = make_spec(util=70, down=(WINDOW, 2, 15))
    history = History(
        scale_events=tuple(ScaleEventRecord(*e) for e in TWO_SHORTFALLS),
        decided_at=NOW - 15,
        recommendations=QUIET_READING,
    )
    current = 10
    steps = []
    for i in range(120):
        now = NOW + 15 * i
        decision = decide_replicas(spec, counts(current), QUIET, history, now)
        history = decision.history
        if decision.desired != current:
            history = history.with_scale_event(now, current, decision.desired)
            steps.append((now - NOW, current, decision.desired))
            current = decision.desired
    gap = WINDOW + 150
    assert steps[:3] == [
        (HELD_UNTIL - NOW + 10, 10, 8),  # the first decision tick at or after HELD_UNTIL
        (HELD_UNTIL - NOW + 10 + gap, 8, 6),
        (HELD_UNTIL - NOW + 10 + 2 * gap, 6, 4),
    ]


# --- properties ---------------------------------------------------------------------------------

event_lists = st.lists(
    st.tuples(
        st.floats(NOW - 2 * HOUR, NOW - 1),
        st.integers(0, 30),
        st.integers(0, 30),
    ),
    max_size=12,
)


@settings(max_examples=400)
@given(
    event_lists,
    st.integers(1, 30),
    st.floats(0, 150),
    st.sampled_from([None, 50.0, 70.0, 90.0]),
    st.integers(0, 600),
)
def test_the_hold_only_keeps_replicas_and_needs_two_shortfalls(
    events: list[tuple[float, int, int]],
    current: int,
    util: float,
    target: float | None,
    window: int,
) -> None:
    spec = make_spec(util=target or 70.0, queue=4 if target is None else None, down=(window, 2, 15))
    history = History(
        scale_events=tuple(ScaleEventRecord(*e) for e in sorted(events)),
        decided_at=NOW - 15,
        recommendations=QUIET_READING,
    )
    signals = Signals(gpu_utilization=util, queue_total=0.0)
    decision = decide_replicas(spec, ReplicaCounts(current, current, 0), signals, history, NOW)
    if decision.limited_by != Reason.RECURRING_SHORTFALL:
        return
    assert decision.desired <= current
    recent = sorted(e for e in events if e[0] > NOW - HOUR)
    rises = [e for e in recent if e[2] > e[1] > 0]
    assert len(rises) >= 2
    assert decision.desired <= max(to for _, _, to in rises)
    # held for the window plus a gap of at most a window after the last change: holding an idle
    # replica longer than twice what starting one again costs does not pay (ski rental)
    assert recent[-1][0] + 2 * window > NOW
