"""Status rendering: conditions with transition times, the persisted decision history, and the
patch that is sent only when something changed.

Pure: the caller writes the patch (`ports.StatusSink`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpusizer.api.v1alpha1 import (
    Condition,
    LearnedStatus,
    RecommendationSample,
    ScaleEvent,
    WorkloadSizingStatus,
)
from gpusizer.policy.replicas import History, ScaleEventRecord
from gpusizer.policy.warmth import from_status as warmth_from_status
from gpusizer.policy.warmth import to_status as warmth_to_status
from gpusizer.timefmt import iso, parse_time
from gpusizer.vocabulary import ConditionType, Reason


def history_from_status(status: Mapping[str, Any] | None) -> History:
    """The decision history as the last operator (maybe a previous process) left it.

    Entries that do not parse are dropped, never guessed: a lost entry can only make the
    policy more conservative for one window."""
    status = status or {}
    recommendations = []
    for item in status.get("recommendations") or []:
        if not isinstance(item, Mapping):
            continue
        t = parse_time(item.get("time"))
        n = item.get("replicas")
        if t is not None and isinstance(n, int) and n >= 0:
            recommendations.append((t, n))
    events = []
    for item in status.get("scaleEvents") or []:
        if not isinstance(item, Mapping):
            continue
        t = parse_time(item.get("time"))
        a, b = item.get("fromReplicas"), item.get("toReplicas")
        if t is not None and isinstance(a, int) and isinstance(b, int):
            events.append(ScaleEventRecord(t, a, b))
    return History(
        recommendations=tuple(recommendations),
        scale_events=tuple(events),
        last_active_time=parse_time(status.get("lastActiveTime")) if _idle(status) else None,
        warmth=warmth_from_status(status.get("learned"), parse_time),
    )


def _idle(status: Mapping[str, Any]) -> bool:
    """lastActiveTime is exact only while the workload is idle: it is written when idleness
    begins, and while the workload is active it lags (written only with other changes), so an
    active workload counts as active now."""
    return any(
        isinstance(c, Mapping)
        and c.get("type") == ConditionType.SCALED_TO_ZERO.value
        and c.get("reason") == Reason.IDLE.value
        for c in status.get("conditions") or []
    )


def history_fields(history: History, learned: bool) -> dict[str, Any]:
    """The decision history as WorkloadSizingStatus fields, for the next turn (or process);
    with `learned`, what the policy learned of the workload's idle gaps and start-up too (kept
    only for workloads that scale to zero, where it is used)."""
    fields: dict[str, Any] = {}
    if learned:
        fields["learned"] = LearnedStatus.model_validate(warmth_to_status(history.warmth, iso))
    return fields | {
        "recommendations": [
            RecommendationSample(time=iso(t), replicas=n) for t, n in history.recommendations
        ],
        "scale_events": [
            ScaleEvent(time=iso(e.time), from_replicas=e.from_replicas, to_replicas=e.to_replicas)
            for e in history.scale_events
        ],
        "last_active_time": iso(history.last_active_time)
        if history.last_active_time is not None
        else None,
    }


def status_json(status: WorkloadSizingStatus | Condition) -> dict[str, Any]:
    """The fields a turn set, as the API server keeps them: a field set to None is one the
    merge patch deletes, a field not set is one the turn leaves alone."""
    return status.model_dump(by_alias=True, exclude_unset=True, mode="json")


@dataclass(frozen=True)
class ConditionState:
    type: ConditionType
    status: bool | None  # None: Unknown
    reason: Reason
    message: str


def merge_conditions(
    old: Sequence[Mapping[str, Any]] | None,
    new: Sequence[ConditionState],
    now: float,
    generation: int | None,
) -> list[Condition]:
    """lastTransitionTime moves only when a condition's status flips."""
    previous = {c.get("type"): c for c in old or [] if isinstance(c, Mapping)}
    merged = []
    stamp = iso(now)
    for state in new:
        status = "Unknown" if state.status is None else ("True" if state.status else "False")
        before = previous.get(state.type.value)
        transition = stamp
        if before is not None and before.get("status") == status:
            transition = str(before.get("lastTransitionTime") or transition)
        fields: dict[str, Any] = {}
        if generation is not None:
            fields["observed_generation"] = generation
        merged.append(
            Condition(
                type=state.type.value,
                status=status,
                reason=state.reason.value,
                message=state.message[:1024],
                last_transition_time=transition,
                **fields,
            )
        )
    return merged


def flipped(
    old: Sequence[Mapping[str, Any]] | None, type_: ConditionType, status: bool, reason: Reason
) -> bool:
    """Whether a condition is moving into (status, reason): events fire on such moves only."""
    for c in old or []:
        if isinstance(c, Mapping) and c.get("type") == type_.value:
            return c.get("status") != ("True" if status else "False") or c.get("reason") != (
                reason.value
            )
    return True


# efficiency and measuredThroughput move with every read of the right-sizing window
_VOLATILE = frozenset(
    {"observation", "lastActiveTime", "learned", "efficiency", "measuredThroughput"}
)


STATUS_REFRESHES_PER_SECOND = 10.0


@dataclass
class RefreshBudget:
    """Refreshes (readings rewritten while nothing material changed) across all workloads, at
    most `per_second` on average: after an outage of Prometheus every workload's readings are
    due at once, and they go out a few at a time rather than in one burst of writes."""

    per_second: float = STATUS_REFRESHES_PER_SECOND
    tokens: float = STATUS_REFRESHES_PER_SECOND
    at: float | None = None

    def take(self, now: float) -> bool:
        """Whether a refresh may go out at `now` (one is counted if so)."""
        if self.at is not None:
            earned = max(0.0, now - self.at) * self.per_second
            self.tokens = min(self.per_second, self.tokens + earned)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def refresh_seconds(minimum: float, workloads: int) -> float:
    """How old written readings may get before they are refreshed: `minimum`, or longer when
    there are so many workloads that refreshing each that often would flood the API server
    (once a minute is 83 status writes a second at 5,000 workloads)."""
    return max(minimum, workloads / STATUS_REFRESHES_PER_SECOND)


def status_patch(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    now: float,
    refresh_seconds: float,
    may_refresh: Callable[[], bool] = lambda: True,
) -> dict[str, Any]:
    """The fields of `new` that differ from `old`; empty when nothing material changed.

    The observation, lastActiveTime, what was learned of the workload and the wording of a
    condition that keeps its status and reason move with every reading of the metrics
    (`_VOLATILE`); writing them each cycle would cost one
    PATCH per workload per cycle. They go out with any material change, or once the written
    observation is `refresh_seconds` old. A reading a decision reads that becomes known or
    unknown is material: the observation would otherwise say "no utilisation" for up to a
    refresh period after the first samples arrived (a turn that sets no observation leaves the
    written one as it is). GPU memory's is not (`_SHOWN_ONLY_READINGS`).
    `may_refresh` is asked only when a refresh is due, and may refuse."""
    old = old or {}
    changed = {key: value for key, value in new.items() if old.get(key) != value}
    if not changed:
        return {}
    material = (
        "observation" in new
        and _known_readings(old.get("observation")) != _known_readings(new["observation"])
    ) or any(
        key not in _VOLATILE
        and (key != "conditions" or _without_messages(old.get(key)) != _without_messages(value))
        for key, value in changed.items()
    )
    if material or (_observed_before(old, now - refresh_seconds) and may_refresh()):
        return changed
    return {}


# Readings of the observation no decision reads. One query reads each for the whole fleet, so
# when it times out twice in a row, or answers again, the reading goes unknown or known for
# every workload at once: written at once, that was a status PATCH per workload each way, and at
# 10,000 workloads the wave kept the API server too busy for the reads to answer
# (bench/README.md, "Issue 29: a wave of status writes").
_SHOWN_ONLY_READINGS = frozenset({"memoryPeakMiB"})


def _known_readings(observation: Any) -> frozenset[str]:
    """The readings a decision reads that an observation has a value for (a merge patch drops
    the unknown ones)."""
    if not isinstance(observation, Mapping):
        return frozenset()
    return frozenset(
        k
        for k, v in observation.items()
        if k != "time" and k not in _SHOWN_ONLY_READINGS and v is not None
    )


def _without_messages(conditions: Any) -> list[Any]:
    if not isinstance(conditions, Sequence):
        return [conditions]
    return [
        {k: v for k, v in c.items() if k != "message"} if isinstance(c, Mapping) else c
        for c in conditions
    ]


def _observed_before(status: Mapping[str, Any], moment: float) -> bool:
    observation = status.get("observation")
    written = parse_time(observation.get("time")) if isinstance(observation, Mapping) else None
    return written is None or written <= moment


@dataclass
class StatusOverlay:
    """The status this process last wrote, and what it still has to write, over the one its
    watch shows.

    The decision task writes the status itself, and the watch shows the write a moment later: a
    cycle in between must not decide on the history from before the write (a second scale-down
    step inside one window). While this process is in charge it is the status's only writer,
    so what it wrote last is the newest status there is. A write that failed is carried into
    the next one, so a scale whose status did not land still counts. Once the watch shows
    what was written, the copy goes: about 4.5 KB per workload, kept twice over (22 MB at
    5,000 workloads)."""

    written: Mapping[str, Any] | None = None
    unwritten: dict[str, Any] = field(default_factory=dict)

    def current(self, shown: Mapping[str, Any]) -> dict[str, Any]:
        """The status to decide on, given the object's as the watch shows it."""
        if self.written is not None and shown == self.written:
            self.written = None
        merged = {**(shown if self.written is None else self.written), **self.unwritten}
        return {key: value for key, value in merged.items() if value is not None}

    def outgoing(self, patch: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.unwritten, **patch}

    def wrote(self, status: Mapping[str, Any]) -> None:
        self.written, self.unwritten = status, {}

    def failed(self, patch: Mapping[str, Any]) -> None:
        self.unwritten = dict(patch)
