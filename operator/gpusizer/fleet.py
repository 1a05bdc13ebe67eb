"""Every WorkloadSizing this process decides, and which of them take a turn on each cycle.

One task starts the fleet's turns. A kopf daemon per workload, waiting on the cycle clock, kept
a coroutine, futures and their contexts for every workload: about half the heap the census
walked at 5,000 workloads (bench/README.md, "the heap at 5,000, owner by owner"). Here a
workload is its state and a few index entries, and a task lives only while its turn runs.

A workload takes a turn on every `decide_every`-th cycle (one sync period's worth of reads) and
on any cycle in which it changed: a pod it read moved, or an event of its object came and its
spec changed. Only the workloads a cycle may concern are asked: asking thousands at every read
cost more than the read (bench/README.md).

A quiet workload (its last turn found its replicas where its policy will want them for as long as
what it reads stays as it was: `reconcile.quiet`) waits up to `quiet_every` sync periods for its
next turn instead of one, for as long as nothing it reads changes: no pod it read moved (at any
read, or, against what its last turn read, at a full read: a slow drift), no event of its object,
its target or a pod it read came, and the reads every workload shares (other autoscalers, the
list's failure, Prometheus' state) are as they were. Any of these ends the wait: its turn comes
when it would have come had it not been quiet. Its turn then closes its running decision at the
last read that showed nothing changed (`Member.saw_unchanged`), not at its last turn, so the
stabilization windows are what they would have been. At 10,000 workloads the turns of unchanged
workloads held the operator's core (bench/README.md, "Issue 29"). Its quiet turns come on the
cycles of its phase (one of the wait's cycles, dealt in the order the workloads joined): the
workloads that went quiet together (all of them, after a restart or a change of what they all
read) would otherwise take their turns together, a round of the whole fleet on one cycle of
each wait and none on the others, and a load change read on that cycle waited behind it.

Turns start one per pass of the event loop: a round of thousands of decisions that never wait
would otherwise hold the loop for seconds while the watches, the event poster and the next read
wait. Urgent ones (a pod they read moved, or they read none yet) start ahead of the rest: a load
change would otherwise wait behind up to a whole round of unchanged decisions. A turn is always
on the latest cycle: one still waiting when a newer cycle comes decides on the newer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gpusizer.clock import Cycle, CycleClock
from gpusizer.report import metrics
from gpusizer.report.writer import WorkloadGone
from gpusizer.signals.autoscalers import TargetKey
from gpusizer.signals.parse import PodKey
from gpusizer.signals.queries import OPTIONAL_SIGNALS
from gpusizer.signals.snapshot import Readings, drifted, readings

log = logging.getLogger(__name__)

Key = tuple[str, str]  # a WorkloadSizing's namespace and name


class Member(Protocol):
    """What the fleet asks of a workload when a cycle comes."""

    @property
    def key(self) -> Key: ...

    @property
    def uid(self) -> str: ...

    @property
    def pods(self) -> tuple[PodKey, ...]:
        """The pods its last turn read: a cycle in which one moved concerns it."""
        ...

    @property
    def target(self) -> TargetKey | None:
        """What its spec scales: an event of it may concern it."""
        ...

    @property
    def quiet(self) -> bool:
        """Its last turn found nothing that time alone, on what it read, could change."""
        ...

    @property
    def optional_reads(self) -> frozenset[str]:
        """The OPTIONAL_SIGNALS its turns decide on: the reads ask for them while it is in the
        fleet, and its turn waits for a cycle whose read did."""
        ...

    def urgent(self, cycle: Cycle) -> bool: ...

    def changed(self, cycle: Cycle) -> bool: ...

    def saw_unchanged(self, until: float) -> None:
        """Nothing it reads changed from its last turn to the read at `until`: its next turn
        closes its running decision there."""
        ...


M = TypeVar("M", bound=Member)
R = TypeVar("R")
Indexed = TypeVar("Indexed")  # a pod or a target, in the fleet's indexes


@dataclass(eq=False, slots=True)
class _Seat(Generic[M]):
    member: M
    decided: int = 0  # the number of the cycle its last turn was on; 0: none yet
    due: int = 0  # the cycle it takes a turn on whatever changed, as indexed
    pods: tuple[PodKey, ...] = ()  # as indexed
    target: TargetKey | None = None  # as indexed
    busy: bool = False  # a turn under way
    again: bool = False  # a cycle concerned it, or a nudge came, while busy
    nudged: bool = False
    quiet: Readings | None = None  # while quiet: what its last turn read
    phase: int = 0  # its quiet turns come on the cycles of this number, modulo a quiet wait


class Fleet(Generic[M]):
    """The workloads this process decides, by key (namespace, name)."""

    def __init__(self, clock: CycleClock, decide_every: int = 1, quiet_every: int = 1) -> None:
        self._clock = clock
        self._decide_every = decide_every
        self._quiet_every = quiet_every  # sync periods a quiet workload waits; 1: none
        self._joined = 0  # workloads that joined: the next one's phase
        self._seats: dict[Key, _Seat[M]] = {}
        # in the order they came: turns start in it
        self._due: dict[int, dict[Key, None]] = {}
        self._by_pod: dict[PodKey, set[Key]] = {}
        self._by_target: dict[TargetKey, set[Key]] = {}
        self._quiet: set[Key] = set()
        self._shared: object = None  # the reads every workload shares, as of the latest cycle
        self._unchanged_at = 0.0  # the time of the latest cycle
        self._touched: set[Key] = set()
        # waiting for a turn, in order, the urgent ones apart
        self._urgent: dict[Key, None] = {}
        self._waiting: dict[Key, None] = {}
        self._queued = asyncio.Event()
        self._turns: set[asyncio.Task[None]] = set()
        self.held = False  # no turn starts while a replica that took over confirms who exists
        clock.on_cycle = self._cycle_came

    def __len__(self) -> int:
        return len(self._seats)

    def __iter__(self) -> Iterator[M]:
        return iter([seat.member for seat in self._seats.values()])

    def get(self, key: Key) -> M | None:
        seat = self._seats.get(key)
        return seat.member if seat is not None else None

    def join(self, member: M) -> None:
        """A workload to decide from now on. Its first turn is on the latest cycle if that is
        at most a period old, else on the next: after a pause the latest may be hours old."""
        key = member.key
        self.leave(key)
        seat = self._seats[key] = _Seat(member, phase=self._joined % self._quiet_cycles)
        self._joined += 1
        self._clock.listeners = len(self._seats)
        latest = self._clock.latest
        if latest is not None and self._clock.fresh():
            self._enqueue(key, seat, latest)
        else:
            self._schedule(key, seat, self._clock.number + 1)

    def leave(self, key: Key) -> None:
        """It takes no more turns (a turn under way finishes)."""
        seat = self._seats.pop(key, None)
        if seat is None:
            return
        self._schedule(key, seat, 0)
        self._index_pods(key, seat, ())
        self._index_target(key, seat, None)
        self._quiet.discard(key)
        metrics.QUIET_WORKLOADS.set(len(self._quiet))
        self._urgent.pop(key, None)
        self._waiting.pop(key, None)
        self._touched.discard(key)
        self._clock.listeners = len(self._seats)

    @property
    def _quiet_cycles(self) -> int:
        """The cycles of a quiet workload's longest wait."""
        return self._decide_every * self._quiet_every

    def optional_reads(self) -> frozenset[str]:
        """The OPTIONAL_SIGNALS some workload decides on (SnapshotReader.optional)."""
        wanted: set[str] = set()
        for seat in self._seats.values():
            wanted |= seat.member.optional_reads
            if len(wanted) == len(OPTIONAL_SIGNALS):
                break
        return frozenset(wanted)

    def touch(self, key: Key) -> None:
        """An event of its object came: the next cycle asks it whether it changed."""
        seat = self._seats.get(key)
        if seat is not None:
            self._touched.add(key)
            self._disturb(key, seat)

    def touch_pod(self, pod: PodKey) -> None:
        """An event of a pod came: a quiet workload that read it is quiet no more."""
        for key in list(self._by_pod.get(pod, ())):
            self._disturb(key, self._seats[key])

    def touch_target(self, target: TargetKey) -> None:
        """An event of a Deployment or StatefulSet came: a quiet workload that scales it is
        quiet no more."""
        for key in list(self._by_target.get(target, ())):
            self._disturb(key, self._seats[key])

    def nudge(self, key: Key) -> None:
        """A turn at once, ahead of the others, on the latest cycle even if it took one on it
        already: the activator holds a request, and the wake must not wait for a cycle. If the
        latest is more than a period old (a replica that just took over read nothing while
        its peer was in charge), on the next. Before its first turn a nudge is that turn."""
        seat = self._seats.get(key)
        if seat is None or not seat.decided:
            return
        self._disturb(key, seat)
        if not self._clock.fresh():
            self._schedule(key, seat, self._clock.number + 1)
            return
        if seat.busy:
            seat.again = seat.nudged = True
            return
        self._waiting.pop(key, None)
        self._urgent[key] = None
        self._queued.set()

    def nudge_all(self) -> None:
        for key in list(self._seats):
            self.nudge(key)

    def confirm(self, members: Iterable[M], listed: set[str]) -> int:
        """`members` were in the fleet before a list of the API server's WorkloadSizings
        (their uids, `listed`) began: those it lacks were deleted while no watch said so
        (this replica paused behind its peer, a watch down). They leave; how many did."""
        left = 0
        for member in members:
            if member.uid not in listed and self.get(member.key) is member:
                self.leave(member.key)
                left += 1
        return left

    async def run(
        self,
        decide: Callable[[M, Cycle], Awaitable[R | None]],
        report: Callable[[M, R], Awaitable[None]],
    ) -> None:
        """Starts the turns, until cancelled: `decide` on the cycle, then `report` what it
        decided, the cycle let go in between. A `report` that raises WorkloadGone takes the
        workload out of the fleet."""
        while True:
            await self._queued.wait()
            self._queued.clear()
            while (self._urgent or self._waiting) and not self.held:
                queue = self._urgent or self._waiting
                key = next(iter(queue))
                del queue[key]
                seat = self._seats[key]
                latest = self._clock.latest
                assert latest is not None  # a turn is queued only once a cycle came
                if not latest.snapshot.asked_for(seat.member.optional_reads):
                    # it reads a signal no workload did when this cycle's read began: the
                    # next read asks for it (SnapshotReader)
                    self._schedule(key, seat, self._clock.number + 1)
                    continue
                seat.decided = self._clock.number
                self._schedule(key, seat, seat.decided + self._decide_every)
                if not self._clock.in_charge():
                    continue  # a replica not in charge writes nothing, not even a status
                seat.busy = True
                turn = asyncio.create_task(self._turn(key, seat, latest, decide, report))
                self._turns.add(turn)
                turn.add_done_callback(self._turns.discard)
                del latest  # nor kept here while the next turns start
                await asyncio.sleep(0)

    def release(self) -> None:
        """Turns start again after `held`."""
        self.held = False
        self._queued.set()

    async def _turn(
        self,
        key: Key,
        seat: _Seat[M],
        cycle: Cycle,
        decide: Callable[[M, Cycle], Awaitable[R | None]],
        report: Callable[[M, R], Awaitable[None]],
    ) -> None:
        try:
            outcome = await decide(seat.member, cycle)
            if self._seats.get(key) is seat:  # a cycle in which a pod it read moves asks it
                self._index_pods(key, seat, seat.member.pods)
                self._index_target(key, seat, seat.member.target)
                self._settle(key, seat, cycle)
            # let go before the status is written: while thousands of workloads first start,
            # their writes queue for the worker threads, and each turn waiting for its own
            # kept a cycle's snapshot alive (bench/README.md)
            del cycle
            if outcome is not None:
                await report(seat.member, outcome)
        except WorkloadGone:
            log.info("%s/%s was deleted: it takes no more turns", *key)
            if self._seats.get(key) is seat:
                self.leave(key)
            return
        except Exception:  # a bug: said, and the workload takes its next turn as usual
            log.exception("the turn of %s/%s failed", *key)
        finally:
            seat.busy = False
        if seat.again and self._seats.get(key) is seat:
            latest = self._clock.latest
            assert latest is not None  # a turn was on one
            urgent = seat.nudged or seat.member.urgent(latest)
            seat.again = seat.nudged = False
            (self._urgent if urgent else self._waiting)[key] = None
            self._queued.set()

    def _cycle_came(self, cycle: Cycle) -> None:
        # quiet ones whose wait this cycle ends are due on it if their sync period is over
        shared = (cycle.autoscalers, cycle.error, cycle.prometheus)
        if shared != self._shared:
            for key in list(self._quiet):
                self._disturb(key, self._seats[key], earliest=self._clock.number)
            self._shared = shared
        elif cycle.snapshot.full:
            for key in [
                k for k in self._quiet if drifted(self._seats[k].quiet or {}, cycle.snapshot)
            ]:
                self._disturb(key, self._seats[key], earliest=self._clock.number)
        # those still waiting from the last round (most of them, when a round of turns takes
        # nearly a period) move up if this cycle is urgent to them
        for key in [k for k in self._waiting if self._seats[k].member.urgent(cycle)]:
            del self._waiting[key]
            self._urgent[key] = None
        woken = self._due.pop(self._clock.number, {})
        for key in woken:
            seat = self._seats[key]
            seat.due = 0
            self._disturb(key, seat)  # its wait is over: nothing it reads changed till now
            self._enqueue(key, seat, cycle)
        asked = set(self._touched)
        self._touched.clear()
        for pod in cycle.moved:
            asked.update(self._by_pod.get(pod, ()))
        for key in asked:
            if key in woken or key in self._urgent or key in self._waiting:
                continue  # its turn, on the newest cycle, comes anyway
            seat = self._seats[key]
            self._disturb(key, seat)
            if seat.member.changed(cycle):
                self._enqueue(key, seat, cycle)
        self._unchanged_at = cycle.snapshot.time

    def _enqueue(self, key: Key, seat: _Seat[M], cycle: Cycle) -> None:
        if seat.busy:
            seat.again = True
        elif key not in self._urgent and key not in self._waiting:
            (self._urgent if seat.member.urgent(cycle) else self._waiting)[key] = None
            self._queued.set()

    def _settle(self, key: Key, seat: _Seat[M], cycle: Cycle) -> None:
        """After a turn on `cycle`: a quiet workload's next turn is on the first cycle of its
        phase after it, at most `quiet_every` sync periods on, unless something came meanwhile
        (a nudge, a turn already due)."""
        seat.quiet = None
        self._quiet.discard(key)
        if (
            self._quiet_every > 1
            and seat.member.quiet
            and not seat.again
            and seat.due == seat.decided + self._decide_every
        ):
            seat.quiet = readings(cycle.snapshot, seat.pods)
            self._quiet.add(key)
            wait = self._quiet_cycles
            self._schedule(key, seat, seat.decided + wait - (seat.decided - seat.phase) % wait)
        metrics.QUIET_WORKLOADS.set(len(self._quiet))

    def _disturb(self, key: Key, seat: _Seat[M], earliest: int | None = None) -> None:
        """Quiet no more: its turn comes when it would have, had it not been quiet (on cycle
        `earliest` at the soonest, by default the next), and closes its running decision at
        the latest cycle before, which showed nothing it reads changed."""
        if seat.quiet is None:
            return
        seat.quiet = None
        self._quiet.discard(key)
        metrics.QUIET_WORKLOADS.set(len(self._quiet))
        seat.member.saw_unchanged(self._unchanged_at)
        if seat.due:
            soonest = self._clock.number + 1 if earliest is None else earliest
            self._schedule(key, seat, max(seat.decided + self._decide_every, soonest))

    def _schedule(self, key: Key, seat: _Seat[M], due: int) -> None:
        """Indexed to take a turn on cycle `due` (0: on none)."""
        if seat.due:
            waiting = self._due.get(seat.due)
            if waiting is not None:
                waiting.pop(key, None)
                if not waiting:
                    del self._due[seat.due]
        seat.due = due
        if due:
            self._due.setdefault(due, {})[key] = None

    def _index_target(self, key: Key, seat: _Seat[M], target: TargetKey | None) -> None:
        if target != seat.target:
            _reindex(self._by_target, key, _some(seat.target), _some(target))
            seat.target = target

    def _index_pods(self, key: Key, seat: _Seat[M], pods: tuple[PodKey, ...]) -> None:
        if pods != seat.pods:
            _reindex(self._by_pod, key, seat.pods, pods)
            seat.pods = pods


def _some(item: Indexed | None) -> tuple[Indexed, ...]:
    return () if item is None else (item,)


def _reindex(
    index: dict[Indexed, set[Key]], key: Key, old: tuple[Indexed, ...], new: tuple[Indexed, ...]
) -> None:
    """`key` filed under `new` in `index` instead of under `old`."""
    for item in old:
        keys = index.get(item)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del index[item]
    for item in new:
        index.setdefault(item, set()).add(key)
