"""Status: history survives a round trip, conditions keep their transition time, no-op patches."""

from __future__ import annotations

from typing import Any

import pytest
from gpusizer.api.v1alpha1 import WorkloadSizingStatus
from gpusizer.policy.replicas import History, ScaleEventRecord
from gpusizer.report.status import (
    ConditionState,
    StatusOverlay,
    history_fields,
    history_from_status,
    merge_conditions,
    refresh_seconds,
    status_json,
    status_patch,
)
from gpusizer.timefmt import iso
from gpusizer.vocabulary import ConditionType, Reason

T0 = 1_800_000_000.0


IDLE_CONDITION = {"type": "ScaledToZero", "status": "False", "reason": "Idle"}
ACTIVE_CONDITION = {"type": "ScaledToZero", "status": "False", "reason": "Active"}


def history_json(history: History) -> dict[str, Any]:
    """The history's status fields as the API server keeps them."""
    return status_json(WorkloadSizingStatus(**history_fields(history, learned=True)))


def test_history_round_trip() -> None:
    history = History(
        recommendations=((T0 + 15, 4), (T0 + 45, 6), (T0 + 60, 3)),
        scale_events=(ScaleEventRecord(T0 + 30, 4, 6),),
        last_active_time=T0 + 60,
        decided_at=T0 + 75,
    )
    status = {**history_json(history), "conditions": [IDLE_CONDITION]}
    back = history_from_status(status)
    # what this process knows of its own last decision is not persisted
    assert back == History(
        recommendations=history.recommendations,
        scale_events=history.scale_events,
        last_active_time=history.last_active_time,
    )


def test_last_active_time_counts_only_while_idle() -> None:
    """While active it is written only with other changes, so it lags: a restarted operator
    must not read an old value as the start of an idle spell."""
    status = {"lastActiveTime": "2027-01-01T00:00:00Z"}
    assert (
        history_from_status({**status, "conditions": [ACTIVE_CONDITION]}).last_active_time is None
    )
    assert history_from_status(status).last_active_time is None
    idle = history_from_status({**status, "conditions": [IDLE_CONDITION]})
    assert idle.last_active_time is not None


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
        [status_json(c) for c in first],
        [ConditionState(ConditionType.READY, True, Reason.ACTING, "b")],
        T0 + 60,
        2,
    )
    flip = merge_conditions(
        [status_json(c) for c in same],
        [ConditionState(ConditionType.READY, False, Reason.TARGET_NOT_FOUND, "c")],
        T0 + 90,
        2,
    )
    assert same[0].last_transition_time == first[0].last_transition_time
    assert flip[0].last_transition_time != first[0].last_transition_time
    assert flip[0].observed_generation == 2


def _status(replicas: int, util: float, at: float, message: str = "m") -> dict[str, Any]:
    return {
        "currentReplicas": replicas,
        "lastActiveTime": iso(at),
        "observation": {"gpuUtilization": util, "time": iso(at)},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Acting", "message": message}],
    }


def test_readings_alone_are_written_once_a_refresh_period() -> None:
    old = _status(2, 50.0, T0)
    for moved in (_status(2, 61.3, T0 + 15), _status(2, 61.3, T0 + 15, message="util 61.3%")):
        assert status_patch(old, moved, T0 + 15, refresh_seconds=60) == {}
    later = _status(2, 61.3, T0 + 60, message="util 61.3%")
    assert status_patch(old, later, T0 + 60, refresh_seconds=60) == {
        k: later[k] for k in ("lastActiveTime", "observation", "conditions")
    }


@pytest.mark.parametrize(
    ("change", "value"),
    [
        ("currentReplicas", 3),
        ("conditions", [{"type": "Ready", "status": "False", "reason": "Acting", "message": "m"}]),
        ("conditions", [{"type": "Ready", "status": "True", "reason": "Paused", "message": "m"}]),
        ("recommendations", [{"time": "2027-01-01T00:00:00Z", "replicas": 3}]),
    ],
)
def test_a_material_change_is_written_at_once_with_the_readings(change: str, value: Any) -> None:
    old = _status(2, 50.0, T0)
    new = {**_status(2, 61.3, T0 + 15), change: value}
    patch = status_patch(old, new, T0 + 15, refresh_seconds=60)
    assert patch[change] == value
    assert patch["observation"] == new["observation"]


def test_a_reading_that_becomes_known_or_unknown_is_written_at_once() -> None:
    """Within the refresh period, and with nothing else material: the first samples of a new
    workload's pods must not wait a minute (or, at 5,000 workloads, 500 s) to show."""
    unknown = {**_status(4, 0.0, T0), "observation": {"time": iso(T0)}}
    known = _status(4, 70.0, T0 + 2)
    lost = {**known, "observation": {"gpuUtilization": None, "time": iso(T0 + 4)}}
    for old, new, now in ((unknown, known, T0 + 2), (known, lost, T0 + 4)):
        patch = status_patch(old, new, now, refresh_seconds=60)
        assert patch.get("observation") == new["observation"]
    still_lost = {**lost, "lastActiveTime": iso(T0 + 6)}
    assert status_patch(lost, still_lost, T0 + 6, refresh_seconds=60) == {}


def test_gpu_memory_that_becomes_known_or_unknown_waits_for_the_refresh() -> None:
    """No decision reads it, and one query reads it for the whole fleet: when that query failed
    twice in a row at 10,000 workloads, every status was rewritten at once, and again when it
    answered."""

    def observed(memory: float | None, at: float) -> dict[str, Any]:
        reading = {"gpuUtilization": 70.0, "memoryPeakMiB": memory, "time": iso(at)}
        return {**_status(4, 70.0, at), "observation": reading}

    known, lost = observed(20000.0, T0), observed(None, T0 + 4)
    unwritten = {**known, "observation": {"gpuUtilization": 70.0, "time": iso(T0)}}
    for old, new in ((known, lost), (unwritten, observed(20000.0, T0 + 4))):
        assert status_patch(old, new, T0 + 4, refresh_seconds=60) == {}
    refreshed = status_patch(known, observed(None, T0 + 60), T0 + 60, refresh_seconds=60)
    assert refreshed["observation"]["memoryPeakMiB"] is None
    moved = {**lost, "currentReplicas": 5}
    assert (
        status_patch(known, moved, T0 + 4, refresh_seconds=60)["observation"]
        == (lost["observation"])
    )


def test_nothing_changed_nothing_written() -> None:
    old = _status(2, 50.0, T0)
    assert status_patch(old, old, T0 + 3600, refresh_seconds=60) == {}
    assert status_patch({}, old, T0, refresh_seconds=60) == old


def test_the_status_this_process_wrote_wins_over_a_watch_that_lags() -> None:
    overlay = StatusOverlay()
    shown = {"currentReplicas": 8, "scaleEvents": []}
    assert overlay.current(shown) == shown  # nothing written yet: the watch's
    written = {"currentReplicas": 7, "scaleEvents": [{"fromReplicas": 8, "toReplicas": 7}]}
    overlay.wrote(written)
    assert overlay.current(shown) == written  # the watch has not shown the write yet
    assert overlay.current(written) == written
    assert overlay.written is None, "the watch shows the write: no copy is kept"
    newer = {**written, "observation": {"time": "t1"}}
    assert overlay.current(newer) == newer


def test_a_status_that_failed_to_write_is_decided_on_and_sent_again() -> None:
    overlay = StatusOverlay()
    overlay.wrote({"currentReplicas": 8, "lastScaleTime": "t0"})
    failed = {"currentReplicas": 7, "lastScaleTime": "t1"}
    overlay.failed(overlay.outgoing(failed))
    assert overlay.current({"currentReplicas": 8}) == {"currentReplicas": 7, "lastScaleTime": "t1"}
    # the next cycle changes only the observation: the scale's fields still go out with it
    assert overlay.outgoing({"observation": {"time": "t2"}}) == {
        **failed,
        "observation": {"time": "t2"},
    }
    overlay.wrote({"currentReplicas": 7, "lastScaleTime": "t1", "observation": {"time": "t2"}})
    assert overlay.outgoing({"desiredReplicas": 6}) == {"desiredReplicas": 6}


def test_a_field_the_patch_removes_is_gone_from_the_status_decided_on() -> None:
    overlay = StatusOverlay()
    overlay.failed({"recommendation": None})
    assert overlay.current({"recommendation": {"gpu": "a100"}, "currentReplicas": 1}) == {
        "currentReplicas": 1
    }


def test_readings_are_refreshed_at_most_ten_times_a_second_across_workloads() -> None:
    assert refresh_seconds(60, 100) == 60  # 1.7 writes a second: the minimum holds
    assert refresh_seconds(60, 600) == 60
    assert refresh_seconds(60, 5000) == 500  # 10 a second rather than 83
