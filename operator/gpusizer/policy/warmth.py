"""How long to stay warm, and when to warm up ahead: learned from the workload itself.

Pure, like the rest of the policy. The replica policy feeds `observe` each decision with whether
the workload was quiet (no demand seen), the request rate and the measured start-up; what comes
back is persisted with the rest of the history, so a restart keeps what was learned.

Two things are learned:

- **Idle gaps** (a quiet spell, from the last demand to the next), in length bins, per block of
  the week when they began (three 8-hour blocks of weekdays, three of weekends), with the requests
  that arrived within one start-up of each gap's end: those meet a cold start if the workload
  went to zero during the gap. For idle times T_b per block, the share of requests meeting a
  cold start is the requests after gaps longer than their block's T_b over all requests, and
  the GPU time is each gap's min(gap, T_b) plus a start-up for each longer gap. The idle times
  with the least GPU time within the user's budget are found with one price per cold request
  for every block (a Lagrange multiplier, bisected), so warmth is bought where it avoids cold
  starts most cheaply: a block whose quiet spells usually end soon stays warm longer than one
  whose quiet spells last the night. A block with few gaps of its own borrows the shape of all
  of them. The budget they aim at is corrected by what the recent past actually spent. Counts
  decay with a half-life of a week, so the workload's recent habits weigh most.
- **Onsets**: the times demand came back after a gap longer than a start-up. An onset seen at
  this time of day on most of the last seven days, or at this time of week in each of the last
  two weeks, is expected again: `expected_onset` says so a start-up ahead.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
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
PRIOR_GAPS = 3.0  # pseudo-gaps of the overall shape added to each block's own
RELEARN_SECONDS = 3600.0  # the idle times are re-derived at most this often
BLOCK_HOURS = 8
BLOCKS = 2 * 24 // BLOCK_HOURS  # weekdays, then weekends
# Upper edges of the gap-length bins, 30 s to a day, about x1.4 apart; the last bin is open.
GAP_EDGES: tuple[float, ...] = (
    30, 45, 60, 90, 120, 180, 240, 300, 420, 600, 900, 1200, 1800, 2700, 3600,
    5400, 7200, 10800, 14400, 21600, 28800, 43200, 86400,
)  # fmt: skip
_BINS = len(GAP_EDGES) + 1
_CELLS = BLOCKS * _BINS
_CANDIDATES = (0.0, *GAP_EDGES)  # idle times tried: bin j's gaps are longer than _CANDIDATES[j]
DAILY_ONSETS_NEEDED = 4  # of the last 7 days
WEEKLY_ONSETS_NEEDED = 2  # of the last 2 weeks
# How early a replica is asked for before an expected onset, beyond its start-up: one decision
# period of the operator and the age of the metrics it reads.
PRE_WARM_MARGIN_SECONDS = 30.0
# Requests count against a gap for its start-up plus this: the wait for the metrics that show
# the return, the next decision and a rate window (the request rate is a rate over a minute).
HEAD_MARGIN_SECONDS = 90.0


def block(t: float) -> int:
    """The block of the week (UTC) a time falls in: 8-hour blocks of weekdays, then weekends."""
    day = math.floor(t / DAY)
    weekend = (day + 3) % 7 >= 5  # the epoch was a Thursday
    return (BLOCKS // 2) * weekend + int((t - day * DAY) // (BLOCK_HOURS * 3600))


@dataclass(frozen=True)
class Warmth:
    """Persisted in status.learned (see to_status / from_status). Gap statistics are indexed
    block x length bin."""

    startup_seconds: float | None = None
    requests: float = 0.0
    gap_counts: tuple[float, ...] = (0.0,) * _CELLS
    gap_seconds: tuple[float, ...] = (0.0,) * _CELLS
    gap_requests: tuple[float, ...] = (0.0,) * _CELLS  # requests in the start-up after the gap
    idle_since: float | None = None
    head_until: float | None = None
    head_cell: int | None = None
    head_cold: bool = False  # the gap that just ended found no replica ready
    cold_requests: float = 0.0  # requests that met a cold start (decayed like requests)
    onsets: tuple[float, ...] = ()
    decayed_at: float | None = None  # when the counts were last decayed (at a gap's end)
    idle_seconds: tuple[float, ...] | None = None  # learned, per block
    cold_start_percent: float | None = None  # estimated at the learned idle times
    learned_at: float | None = None
    learned_budget: float | None = None

    @property
    def startup(self) -> float:
        return DEFAULT_STARTUP_SECONDS if self.startup_seconds is None else self.startup_seconds

    def idle_seconds_at(self, t: float) -> float | None:
        """The learned idle time for a quiet spell that began at `t`."""
        return None if self.idle_seconds is None else self.idle_seconds[block(t)]


def observe(
    warmth: Warmth,
    now: float,
    *,
    since: float | None,
    quiet: bool | None,
    request_rate: float | None,
    startup_seconds: float | None,
    serving: bool = True,
    budget_percent: float | None = None,
) -> Warmth:
    """Fold one decision's reading in: requests arrived since the previous decision (`since`,
    None after a restart: that interval is not counted) and whether the workload was quiet
    (None, unknown, leaves the running gap alone), and whether a replica was ready to serve
    (a gap that ends with none is a cold start); with a budget, re-derive the idle times
    when they are missing, an hour old or for another budget. Returns `warmth` itself when
    nothing changed, which is most decisions."""
    changes: dict[str, Any] = {}
    if startup_seconds and startup_seconds > 0 and startup_seconds != warmth.startup_seconds:
        warmth = replace(warmth, startup_seconds=startup_seconds)
    if quiet is False and warmth.idle_since is not None:
        # the gap ended within (since, now]: what arrived then is the head of what follows
        warmth = _gap_ended(warmth, now, cold=not serving)
    if request_rate and since is not None and now > since:
        arrived = request_rate * (now - since)
        changes["requests"] = warmth.requests + arrived
        if warmth.head_until is not None and warmth.head_cell is not None:
            counted = list(warmth.gap_requests)
            counted[warmth.head_cell] += arrived
            changes["gap_requests"] = tuple(counted)
            if warmth.head_cold:
                changes["cold_requests"] = warmth.cold_requests + arrived
    if warmth.head_until is not None and now >= warmth.head_until:
        changes["head_until"] = changes["head_cell"] = None
    if quiet is True and warmth.idle_since is None:
        changes["idle_since"] = now
    if changes:
        warmth = replace(warmth, **changes)
    if budget_percent is None:
        if warmth.learned_budget is not None:
            warmth = replace(warmth, idle_seconds=None, cold_start_percent=None,
                             learned_at=None, learned_budget=None)  # fmt: skip
        return warmth
    if (
        warmth.learned_at is None
        or now - warmth.learned_at >= RELEARN_SECONDS
        or warmth.learned_budget != budget_percent
    ):
        learned = _learn(warmth, budget_percent)
        warmth = replace(
            warmth,
            idle_seconds=None if learned is None else learned[0],
            cold_start_percent=None if learned is None else learned[1],
            learned_at=now,
            learned_budget=budget_percent,
        )
    return warmth


def _gap_ended(warmth: Warmth, now: float, *, cold: bool) -> Warmth:
    assert warmth.idle_since is not None
    gap = now - warmth.idle_since
    decay = 1.0
    if warmth.decayed_at is not None:
        decay = 0.5 ** (max(0.0, now - warmth.decayed_at) / HALF_LIFE_SECONDS)
    cell = block(warmth.idle_since) * _BINS + bisect_right(GAP_EDGES, gap)
    counts = [c * decay for c in warmth.gap_counts]
    seconds = [s * decay for s in warmth.gap_seconds]
    requests = [r * decay for r in warmth.gap_requests]
    counts[cell] += 1.0
    seconds[cell] += gap
    onsets = warmth.onsets
    if gap > warmth.startup:
        onsets = (*(t for t in onsets if t > now - ONSET_HORIZON_SECONDS), now)
    return replace(
        warmth,
        requests=warmth.requests * decay,
        cold_requests=warmth.cold_requests * decay,
        head_cold=cold,
        gap_counts=tuple(counts),
        gap_seconds=tuple(seconds),
        gap_requests=tuple(requests),
        idle_since=None,
        head_until=now + warmth.startup + HEAD_MARGIN_SECONDS,
        head_cell=cell,
        onsets=onsets,
        decayed_at=now,
    )


def _learn(warmth: Warmth, budget_percent: float) -> tuple[tuple[float, ...], float] | None:
    """Idle times per block with the least GPU time whose share of requests meeting a cold
    start stays within the budget, and that share; None while too little has been seen."""
    total = sum(warmth.gap_counts)
    if total < MIN_GAPS_TO_LEARN or warmth.requests <= 0:
        return None
    # what the estimates may spend: the budget, less what the recent past already overspent
    # (or plus what it left unspent, up to twice the budget): the gaps seen so far miss the
    # habits the workload has not shown yet
    realized = 100.0 * warmth.cold_requests / warmth.requests
    aim = min(
        1.5 * budget_percent, max(budget_percent / 2.0, 1.5 * budget_percent - 0.5 * realized)
    )
    allowed = aim / 100.0 * warmth.requests
    pooled = [
        [sum(values[b * _BINS + i] for b in range(BLOCKS)) for i in range(_BINS)]
        for values in (warmth.gap_counts, warmth.gap_seconds, warmth.gap_requests)
    ]
    weight = PRIOR_GAPS / total
    # per block and candidate j: (GPU seconds, cold requests, as estimated with the prior),
    # and the block's own cold requests, which the budget is held to
    options: list[list[tuple[float, float, float]]] = []
    for b in range(BLOCKS):
        cells = range(b * _BINS, (b + 1) * _BINS)
        counts = [warmth.gap_counts[c] + weight * pooled[0][i] for i, c in enumerate(cells)]
        seconds = [warmth.gap_seconds[c] + weight * pooled[1][i] for i, c in enumerate(cells)]
        after = [warmth.gap_requests[c] + weight * pooled[2][i] for i, c in enumerate(cells)]
        own = [warmth.gap_requests[c] for c in cells]
        row = []
        for j, idle in enumerate(_CANDIDATES):
            longer = sum(counts[j:])
            cost = sum(seconds[:j]) + longer * (idle + warmth.startup)
            row.append((cost, sum(after[j:]), sum(own[j:])))
        options.append(row)

    def choose(price: float) -> tuple[list[int], float]:
        """Per block, the idle time with the least GPU time plus `price` per cold request
        (on a tie, the longer one)."""
        picks = []
        for row in options:
            scores = [cost + price * cold for cost, cold, _ in row]
            best = min(scores)
            picks.append(max(j for j, score in enumerate(scores) if score <= best))
        return picks, sum(options[b][j][2] for b, j in enumerate(picks))

    picks, cold = choose(0.0)
    if cold > allowed:
        low, high = 0.0, 1.0
        while choose(high)[1] > allowed and high < 1e15:
            high *= 8.0
        for _ in range(40):
            middle = (low + high) / 2.0
            if choose(middle)[1] > allowed:
                low = middle
            else:
                high = middle
        picks, cold = choose(high)
    return tuple(_CANDIDATES[j] for j in picks), 100.0 * cold / warmth.requests


def expected_onset(warmth: Warmth, now: float) -> float | None:
    """When demand is expected back within one start-up (plus a margin) from now, because it
    came back at this time of day on most of the last seven days or at this time of week in
    each of the last two weeks; None otherwise."""
    onsets = warmth.onsets  # ascending
    if not onsets:
        return None
    lead = warmth.startup + PRE_WARM_MARGIN_SECONDS

    def seen(ago: float) -> float | None:
        i = bisect_left(onsets, now - ago)
        if i < len(onsets) and onsets[i] <= now - ago + lead:
            return onsets[i] + ago
        return None

    daily: list[float] = []
    for day in range(1, 8):
        hit = seen(day * DAY)
        if hit is not None:
            daily.append(hit)
        elif 7 - day < DAILY_ONSETS_NEEDED - len(daily):
            break  # too few days left to reach the count
    if len(daily) >= DAILY_ONSETS_NEEDED:
        return min(daily)
    weekly = [t for t in (seen(w * WEEK) for w in range(1, 3)) if t is not None]
    if len(weekly) >= WEEKLY_ONSETS_NEEDED:
        return min(weekly)
    return None


def to_status(warmth: Warmth, iso: ToIso) -> dict[str, Any]:
    """status.learned; `iso` formats a time (the caller's timefmt.iso)."""

    def when(t: float | None) -> str | None:
        return None if t is None else iso(t)

    return {
        "startupSeconds": warmth.startup_seconds,
        "idleSeconds": None if warmth.idle_seconds is None else list(warmth.idle_seconds),
        "coldStartPercent": (
            None if warmth.cold_start_percent is None else round(warmth.cold_start_percent, 3)
        ),
        "requests": round(warmth.requests, 3),
        "coldRequests": round(warmth.cold_requests, 3),
        "headCold": warmth.head_cold,
        "gaps": [
            [cell // _BINS, _CANDIDATES[cell % _BINS], round(c, 4), round(s, 1), round(r, 3)]
            for cell, (c, s, r) in enumerate(
                zip(warmth.gap_counts, warmth.gap_seconds, warmth.gap_requests, strict=True)
            )
            if c > 0 or r > 0
        ],
        "idleSince": when(warmth.idle_since),
        "headUntil": when(warmth.head_until),
        "headCell": warmth.head_cell,
        "onsets": [iso(t) for t in warmth.onsets],
        "decayedAt": when(warmth.decayed_at),
        "learnedAt": when(warmth.learned_at),
        "learnedBudget": warmth.learned_budget,
    }


def from_status(learned: Mapping[str, Any] | None, parse: ParseTime) -> Warmth:
    """status.learned back; entries that do not parse are dropped, never guessed."""
    if not isinstance(learned, Mapping):
        return Warmth()
    counts, seconds, requests = [0.0] * _CELLS, [0.0] * _CELLS, [0.0] * _CELLS
    for row in learned.get("gaps") or []:
        if not (isinstance(row, list) and len(row) == 5 and all(_number(v) for v in row)):
            continue
        b = int(row[0])
        if b != row[0] or not 0 <= b < BLOCKS:
            continue
        cell = b * _BINS + bisect_right(GAP_EDGES, float(row[1]))
        counts[cell], seconds[cell], requests[cell] = float(row[2]), float(row[3]), float(row[4])
    head = learned.get("headCell")
    startup = learned.get("startupSeconds")
    total = learned.get("requests")
    cold_seen = learned.get("coldRequests")
    idle = learned.get("idleSeconds")
    idle_ok = isinstance(idle, list) and len(idle) == BLOCKS and all(_number(v) for v in idle)
    cold = learned.get("coldStartPercent")
    budget = learned.get("learnedBudget")
    return Warmth(
        startup_seconds=float(startup) if _number(startup) and startup > 0 else None,
        requests=float(total) if _number(total) and total >= 0 else 0.0,
        cold_requests=float(cold_seen) if _number(cold_seen) and cold_seen >= 0 else 0.0,
        head_cold=learned.get("headCold") is True,
        gap_counts=tuple(counts),
        gap_seconds=tuple(seconds),
        gap_requests=tuple(requests),
        idle_since=parse(learned.get("idleSince")),
        head_until=parse(learned.get("headUntil")),
        head_cell=head if isinstance(head, int) and 0 <= head < _CELLS else None,
        onsets=tuple(sorted(t for t in map(parse, list(learned.get("onsets") or [])) if t)),
        decayed_at=parse(learned.get("decayedAt")),
        idle_seconds=tuple(float(v) for v in idle) if idle_ok and idle else None,
        cold_start_percent=float(cold) if _number(cold) else None,
        learned_at=parse(learned.get("learnedAt")) if idle_ok else None,
        learned_budget=float(budget) if _number(budget) and idle_ok else None,
    )


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
