"""Status: history survives a round trip, conditions keep their transition time, no-op patches."""

from __future__ import annotations

from gpusizer.policy.replicas import History, ScaleEventRecord
from gpusizer.report.status import (
    ConditionState,
    history_from_status,
    history_to_status,
    merge_conditions,
    status_patch,
)
from gpusizer.vocabulary import ConditionType, Reason

T0 = 1_800_000_000.0


def test_history_round_trip_keeps_window_extremes() -> None:
    history = History(
        recommendations=((T0, 4), (T0 + 15, 4), (T0 + 30, 6), (T0 + 45, 6), (T0 + 60, 3)),
        scale_events=(ScaleEventRecord(T0 + 30, 4, 6),),
        last_active_time=T0 + 60,
    )
    status = history_to_status(history)
    assert len(status["recommendations"]) == 3  # runs collapse to their latest entry
    back = history_from_status(status)
    assert back.scale_events == history.scale_events
    assert back.last_active_time == history.last_active_time
    for start in (T0 - 1, T0 + 10, T0 + 40, T0 + 50):
        window = [n for t, n in history.recommendations if t > start]
        kept = [n for t, n in back.recommendations if t > start]
        assert (max(window), min(window)) == (max(kept), min(kept))


def test_history_ignores_garbage_entries() -> None:
    back = history_from_status(
        {
            "recommendations": [{"time": "nope", "replicas": 3}, {"replicas": -1}, "x"],
            "scaleEvents": [{"time": "2027-01-01T00:00:00Z", "fromReplicas": "2", "toReplicas": 3}],
            "lastActiveTime": 12,
        }
    )
    assert back == History()


def test_transition_time_moves_only_on_status_flip() -> None:
    first = merge_conditions(
        None, [ConditionState(ConditionType.READY, True, Reason.ACTING, "a")], T0, 1
    )
    same = merge_conditions(
        first, [ConditionState(ConditionType.READY, True, Reason.ACTING, "b")], T0 + 60, 2
    )
    flip = merge_conditions(
        same, [ConditionState(ConditionType.READY, False, Reason.TARGET_NOT_FOUND, "c")], T0 + 90, 2
    )
    assert same[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]
    assert flip[0]["lastTransitionTime"] != first[0]["lastTransitionTime"]
    assert flip[0]["observedGeneration"] == 2


def test_patch_is_empty_when_only_the_observation_clock_moved() -> None:
    old = {"currentReplicas": 2, "observation": {"gpuUtilization": 50.0, "time": "t1"}}
    new = {"currentReplicas": 2, "observation": {"gpuUtilization": 50.0, "time": "t2"}}
    assert status_patch(old, new) == {}
    changed = {"currentReplicas": 3, "observation": {"gpuUtilization": 61.0, "time": "t2"}}
    assert status_patch(old, changed) == changed
