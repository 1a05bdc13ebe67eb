"""The soak's figures, from what the harness sampled and the checker saw: recovery per fault,
Events and status patches per fault, the operator's memory and CPU over time, and the checks
that pass or fail the run. Pure: the harness collects, this computes."""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from e2e.soak.checker import LOAD_EVENTS, Checker
from e2e.soak.faults import KINDS, Injected

# Faults after which the operator must find metrics known again, and those after which it
# must decide again (it could not act meanwhile).
METRIC_FAULTS = frozenset(
    {"prometheus-killed", "prometheus-slow", "prometheus-500", "prometheus-garbage"}
)
OWN_METRIC_FAULTS = frozenset({"node-scrape-down"})


@dataclass(frozen=True)
class OperatorSample:
    """One look at one operator process."""

    time: float
    name: str
    pid: int
    rss_mib: float
    cpu_seconds: float
    decisions: float
    active: bool
    prometheus_available: float | None = None
    known: frozenset[str] = frozenset()  # workloads whose metrics it knows (active one only)


def recovery(
    fault: Injected,
    samples: Sequence[OperatorSample],
    acting: Iterable[str],
    owed_at_end: Mapping[str, float | None],
) -> dict[str, float | None]:
    """From the fault's end: until the operator decides again, until the metrics it lost are
    known again, and until no scale-up it owed then is owed any more (`owed_at_end`: each
    workload owed one, with when that ended). None: not seen before the soak ended."""
    end = fault.end if fault.end is not None else fault.start
    after = [s for s in samples if s.time >= end]
    seen: dict[int, float] = {}
    decided = None
    for s in after:
        if s.pid in seen and s.decisions > seen[s.pid]:
            decided = s.time - end
            break
        seen[s.pid] = s.decisions
    metrics: float | None = 0.0
    if fault.kind in METRIC_FAULTS or fault.kind in OWN_METRIC_FAULTS:
        wanted = set(acting) if fault.names is None else set(fault.names) & set(acting)
        before = [s for s in samples if s.active and s.time <= fault.start]
        baseline = len(before[-1].known & wanted) if before else len(wanted)
        metrics = _first(
            s.time - end
            for s in after
            if s.active
            and (s.prometheus_available != 0 or fault.kind in OWN_METRIC_FAULTS)
            and len(s.known & wanted) >= 0.95 * baseline
        )
    scale_up: float | None = 0.0
    if any(until is None for until in owed_at_end.values()):
        scale_up = None
    elif owed_at_end:
        scale_up = max(0.0, *(until - end for until in owed_at_end.values() if until is not None))
    parts = [decided, metrics, scale_up]
    total = None if any(p is None for p in parts) else max(p for p in parts if p is not None)
    return {"decided": decided, "metrics": metrics, "scale_up": scale_up, "total": total}


class Recovered:
    """Which faults have recovered, asked again as the run goes on: a recovery once seen stays
    (`recovery` reads only what came after the fault, and an owed scale-up once written stays
    written), so each fault is judged until it has, and no longer."""

    def __init__(self) -> None:
        self._done: set[tuple[str, float]] = set()

    def pending(
        self,
        faults: Iterable[Injected],
        samples: Sequence[OperatorSample],
        acting: Iterable[str],
        owed_at: Callable[[float], Mapping[str, float | None]],
    ) -> list[Injected]:
        wanted = list(acting)
        left = []
        for fault in faults:
            key = (fault.kind, fault.start)
            if key in self._done:
                continue
            owed = owed_at(fault.end if fault.end is not None else fault.start)
            if recovery(fault, samples, wanted, owed)["total"] is None:
                left.append(fault)
            else:
                self._done.add(key)
        return left


def _first(values: Iterable[float]) -> float | None:
    return next(iter(values), None)


def per_fault_counts(
    faults: Sequence[Injected],
    checker: Checker,
    slot: float,
    baseline: Mapping[str, Any],
    acting: int,
    grace: float,
    metrics_back: Mapping[tuple[str, float], float | None] | None = None,
) -> list[dict[str, Any]]:
    """What each fault cost: the Events (beyond those the load causes: scale, wake, reshape)
    and the status patches posted from its start to the next fault's (at most `slot` seconds),
    each with its bound. Events: 3, plus 2 per workload a fault on then touched itself (its
    node's exporter down, its target or spec broken: a flip each way); status patches: twice
    the fault-free slots' maximum plus as many, plus one per workload it acts on when
    Prometheus was out for longer than `grace` (each workload's status says so then). A fault
    is on for `slot` seconds after its end, or until the metrics it hid were known again
    (`metrics_back`, seconds after its end by (kind, start)) when that took longer: another
    fault that stopped the operator (an API server restart, a leader killed) delays the Events
    of its recovery into later slots (seed 27, 2026-11-26: 67 MetricsRecovered)."""
    ordered = sorted(faults, key=lambda f: f.start)
    back = metrics_back or {}

    def after_end(f: Injected) -> float:
        return max(slot, back.get((f.kind, f.start)) or 0.0)

    rows = []
    for fault, nxt in itertools.zip_longest(ordered, ordered[1:]):
        start = fault.start
        stop = min(nxt.start if nxt is not None else math.inf, start + slot)
        on = [
            f
            for f in ordered
            if f.start < stop and (f.end if f.end is not None else math.inf) + after_end(f) > start
        ]
        touched = set().union(*(f.names for f in on if f.names is not None))
        long_outage = any(
            a < stop and b > start and b - a > grace for a, b in outages(ordered, stop)
        )
        events = [e for e in checker.events if start <= e[0] < stop]
        rows.append(
            {
                "kind": fault.kind,
                "events": len([e for e in events if e[3] not in LOAD_EVENTS]),
                "events_bound": 3 + 2 * len(touched),
                "load_events": len([e for e in events if e[3] in LOAD_EVENTS]),
                "status_patches": len([p for p in checker.status_patches if start <= p[0] < stop]),
                "status_patches_bound": 2 * baseline["status_patches_max"]
                + 2 * len(touched)
                + (acting if long_outage else 0),
            }
        )
    return rows


def outages(faults: Sequence[Injected], until: float) -> list[tuple[float, float]]:
    """The stretches in which Prometheus was out for the operator (faults that overlap or
    follow each other at once merged)."""
    merged: list[tuple[float, float]] = []
    for f in sorted((f for f in faults if f.kind in METRIC_FAULTS), key=lambda f: f.start):
        end = f.end if f.end is not None else until
        if merged and f.start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((f.start, end))
    return merged


def baseline_counts(checker: Checker, start: float, stop: float, slot: float) -> dict[str, Any]:
    """The same counts in slots of the fault period before any fault: the load's own cost."""
    rows = []
    t = start
    while t + slot <= stop:
        events = [e for e in checker.events if t <= e[0] < t + slot]
        rows.append(
            {
                "events": len([e for e in events if e[3] not in LOAD_EVENTS]),
                "status_patches": len([p for p in checker.status_patches if t <= p[0] < t + slot]),
            }
        )
        t += slot
    return {
        "slots": len(rows),
        "events_max": max((r["events"] for r in rows), default=0),
        "status_patches_max": max((r["status_patches"] for r in rows), default=0),
        "status_patches_mean": mean([r["status_patches"] for r in rows]),
    }


def mean(values: Sequence[float]) -> float:
    return round(statistics.fmean(values), 1) if values else 0.0


def summary(values: Sequence[float | None]) -> dict[str, Any]:
    seen = [v for v in values if v is not None]
    return {
        "n": len(values),
        "max": round(max(seen), 1) if seen else None,
        "mean": mean(seen) if seen else None,
        "unrecovered": len(values) - len(seen),
    }


@dataclass(frozen=True)
class Line:
    """A weighted least-squares line, and the standard error of its slope from its residuals
    (each point's variance taken as inversely proportional to its weight)."""

    mx: float
    my: float
    slope: float
    slope_se: float | None  # None with fewer than three points

    def __call__(self, x: float) -> float:
        return self.my + self.slope * (x - self.mx)


def _line(points: Sequence[tuple[float, float, float]]) -> Line | None:
    """Weighted least squares through (x, y, weight): None with fewer than two distinct x."""
    total = sum(w for _, _, w in points)
    if not points or total <= 0:
        return None
    mx = sum(x * w for x, _, w in points) / total
    my = sum(y * w for _, y, w in points) / total
    spread = sum(w * (x - mx) ** 2 for x, _, w in points)
    if spread <= 0:
        return None
    slope = sum(w * (x - mx) * (y - my) for x, y, w in points) / spread
    if len(points) < 3:
        return Line(mx, my, slope, None)
    residual = sum(w * (y - my - slope * (x - mx)) ** 2 for x, y, w in points)
    return Line(mx, my, slope, math.sqrt(residual / (len(points) - 2) / spread))


def growth(
    samples: Sequence[OperatorSample], warm: float, end: float, bin_seconds: float = 60.0
) -> dict[str, Any]:
    """The replica in charge from `warm` to `end`: RSS and CPU (cores) where a least-squares
    line through them starts and ends, and RSS's maximum. A line, not two windows: a leader is
    killed about every five minutes, so two windows compare different processes, and the
    faults a window holds swing its CPU by a quarter (bench/README.md, "Seeds 33 and 34").
    CPU also says how far its growth is known (`growth_se_pct`, one standard error, from the
    scatter of its bins about the line): the bins of a run with faults scatter so widely that
    an hour resolves its growth to about 20 % (bench/README.md, "How far an hour resolves CPU
    growth"). RSS says none: its samples, 5 s apart, are not independent."""
    active = [s for s in samples if s.active and warm <= s.time <= end]
    rss = _line([(s.time, s.rss_mib, 1.0) for s in active])
    by_pid: dict[int, list[OperatorSample]] = defaultdict(list)
    for s in samples:
        by_pid[s.pid].append(s)
    used: dict[int, float] = defaultdict(float)
    seconds: dict[int, float] = defaultdict(float)
    for got in by_pid.values():
        for a, b in itertools.pairwise(got):
            if b.active and warm <= a.time and b.time <= end:
                slot = int((b.time - warm) // bin_seconds)
                used[slot] += b.cpu_seconds - a.cpu_seconds
                seconds[slot] += b.time - a.time
    cpu = _line(
        [
            (warm + (slot + 0.5) * bin_seconds, used[slot] / span, span)
            for slot, span in seconds.items()
            if span > 0
        ]
    )

    def ends(line: Line | None, digits: int) -> dict[str, float | None]:
        if line is None:
            return {"first": None, "last": None}
        return {"first": round(line(warm), digits), "last": round(line(end), digits)}

    cpu_growth: dict[str, float | None] = {"growth_pct": None, "growth_se_pct": None}
    if cpu is not None and cpu(warm) > 0:
        cpu_growth["growth_pct"] = round(100 * cpu.slope * (end - warm) / cpu(warm), 1)
        if cpu.slope_se is not None:
            cpu_growth["growth_se_pct"] = round(100 * cpu.slope_se * (end - warm) / cpu(warm), 1)
    return {
        "rss_mib": {
            **ends(rss, 1),
            "max": round(max(s.rss_mib for s in active), 1) if active else None,
        },
        "cpu_cores": {**ends(cpu, 3), **cpu_growth},
    }


GROWTH_BOUND = 1.10  # where the line may end, against where it starts
GROWTH_JUDGED_AFTER = 20 * 60.0  # ten minutes of warm-up, then at least ten fitted
GROWTH_ERRORS = 2.0  # with faults, CPU growth is judged this many standard errors past the bound


def judge_growth(
    figures: Mapping[str, Any], seconds: float, *, beyond_error: bool = False
) -> dict[str, Any]:
    """Growth against GROWTH_BOUND, on runs of GROWTH_JUDGED_AFTER or more (a shorter one is
    still warming up). `beyond_error` is for CPU in a run with faults: a leader killed every
    five minutes joins a dozen processes into its line, and the faults scatter its minutes so
    that an hour knows the growth to about 20 % (bench/README.md, "How far an hour resolves CPU
    growth"), so it fails only growth the run resolves, past the bound by GROWTH_ERRORS of its
    standard errors; a quiet run, one process for the hour, judges the bound itself."""
    first, last = figures.get("first"), figures.get("last")
    pct, error = figures.get("growth_pct"), figures.get("growth_se_pct")
    seen = f"{first} -> {last}"
    if error is not None:
        seen += f" ({pct:+} % ± {error} %)"
    if seconds < GROWTH_JUDGED_AFTER:
        return {"ok": True, "judged": False, "detail": f"{seen}, not judged: < 20 min"}
    if first is None or last is None:
        return {"ok": False, "judged": True, "detail": f"{seen}: no line"}
    if beyond_error and pct is not None and error is not None:
        bound_pct = 100 * (GROWTH_BOUND - 1)
        return {
            "ok": pct - GROWTH_ERRORS * error <= bound_pct,
            "judged": True,
            "detail": f"{seen}, failed only past {bound_pct:g} % by {GROWTH_ERRORS:g} errors",
        }
    return {"ok": last <= GROWTH_BOUND * first, "judged": True, "detail": seen}


def relisted(
    restarts: Sequence[Injected], lists: Sequence[tuple[float, str]], watched: set[str]
) -> list[bool]:
    """Per API server restart, whether every watched kind was listed again: answered after
    the old process was signalled (it then takes no new request; the new one answers within
    a second of a SIGKILL). Counting from the fault's end missed a relist made
    while the harness still probed the new server (the seed-39 soak)."""
    return [
        {r for t, r in lists if t > f.facts.get("killed", f.start)} >= watched for f in restarts
    ]


def fault_counts(faults: Sequence[Injected]) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    for f in faults:
        counts[f.kind] += 1
    return counts


def processes(samples: Sequence[OperatorSample], start: float) -> list[dict[str, Any]]:
    """Each operator process's life: when (seconds into the soak), its RSS and CPU first and
    last, and the decisions it made."""
    by_pid: dict[int, list[OperatorSample]] = defaultdict(list)
    for sample in samples:
        by_pid[sample.pid].append(sample)
    rows = []
    for pid, got in by_pid.items():
        first, last = got[0], got[-1]
        span = last.time - first.time
        rows.append(
            {
                "replica": first.name,
                "pid": pid,
                "from_s": round(first.time - start),
                "to_s": round(last.time - start),
                "rss_mib": [round(first.rss_mib, 1), round(last.rss_mib, 1)],
                "rss_mib_max": round(max(s.rss_mib for s in got), 1),
                "cpu_cores": round((last.cpu_seconds - first.cpu_seconds) / span, 3)
                if span
                else None,
                "decisions": int(last.decisions),
                "in_charge_s": round(
                    sum(b.time - a.time for a, b in itertools.pairwise(got) if b.active)
                ),
            }
        )
    return rows
