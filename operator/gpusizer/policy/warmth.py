"""How long to stay warm, and when to warm up ahead: learned from the workload itself.

Pure, like the rest of the policy. The replica policy feeds `observe` each decision with whether
the workload was quiet (no demand seen), the request rate and the measured start-up; what comes
back is persisted with the rest of the history, so a restart keeps what was learned.

Two things are learned:

- **Idle gaps** (a quiet spell, from the last demand to the next), in length bins, with the
  requests that arrived within one start-up of each gap's end: those are the requests that meet
  a cold start if the workload went to zero during the gap. For an idle time T, the share of
  requests meeting a cold start is the requests after gaps longer than T over all requests, and
  the GPU time a replica spends is each gap's min(gap, T) plus a start-up for each gap longer
  than T. `learned_idle_seconds` picks the cheapest T (a bin edge) within the user's budget.
  Counts decay with a half-life of a week, so the workload's recent habits weigh most.
- **Onsets**: the times demand came back after a gap longer than a start-up. An onset seen at
  this time of day on most of the last seven days, or at this time of week in each of the last
  two weeks, is expected again: `expected_onset` says so a start-up ahead.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

ToIso = Callable[[float], str]
ParseTime = Callable[[Any], float | None]

DAY = 86400.0
WEEK = 7 * DAY
HALF_LIFE_SECONDS = 7 * DAY
ONSET_HORIZON_SECONDS = 15 * DAY
DEFAULT_STARTUP_SECONDS = 120.0  # assumed until a start-up has been measured
MIN_GAPS_TO_LEARN = 5.0
# Upper edges of the gap-length bins, 30 s to a day, about x1.4 apart; the last bin is open.
GAP_EDGES: tuple[float, ...] = (
    30, 45, 60, 90, 120, 180, 240, 300, 420, 600, 900, 1200, 1800, 2700, 3600,
    5400, 7200, 10800, 14400, 21600, 28800, 43200, 86400,
)  # fmt: skip
_BINS = len(GAP_EDGES) + 1
DAILY_ONSETS_NEEDED = 4  # of the last 7 days
WEEKLY_ONSETS_NEEDED = 2  # of the last 2 weeks
# How early a replica is asked for before an expected onset, beyond its start-up: one decision
# period of the operator and the age of the metrics it reads.
PRE_WARM_MARGIN_SECONDS = 30.0


@dataclass(frozen=True)
class Warmth:
    """Persisted in status.learned (see to_status / from_status)."""

    startup_seconds: float | None = None
    requests: float = 0.0
    gap_counts: tuple[float, ...] = (0.0,) * _BINS
    gap_seconds: tuple[float, ...] = (0.0,) * _BINS
    gap_requests: tuple[float, ...] = (0.0,) * _BINS  # requests in the start-up after the gap
    idle_since: float | None = None
    head_until: float | None = None
    head_bin: int | None = None
    onsets: tuple[float, ...] = ()
    counted_at: float | None = None
    decayed_at: float | None = None  # when the counts were last decayed (at a gap's end)

    @property
    def startup(self) -> float:
        return DEFAULT_STARTUP_SECONDS if self.startup_seconds is None else self.startup_seconds


def observe(
    warmth: Warmth,
    now: float,
    *,
    quiet: bool | None,
    request_rate: float | None,
    startup_seconds: float | None,
) -> Warmth:
    """Fold one decision's reading in. `quiet` None (unknown) leaves the running gap alone."""
    if startup_seconds is not None and startup_seconds > 0:
        warmth = replace(warmth, startup_seconds=startup_seconds)
    if request_rate is not None and warmth.counted_at is not None and now > warmth.counted_at:
        arrived = request_rate * (now - warmth.counted_at)
        warmth = replace(warmth, requests=warmth.requests + arrived)
        if warmth.head_until is not None and warmth.head_bin is not None:
            requests = list(warmth.gap_requests)
            requests[warmth.head_bin] += arrived
            warmth = replace(warmth, gap_requests=tuple(requests))
    if warmth.head_until is not None and now >= warmth.head_until:
        warmth = replace(warmth, head_until=None, head_bin=None)
    warmth = replace(warmth, counted_at=now if request_rate is not None else None)
    if quiet is True and warmth.idle_since is None:
        return replace(warmth, idle_since=now)
    if quiet is False and warmth.idle_since is not None:
        return _gap_ended(warmth, now)
    return warmth


def _gap_ended(warmth: Warmth, now: float) -> Warmth:
    assert warmth.idle_since is not None
    gap = now - warmth.idle_since
    decay = 1.0
    if warmth.decayed_at is not None:
        decay = 0.5 ** (max(0.0, now - warmth.decayed_at) / HALF_LIFE_SECONDS)
    b = bisect_right(GAP_EDGES, gap)
    counts = [c * decay for c in warmth.gap_counts]
    seconds = [s * decay for s in warmth.gap_seconds]
    requests = [r * decay for r in warmth.gap_requests]
    counts[b] += 1.0
    seconds[b] += gap
    onsets = warmth.onsets
    if gap > warmth.startup:
        onsets = (*(t for t in onsets if t > now - ONSET_HORIZON_SECONDS), now)
    return replace(
        warmth,
        requests=warmth.requests * decay,
        gap_counts=tuple(counts),
        gap_seconds=tuple(seconds),
        gap_requests=tuple(requests),
        idle_since=None,
        head_until=now + warmth.startup,
        head_bin=b,
        onsets=onsets,
        decayed_at=now,
    )


@dataclass(frozen=True)
class LearnedIdle:
    seconds: float
    cold_start_percent: float


def learned_idle_seconds(warmth: Warmth, budget_percent: float) -> LearnedIdle | None:
    """The idle time with the least GPU time among those whose estimated share of requests
    meeting a cold start is within the budget; None while too little has been seen."""
    if sum(warmth.gap_counts) < MIN_GAPS_TO_LEARN or warmth.requests <= 0:
        return None
    best: tuple[float, float, float] | None = None  # (cost, seconds, share)
    for j, edge in enumerate((0.0, *GAP_EDGES)):
        # gaps in bins >= j are longer than `edge`: each meets a cold start at idle time edge
        longer = range(j, _BINS)
        share = 100.0 * sum(warmth.gap_requests[b] for b in longer) / warmth.requests
        if share > budget_percent:
            continue
        colds = sum(warmth.gap_counts[b] for b in longer)
        cost = sum(warmth.gap_seconds[:j]) + colds * (edge + warmth.startup)
        if best is None or cost < best[0] - 1e-9:
            best = (cost, edge, share)
    if best is None:
        # nothing within the budget: stay warm through every gap seen
        longest = max(b for b in range(_BINS) if warmth.gap_counts[b] > 0)
        edge = GAP_EDGES[min(longest, len(GAP_EDGES) - 1)]
        return LearnedIdle(seconds=edge, cold_start_percent=0.0)
    return LearnedIdle(seconds=best[1], cold_start_percent=best[2])


def expected_onset(warmth: Warmth, now: float) -> float | None:
    """When demand is expected back within one start-up (plus a margin) from now, because it
    came back at this time of day on most of the last seven days or at this time of week in
    each of the last two weeks; None otherwise."""
    lead = warmth.startup + PRE_WARM_MARGIN_SECONDS
    onsets = warmth.onsets

    def seen(ago: float) -> float | None:
        low, high = now - ago, now - ago + lead
        hits = [t for t in onsets if low <= t <= high]
        return hits[0] + ago if hits else None

    daily = [t for t in (seen(d * DAY) for d in range(1, 8)) if t is not None]
    if len(daily) >= DAILY_ONSETS_NEEDED:
        return min(daily)
    weekly = [t for t in (seen(w * WEEK) for w in range(1, 3)) if t is not None]
    if len(weekly) >= WEEKLY_ONSETS_NEEDED:
        return min(weekly)
    return None


def to_status(warmth: Warmth, learned: LearnedIdle | None, iso: ToIso) -> dict[str, object]:
    """status.learned; `iso` formats a time (the caller's timefmt.iso)."""
    return {
        "startupSeconds": warmth.startup_seconds,
        "idleSeconds": None if learned is None else learned.seconds,
        "coldStartPercent": None if learned is None else round(learned.cold_start_percent, 3),
        "requests": round(warmth.requests, 3),
        "gaps": [
            [edge, round(c, 4), round(s, 1), round(r, 3)]
            for edge, c, s, r in zip(
                (0.0, *GAP_EDGES),
                warmth.gap_counts,
                warmth.gap_seconds,
                warmth.gap_requests,
                strict=True,
            )
            if c > 0 or r > 0
        ],
        "idleSince": None if warmth.idle_since is None else iso(warmth.idle_since),
        "headUntil": None if warmth.head_until is None else iso(warmth.head_until),
        "headBin": warmth.head_bin,
        "onsets": [iso(t) for t in warmth.onsets],
        "countedAt": None if warmth.counted_at is None else iso(warmth.counted_at),
        "decayedAt": None if warmth.decayed_at is None else iso(warmth.decayed_at),
    }


def from_status(learned: Mapping[str, Any] | None, parse: ParseTime) -> Warmth:
    """status.learned back; entries that do not parse are dropped, never guessed."""
    if not isinstance(learned, Mapping):
        return Warmth()
    counts, seconds, requests = [0.0] * _BINS, [0.0] * _BINS, [0.0] * _BINS
    for row in learned.get("gaps") or []:
        if not (isinstance(row, list) and len(row) == 4 and all(_number(v) for v in row)):
            continue
        b = bisect_right(GAP_EDGES, float(row[0]))
        counts[b], seconds[b], requests[b] = float(row[1]), float(row[2]), float(row[3])
    head_bin = learned.get("headBin")
    startup = learned.get("startupSeconds")
    total = learned.get("requests")
    return Warmth(
        startup_seconds=float(startup) if _number(startup) and startup > 0 else None,
        requests=float(total) if _number(total) and total >= 0 else 0.0,
        gap_counts=tuple(counts),
        gap_seconds=tuple(seconds),
        gap_requests=tuple(requests),
        idle_since=parse(learned.get("idleSince")),
        head_until=parse(learned.get("headUntil")),
        head_bin=head_bin if isinstance(head_bin, int) and 0 <= head_bin < _BINS else None,
        onsets=tuple(sorted(t for t in map(parse, learned.get("onsets") or []) if t)),
        counted_at=parse(learned.get("countedAt")),
        decayed_at=parse(learned.get("decayedAt")),
    )


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
