"""What the operator reads from Prometheus, through a `MetricsSource`: the snapshot every
workload decides on, a user's own queue query, and measured use over a window."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Mapping, Set

from gpusizer.api.v1alpha1 import MAX_SAMPLE_AGE_SECONDS, Server
from gpusizer.ledger import WINDOWS, LedgerRow, ledger_rows
from gpusizer.ports import MetricsSource
from gpusizer.signals.cache import PeriodicCache
from gpusizer.signals.parse import PodSamples, Problem, Sample, merged
from gpusizer.signals.queries import (
    MAX_NAMED_PODS,
    MOVE_MARGIN_SECONDS,
    OPTIONAL_SIGNALS,
    REPLICA_SIGNALS,
    SLOW_SIGNALS,
    PodQuery,
    batched_signals,
    custom_queue_query,
    draw_queries,
    full_read_queries,
    history_queries,
    instance_queries,
    ledger_queries,
    move_floor,
    moved_values_query,
    moves_query,
)
from gpusizer.signals.snapshot import Snapshot
from gpusizer.signals.usage import UsageHistory
from gpusizer.vocabulary import Reason


async def read_full(
    source: MetricsSource,
    servers: Iterable[Server],
    last: Snapshot | None = None,
    wall: Callable[[], float] = time.time,
    optional: Set[str] = OPTIONAL_SIGNALS,
) -> Snapshot:
    """Every signal for every pod (of OPTIONAL_SIGNALS, those in `optional`) but those that
    size slices (SLOW_SIGNALS, `read_slow`): a constant number of queries, whatever the
    workload count. With `last`, a replica signal whose query went unanswered while others
    answered keeps `last`'s samples (`_held`)."""
    queries = {
        name: query
        for name, query in full_read_queries(servers, optional).items()
        if name not in SLOW_SIGNALS
    }
    snap = Snapshot(time=wall())
    snap.signals, snap.errors = await source.per_pod_batch(queries)
    if last is not None and snap.signals:
        _held(snap, last, REPLICA_SIGNALS, again=True)
        _carried(snap, last)
    return snap


def carrying(full: Snapshot, slow: Snapshot) -> Snapshot:
    """A full read with the slow lane's latest answer (`read_slow`) in it, marked as carried:
    what it holds answered nothing at this read (signals.health)."""
    full.signals.update(slow.signals)
    full.errors.update(slow.errors)
    full.carried = frozenset(slow.signals.keys() | slow.errors.keys())
    return full


async def read_slow(
    source: MetricsSource,
    servers: Iterable[Server],
    last: Snapshot | None = None,
    wall: Callable[[], float] = time.time,
) -> Snapshot:
    """The signals that size slices and not replicas (SLOW_SIGNALS), for every pod, apart
    from the full read: at 10,000 workloads the GPU memory query timed out at 10 s most
    minutes, and the full read that carried it waited for it, the decisions of every workload
    with it (bench/README.md, "Issue 29: GPU memory on a lane of its own").

    With `last`, a query that timed out or found no Prometheus keeps `last`'s answer, marked
    why, for one read and not more: nothing ages it (it is only a status reading), and its
    query timing out once at 10,000 workloads took the reading away from every workload and
    gave it back a slow period later, two status writes each (bench/README.md, "Issue 29: a
    memory read that timed out")."""
    queries = {
        name: query
        for name, query in full_read_queries(servers, frozenset()).items()
        if name in SLOW_SIGNALS
    }
    snap = Snapshot(time=wall())
    snap.signals, snap.errors = await source.per_pod_batch(queries)
    if last is not None:
        _held(snap, last, SLOW_SIGNALS, again=False)
        _carried(snap, last)
    return snap


def _held(snap: Snapshot, last: Snapshot, signals: Set[str], again: bool) -> None:
    """Of `signals`, one whose query timed out or found no Prometheus keeps the samples `last`
    had, marked with the failure; one `last` held already is held `again` or not.

    A replica signal is held while the rest of its read answered: each workload decides on
    its samples while they are fresh (its maxSampleAgeSeconds, signals.join) and says the
    failure after. A Prometheus too busy to answer one query of a read at 10,000 workloads made
    every workload say its metrics lost and back, an Event and a status write each way, which
    kept it too busy (bench/README.md, "Issue 29"); a failure that outlasts the samples is said
    as slowly as an outage (report.turn). A read in which every query failed holds nothing:
    that is an outage (signals.health), and a query Prometheus refuses is said at once."""
    for name, problem in list(snap.errors.items()):
        kept = last.signals.get(name)
        if (
            problem.reason is Reason.PROMETHEUS_UNREACHABLE
            and name in signals
            and kept is not None
            and (again or kept.held is None)
        ):
            since = snap.time if kept.held_since is None else kept.held_since
            snap.signals[name] = PodSamples(
                kept.samples, kept.problems, kept.read_time(last.time), problem, since
            )
            del snap.errors[name]


def _carried(snap: Snapshot, last: Snapshot) -> None:
    """A pod an answered query left out keeps the sample `last` had of it, aged since, for
    up to the longest maxSampleAgeSeconds: the join decides on it while it is younger than
    the workload's, and says StaleSamples after, as of any old sample; meanwhile the
    workload may scale up on it, never down (ReplicaCounts.unscraped). Prometheus drops every
    series of a scrape target at once when one scrape of it fails (staleness markers), so a
    single failed scrape of an exporter made each workload of its pods say its metrics lost
    and, a scrape later, back; at 10,000 workloads on two cores the status writes and Events
    of those flips kept the cluster too busy to scrape (bench/README.md, "Issue 29: a failed
    scrape is not a lost metric")."""
    for name, samples in list(snap.signals.items()):
        before = last.signals.get(name)
        if before is None or before is samples or samples.held is not None:
            continue
        gap = samples.read_time(snap.time) - before.read_time(last.time)
        kept = {
            key: Sample(sample.value, sample.age + gap)
            for key, sample in before.samples.items()
            if key not in samples.samples
            and key not in samples.problems
            and sample.age + gap <= MAX_SAMPLE_AGE_SECONDS
        }
        if kept:
            snap.signals[name] = PodSamples(
                {**kept, **samples.samples},
                samples.problems,
                samples.read_at,
                carried=frozenset(kept),
            )


async def read_moved(source: MetricsSource, base: Snapshot, since_seconds: float) -> Snapshot:
    """`base` with the replica signals' pods whose value moved in the last `since_seconds`
    merged in, for a constant number of queries whatever the workload count: one per signal
    that `base` has samples of, saying which pods moved (a signal it failed to read, or that no
    pod has, waits for the next full read), then one per signal with moves, for those pods'
    values. A signal whose queries fail keeps `base`'s samples: the next full read says whether
    Prometheus is failing. A moved pod's age is taken as `since_seconds`, the most it can be."""
    wanted = {
        name: (selector, scale, combine)
        for name, (selector, scale, combine) in batched_signals(Server).items()
        if name in REPLICA_SIGNALS and name in base.signals and base.signals[name].samples
    }
    snap = Snapshot(time.time(), dict(base.signals), base.errors, full=False)
    moves, _ = await source.per_pod_batch(
        {
            f"moved:{name}": PodQuery(
                moves_query(selector, combine, move_floor(name, scale), since_seconds), 1.0, "max"
            )
            for name, (selector, scale, combine) in wanted.items()
        }
    )
    moved = {
        name: found.samples.keys() | found.problems.keys()
        for name in wanted
        if (found := moves.get(f"moved:{name}")) is not None and (found.samples or found.problems)
    }
    asked: dict[str, PodQuery] = {}
    for name, keys in moved.items():
        selector, scale, combine = wanted[name]
        named = {pod for _, pod in keys} if len(keys) <= MAX_NAMED_PODS else None
        asked[f"moved-values:{name}"] = PodQuery(
            moved_values_query(selector, combine, named), scale, combine
        )
    values, _ = await source.per_pod_batch(asked)
    for name, keys in moved.items():
        update = values.get(f"moved-values:{name}")
        if update is None:
            continue
        # a pod of the same name in another namespace, or one that did not move, is not news
        samples = {
            key: Sample(sample.value, since_seconds)
            for key, sample in update.samples.items()
            if key in keys
        }
        problems = {key: problem for key, problem in update.problems.items() if key in keys}
        if samples or problems:
            snap.signals[name] = merged(snap.signals[name], PodSamples(samples, problems))
    return snap


async def read_custom_queue(source: MetricsSource, promql: str) -> PodSamples | Problem:
    """A user's queueQuery, summed per pod."""
    samples, errors = await source.per_pod_batch({"queue:custom": custom_queue_query(promql)})
    return errors.get("queue:custom") or samples["queue:custom"]


class SnapshotReader:
    """What each read of the cycle clock asks Prometheus: every signal for every pod once per
    `full_every_seconds` (a sync period), and in between only the pods whose utilisation or
    queue moved since the read before, merged into the latest read. GPU memory, which sizes
    slices and not replicas, is read once per `slow_every_seconds` (right-sizing's period) on
    its own lane (`read_slow`): a full read carries its latest answer and waits only for the
    first.

    A full read returns a few series per pod and signal; the moves are a few series, so a load
    change is seen within a read period of its scrape for about the Prometheus work of one
    query of a full read (bench/README.md).

    Of OPTIONAL_SIGNALS, a read asks for those `optional` returns (the fleet's workloads decide
    on them), and one that the latest read left out makes the next read a full one."""

    def __init__(
        self,
        source: MetricsSource,
        servers: Iterable[Server],
        full_every_seconds: float,
        slow_every_seconds: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._servers = tuple(servers)
        self._full_every = full_every_seconds
        self._monotonic = monotonic
        self._latest: Snapshot | None = None
        self._full_at = self._read_at = 0.0
        self._slow_latest: Snapshot | None = None
        self._slow: PeriodicCache[None, Snapshot] = PeriodicCache(
            self._read_slow, slow_every_seconds, monotonic, serve_stale=True, what="GPU memory"
        )
        self.optional: Callable[[], Set[str]] = lambda: OPTIONAL_SIGNALS

    async def _read_slow(self, _: None) -> Snapshot:
        self._slow_latest = await read_slow(self._source, self._servers, self._slow_latest)
        return self._slow_latest

    async def read(self) -> Snapshot:
        latest, now, optional = self._latest, self._monotonic(), self.optional()
        since = now - self._read_at + MOVE_MARGIN_SECONDS
        self._read_at = now
        if (
            latest is None
            or now - self._full_at >= self._full_every
            or not latest.asked_for(optional)
        ):
            self._full_at = now
            # the first memory read is sent beside the first full read, not before it
            slow, full = await asyncio.gather(
                self._slow.get(None),
                read_full(self._source, self._servers, latest, optional=optional),
            )
            latest = carrying(full, slow)
        else:
            latest = await read_moved(self._source, latest, since)
        self._latest = latest
        return latest


WINDOW_MOVE_SHARE = 0.05
"""A window's use is read again once the window has moved by this share of itself (or after
the right-sizing period, if longer): its range queries cost Prometheus in proportion to the
window, and an hour's, read every minute at 10,000 pods, was the costliest read the operator
made (bench/README.md, "Issue 29: what an hour's history costs Prometheus"). An hour's peak
and mean move little in three minutes, and right-sizing moves a workload at most once an hour
by default (`--reshape-min-interval`)."""


def window_period(window_seconds: int, period_seconds: float) -> float:
    """The time between two reads of the use over a window of `window_seconds`: the
    right-sizing period (`period_seconds`), or WINDOW_MOVE_SHARE of the window if longer."""
    return max(period_seconds, window_seconds * WINDOW_MOVE_SHARE)


DRAW_WINDOW_FLOOR_SECONDS = 60
"""The shortest window the GPUs' draw is read over: two samples at dcgm-exporter's default
collection interval (30 s), whatever the right-sizing period."""


class HistoryCache:
    """Measured use over a window for every pod, read at most once per `window_period` of
    it: right-sizing needs it far less often than the replica signals. Past its period
    the reading goes on being used until its refresh lands (its `time` says when it was
    taken), so no turn waits for the window's read but the first.

    The pods' draw, which the savings ledger multiplies by the seconds between turns, is read
    on its own (`draw`) over the last period: the ledger needs a new pod's draw within a
    period, and the recent draw, not the window's mean."""

    def __init__(
        self,
        source: MetricsSource,
        period_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._wall = wall  # when a window ends
        self._cache: PeriodicCache[int, UsageHistory] = PeriodicCache(
            self._fetch,
            lambda window: window_period(window, period_seconds),
            clock,
            serve_stale=True,
            what="the usage over a window",
        )
        self._draw_window = max(DRAW_WINDOW_FLOOR_SECONDS, math.ceil(period_seconds))
        self._draw: PeriodicCache[None, UsageHistory] = PeriodicCache(
            self._fetch_draw, period_seconds, clock, serve_stale=True, what="the GPUs' draw"
        )

    async def _fetch(self, window: int) -> UsageHistory:
        return await self._read(window, history_queries(window), instance_queries(window))

    async def _fetch_draw(self, _: None) -> UsageHistory:
        return await self._read(self._draw_window, *draw_queries(self._draw_window))

    async def _read(
        self, window: int, pod_queries: Mapping[str, PodQuery], instances: Mapping[str, str]
    ) -> UsageHistory:
        at = self._wall()
        signals, errors = await self._source.per_pod_batch(pod_queries)
        found, mig_errors = await self._source.series_batch(instances)
        errors.update({f"mig_{name}": problem for name, problem in mig_errors.items()})
        return UsageHistory(window, at, signals, errors, found)

    async def get(self, window: int) -> UsageHistory:
        return await self._cache.get(window)

    async def draw(self) -> UsageHistory:
        """The pods' GPU draw over the last period, or the floor's window if longer."""
        return await self._draw.get(None)


async def read_ledger(source: MetricsSource) -> tuple[list[LedgerRow], list[str]]:
    """Every workload's savings ledger over each of `ledger.WINDOWS`, from the operator's own
    series, and the queries that failed."""
    wanted = {
        f"{window}/{name}": promql
        for window, seconds in WINDOWS.items()
        for name, promql in ledger_queries(seconds).items()
    }
    found, errors = await source.series_batch(wanted)
    rows = []
    for window in WINDOWS:
        prefix = f"{window}/"
        mine = {k.removeprefix(prefix): v for k, v in found.items() if k.startswith(prefix)}
        rows += ledger_rows(window, mine)
    return rows, [f"{name}: {problem.message}" for name, problem in errors.items()]


class LedgerCache:
    """Every workload's ledger, read at most once per `period_seconds` for all of them, the
    previous one used while it is read again."""

    def __init__(
        self,
        source: MetricsSource,
        period_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._cache: PeriodicCache[None, dict[tuple[str, str], list[LedgerRow]]] = PeriodicCache(
            self._fetch, period_seconds, clock, serve_stale=True, what="the savings ledger"
        )

    async def _fetch(self, _: None) -> dict[tuple[str, str], list[LedgerRow]]:
        rows, _problems = await read_ledger(self._source)
        by_workload: dict[tuple[str, str], list[LedgerRow]] = {}
        for row in rows:
            by_workload.setdefault((row.namespace, row.name), []).append(row)
        return by_workload

    async def get(self) -> dict[tuple[str, str], list[LedgerRow]]:
        return await self._cache.get(None)
