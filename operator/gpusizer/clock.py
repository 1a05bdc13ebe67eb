"""The cycle clock: one read of every workload's signals per read period, handed to every
workload the moment it arrives, each workload deciding in its turn.

A read is shared: the batched Prometheus snapshot and the list of other autoscalers cost the
same whatever the number of workloads.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
)
from dataclasses import dataclass, field, replace
from typing import Any

from gpusizer.report import metrics
from gpusizer.signals.autoscalers import TargetKey
from gpusizer.signals.health import PrometheusHealth, PrometheusState
from gpusizer.signals.parse import PodKey
from gpusizer.signals.reader import SnapshotReader
from gpusizer.signals.snapshot import Snapshot, moved_pods

log = logging.getLogger(__name__)


@dataclass
class Cycle:
    """What one sync period's shared reads returned, for every workload."""

    snapshot: Snapshot
    autoscalers: Mapping[TargetKey, str]
    error: str | None = None
    workloads: int = 0  # how many decide on it
    # pods whose readings moved since the previous cycle: their workloads are decided first
    moved: frozenset[PodKey] = frozenset()
    # an outage of Prometheus going on, or the last one
    prometheus: PrometheusState = field(default_factory=PrometheusState)
    error_since: float | None = None  # when the list of other autoscalers began failing


class FailingSince:
    """When a read shared by every workload began failing, if it is failing: the failure is
    the fleet's, and a workload's status says it only once it has lasted (report.turn)."""

    def __init__(self) -> None:
        self.since: float | None = None

    def observe(self, failed: bool, now: float) -> float | None:
        if not failed:
            self.since = None
        elif self.since is None:
            self.since = now
        return self.since


async def fetch_cycle(
    reader: SnapshotReader,
    health: PrometheusHealth,
    list_autoscalers: Callable[[], Awaitable[Mapping[TargetKey, str]]],
    listing: FailingSince,
) -> Cycle:
    """The batched Prometheus snapshot, whether Prometheus answers at all, and the list of
    other autoscalers, for every workload."""
    started = time.monotonic()
    snapshot = await reader.read()
    health.observe(snapshot)
    metrics.CYCLE_SECONDS.labels(read="full" if snapshot.full else "moved").observe(
        time.monotonic() - started
    )
    try:
        owners = await list_autoscalers()
        error = None
    except Exception as exc:  # the API server is down or refusing: say so, act on nothing
        log.warning("listing HPAs and ScaledObjects failed: %s", exc)
        owners, error = {}, f"listing HPAs and ScaledObjects failed: {exc}"
    return Cycle(
        snapshot=snapshot,
        autoscalers=owners,
        error=error,
        # read after the awaits: a replica that took over meanwhile knows its predecessor's
        # outages too (startup.Runtime.took_over)
        prometheus=health.state,
        error_since=listing.observe(error is not None, time.time()),
    )


Urgency = Callable[[Cycle], bool]  # whether a workload's turn in a cycle comes first


class Nudge:
    """A turn asked for at once, on the latest cycle, from outside the clock: the activator
    said it holds a request, and the wake must not wait for the next cycle."""

    def __init__(self) -> None:
        self._asked = False
        self._waiter: asyncio.Future[None] | None = None

    def __call__(self) -> None:
        self._asked = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def take(self) -> bool:
        """Whether a turn was asked for since the last take."""
        asked, self._asked = self._asked, False
        return asked

    def waiter(self) -> asyncio.Future[None]:
        """Done when a turn is asked for; the same one until then (no future per cycle)."""
        if self._waiter is None or self._waiter.done():
            self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter


@dataclass(eq=False)
class _Sleeper:
    """A workload waiting for a cycle that concerns it: the clock wakes it, and no other."""

    due: int  # the number of the cycle it decides on whatever changed
    pods: tuple[PodKey, ...]  # a cycle in which one of these moved concerns it
    key: Hashable | None  # `CycleClock.touch` of this concerns it
    woken: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class CycleClock:
    """One snapshot per read period, handed to every workload the moment it arrives.

    Each workload waits here for the next cycle instead of running on a timer of its own: with
    timers a change waited up to a period for the shared snapshot and up to another for the
    workload's own tick. Nothing is fetched while no workload listens (a replica paused behind
    its peer).

    A workload decides on every `decide_every`-th cycle (one sync period's worth of reads) and
    on any cycle in which it changed: a load change is acted on at the next read, while the
    workloads that did not change cost one decision per sync period (a round of decisions over
    thousands of workloads takes most of a period: bench/README.md, `cycle_s`). Only the
    workloads a cycle may concern wake for it (their turn is due, a pod they read moved, their
    object changed): waking every waiting workload at every read to ask was a share of the
    operator's CPU that grew with the fleet (bench/README.md).

    A cycle wakes many workloads at once and most decisions never wait, so one pass of the
    event loop would run all of them back to back (seconds, at thousands of workloads) while
    the watches, the event poster and the next snapshot wait: workloads take turns, one
    decision starting per pass, the others queued in order. Urgent ones (a workload whose
    readings moved) queue ahead of the rest: a load change would otherwise wait behind up to a
    whole round of unchanged decisions."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[Cycle]],
        period_seconds: float,
        monotonic: Callable[[], float] = time.monotonic,
        decide_every: int = 1,
    ) -> None:
        self._fetch = fetch
        # whether this replica acts now: always alone, else while it holds the operator's
        # Lease (startup.lead); a workload's turn while it does not is skipped (Workload.follow)
        self.in_charge: Callable[[], bool] = lambda: True
        self._period = period_seconds
        self._decide_every = decide_every
        self._monotonic = monotonic  # for a cycle's age
        self._turn_taken = False
        # workloads waiting for their turn, each with what says whether a cycle is urgent to it
        self._turns: collections.deque[tuple[asyncio.Future[None], Urgency]] = collections.deque()
        self._urgent_turns: collections.deque[asyncio.Future[None]] = collections.deque()
        self._listeners = 0
        self._number = 0
        self._latest: Cycle | None = None
        self._published_at = 0.0
        self._wanted = asyncio.Event()
        # the workloads waiting for a cycle that concerns them, by what would
        self._due: dict[int, dict[_Sleeper, None]] = {}
        self._by_pod: dict[PodKey, dict[_Sleeper, None]] = {}
        self._by_key: dict[Hashable, dict[_Sleeper, None]] = {}
        self._touched: set[Hashable] = set()

    async def run(self) -> None:
        """Fetch at every period while a workload listens; runs until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._listeners:
                self._wanted.clear()
                await self._wanted.wait()
            started = loop.time()
            try:
                self.publish(await self._fetch())
            except Exception:  # a bug, not an outage (fetch reports those): keep the beat
                log.exception("fetching the cycle's metrics failed")
            # the beat itself: the next period starts one period after this one did
            await asyncio.sleep(max(0.0, self._period - (loop.time() - started)))

    def publish(self, cycle: Cycle) -> None:
        before = self._latest.snapshot if self._latest is not None else None
        self._latest = replace(
            cycle, workloads=self._listeners, moved=moved_pods(before, cycle.snapshot)
        )
        # those still waiting from the last round (most of them, when a round of decisions
        # takes nearly a period) move up if this cycle is urgent to them
        waiting, self._turns = self._turns, collections.deque()
        for turn, urgent in waiting:
            self._queue(turn, urgent)
        self._published_at = self._monotonic()
        self._number += 1
        woken = dict(self._due.pop(self._number, {}))
        for pod in self._latest.moved:
            woken.update(self._by_pod.get(pod, {}))
        for key in self._touched:
            woken.update(self._by_key.get(key, {}))
        self._touched.clear()
        for sleeper in woken:
            self._wake(sleeper)

    def restate(self, prometheus: PrometheusState) -> None:
        """The latest cycle, as it reads with what is now known of Prometheus: a replica that
        takes over learns its predecessor's outages after the cycle was read, and the turns it
        then gives every workload at once are on that cycle (startup.Runtime.took_over)."""
        if self._latest is not None:
            self._latest = replace(self._latest, prometheus=prometheus)

    def touch(self, key: Hashable) -> None:
        """The workload that follows with `key` changed (an event of its object came): the
        next cycle asks it whether that concerns it."""
        self._touched.add(key)

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        self._listeners += 1
        self._wanted.set()
        try:
            yield
        finally:
            self._listeners -= 1

    async def cycles(
        self,
        until: asyncio.Future[Any],
        urgent: Urgency = lambda _: False,
        changed: Callable[[Cycle], bool] = lambda _: False,
        pods: Callable[[], Iterable[PodKey]] = tuple,
        key: Hashable | None = None,
        nudge: Nudge | None = None,
    ) -> AsyncIterator[Cycle]:
        """The cycles to decide on from now on, until `until` is done: every `decide_every`-th
        since the last one decided on, and any in which `changed` says the workload changed,
        the turn taken ahead of the others when `urgent` says so. One that arrives while the
        caller is still busy with the previous is skipped for the newest, which is then decided
        on: what changed in the skipped one is not in the newest's changes. The first is the
        latest if it is at most a period old: after a pause it may be hours old. A `nudge`
        gives a turn at once, ahead of the others, on the latest cycle even if it was decided
        on already.

        While it waits, `changed` is asked only of a cycle in which one of its `pods()` moved
        or after `touch(key)`: what else it could say changed (its spec) comes with an event
        of its object, and asking thousands of waiting workloads at every read cost more than
        the read (bench/README.md). A nudge wakes only the workload it belongs to.

        No cycle is kept here while waiting, for a turn or for the next cycle: every waiting
        workload held the one it last saw, and each cycle's snapshot with it (bench/README.md:
        several snapshots alive at once during a first round)."""
        decided = looked = 0  # the numbers of the cycles last decided on and last looked at
        while not until.done():
            if decided and nudge is not None and nudge.take():
                await self._turn(lambda _: True)
                if until.done():
                    return
                decided = looked = self._number
                assert self._latest is not None  # one was decided on
                yield self._latest
                continue
            if (
                self._latest is not None
                and self._number > looked
                and (decided or not self._stale())
            ):
                skipped = self._number > looked + 1
                looked = self._number
                if (
                    not decided
                    or skipped
                    or looked - decided >= self._decide_every
                    or changed(self._latest)
                ):
                    await self._turn(urgent)
                    if until.done():
                        return
                    if nudge is not None:
                        nudge.take()  # this turn reads what the nudge was for
                    # the newest: another may have come while this workload waited for its turn
                    decided = looked = self._number
                    yield self._latest
                    continue
            due = decided + self._decide_every if decided else self._number + 1
            interrupts = [until]
            if nudge is not None and decided:
                interrupts.append(nudge.waiter())
            # the clock looked at every cycle before the one that woke it
            woke = await self._sleep(_Sleeper(due, tuple(pods()), key), interrupts)
            looked = max(looked, woke - 1)

    async def _sleep(self, sleeper: _Sleeper, interrupts: list[asyncio.Future[Any]]) -> int:
        """Until a cycle that concerns `sleeper` comes or one of `interrupts` (the end, a
        nudge) is done: the number of the latest cycle then."""
        self._index(sleeper)

        def stop(_: asyncio.Future[Any]) -> None:
            self._wake(sleeper)

        for interrupt in interrupts:
            interrupt.add_done_callback(stop)
        try:
            return await sleeper.woken
        finally:
            for interrupt in interrupts:
                interrupt.remove_done_callback(stop)
            self._unindex(sleeper)

    def _index(self, sleeper: _Sleeper) -> None:
        self._due.setdefault(sleeper.due, {})[sleeper] = None
        for pod in sleeper.pods:
            self._by_pod.setdefault(pod, {})[sleeper] = None
        if sleeper.key is not None:
            self._by_key.setdefault(sleeper.key, {})[sleeper] = None

    def _unindex(self, sleeper: _Sleeper) -> None:
        _discard(self._due, sleeper.due, sleeper)
        for pod in sleeper.pods:
            _discard(self._by_pod, pod, sleeper)
        if sleeper.key is not None:
            _discard(self._by_key, sleeper.key, sleeper)

    def _wake(self, sleeper: _Sleeper) -> None:
        self._unindex(sleeper)
        if not sleeper.woken.done():
            sleeper.woken.set_result(self._number)

    async def _turn(self, urgent: Urgency) -> None:
        """Returns when it is this workload's turn; the next one's comes at the next pass of
        the loop, whether this decision is done by then or waits for a write."""
        loop = asyncio.get_running_loop()
        if self._turn_taken:
            waiting = loop.create_future()
            self._queue(waiting, urgent)
            await waiting  # the turn is handed over taken
        else:
            self._turn_taken = True
        loop.call_soon(self._pass_turn)

    def _queue(self, waiting: asyncio.Future[None], urgent: Urgency) -> None:
        """Ahead of the rest if the latest cycle is urgent to it."""
        if self._latest is not None and urgent(self._latest):
            self._urgent_turns.append(waiting)
        else:
            self._turns.append((waiting, urgent))

    def _pass_turn(self) -> None:
        while self._urgent_turns or self._turns:
            waiting = (
                self._urgent_turns.popleft() if self._urgent_turns else self._turns.popleft()[0]
            )
            if not waiting.done():  # done: its workload was cancelled while it waited
                waiting.set_result(None)
                return
        self._turn_taken = False

    def _stale(self) -> bool:
        return self._monotonic() - self._published_at > self._period


def _discard(index: dict[Any, dict[_Sleeper, None]], key: Any, sleeper: _Sleeper) -> None:
    entries = index.get(key)
    if entries is not None:
        entries.pop(sleeper, None)
        if not entries:
            del index[key]
