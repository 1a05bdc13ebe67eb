"""Status rendering: conditions with transition times, the persisted decision history, and the
patch that is sent only when something changed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpusizer.policy.replicas import History, ScaleEventRecord
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
        last_active_time=parse_time(status.get("lastActiveTime")),
    )


def _compact_recommendations(recommendations: Sequence[tuple[float, int]]) -> list[dict[str, Any]]:
    """Keep what the stabilisation windows can still use, without one entry per cycle.

    Within a window only the extremes matter, so consecutive equal values collapse to the
    latest, which keeps the window's max and min exact."""
    out: list[dict[str, Any]] = []
    for i, (t, n) in enumerate(recommendations):
        following = recommendations[i + 1][1] if i + 1 < len(recommendations) else None
        if following == n:
            continue
        out.append({"time": iso(t), "replicas": n})
    return out


def history_to_status(history: History) -> dict[str, Any]:
    return {
        "recommendations": _compact_recommendations(history.recommendations),
        "scaleEvents": [
            {"time": iso(e.time), "fromReplicas": e.from_replicas, "toReplicas": e.to_replicas}
            for e in history.scale_events
        ],
        "lastActiveTime": iso(history.last_active_time)
        if history.last_active_time is not None
        else None,
    }


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
) -> list[dict[str, Any]]:
    """lastTransitionTime moves only when a condition's status flips."""
    previous = {c.get("type"): c for c in old or [] if isinstance(c, Mapping)}
    merged = []
    for state in new:
        status = "Unknown" if state.status is None else ("True" if state.status else "False")
        before = previous.get(state.type.value)
        transition = iso(now)
        if before is not None and before.get("status") == status:
            transition = str(before.get("lastTransitionTime") or transition)
        entry: dict[str, Any] = {
            "type": state.type.value,
            "status": status,
            "reason": state.reason.value,
            "message": state.message[:1024],
            "lastTransitionTime": transition,
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        merged.append(entry)
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


_VOLATILE = {"observation"}


def status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `new` that differ from `old`; empty when nothing changed.

    The observation's time and sample age change every cycle; they are written only together
    with a change of the observed values, so a steady workload costs no writes."""
    old = old or {}
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if key in _VOLATILE and isinstance(value, Mapping) and isinstance(before, Mapping):
            steady = {k: v for k, v in value.items() if k not in ("time", "sampleAgeSeconds")}
            previous = {k: v for k, v in before.items() if k not in ("time", "sampleAgeSeconds")}
            if steady == previous:
                continue
        if before != value:
            patch[key] = value
    return patch
