"""The fleet: which workloads take a turn on each cycle, in what order, and what it keeps."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from gpusizer.clock import Cycle, CycleClock
from gpusizer.fleet import Fleet
from gpusizer.report.writer import WorkloadGone
from gpusizer.signals.autoscalers import TargetKey
from gpusizer.signals.health import Outage, PrometheusState
from gpusizer.signals.parse import PodKey, PodSamples, Problem, Sample
from gpusizer.signals.queries import GPU_UTIL, KV_CACHE
from gpusizer.signals.snapshot import Snapshot
from gpusizer.vocabulary import Reason

from tests.fakes import never_fetched, steps_taken


@dataclass(eq=False)
class Member:
    """A workload as the fleet sees it, saying what it is asked."""

    name: str
    pods: tuple[PodKey, ...] = ()
    uid: str = ""
    is_urgent: Callable[[Cycle], bool] = lambda _: False
    has_changed: Callable[[Cycle], bool] = lambda _: False
    asked: list[float] = field(default_factory=list)
    target: TargetKey | None = None
    quiet: bool = False
    unchanged: list[float] = field(default_factory=list)  # what saw_unchanged was told
    optional_reads: frozenset[str] = frozenset()

    @property
    def key(self) -> tuple[str, str]:
        return "ns", self.name

    def saw_unchanged(self, until: float) -> None:
        self.unchanged.append(until)

    def urgent(self, cycle: Cycle) -> bool:
        return self.is_urgent(cycle)

    def changed(self, cycle: Cycle) -> bool:
        self.asked.append(cycle.snapshot.time)
        return self.has_changed(cycle)


class Turns:
    """Records each turn as (name, the time of the cycle it was on); a report can be made to
    wait, or to find the workload gone."""

    def __init__(self) -> None:
        self.taken: list[tuple[str, float]] = []
        self.on_decide: Callable[[Member, Cycle], None] = lambda _m, _c: None
        self.reporting = asyncio.Event()
        self.release: asyncio.Event | None = None
        self.gone: set[str] = set()

    async def decide(self, member: Member, cycle: Cycle) -> str:
        self.taken.append((member.name, cycle.snapshot.time))
        self.on_decide(member, cycle)
        return member.name

    async def report(self, member: Member, outcome: str) -> None:
        self.reporting.set()
        if self.release is not None:
            await self.release.wait()
        if member.name in self.gone:
            raise WorkloadGone("HTTP 404 Not Found")

    def names(self) -> list[str]:
        return [name for name, _ in self.taken]


def cycle(number: int, utilization: dict[str, float] | None = None) -> Cycle:
    """Cycle `number`, with these pods' GPU utilisation (pods of namespace "ns")."""
    samples = {("ns", pod): Sample(value, 0.0) for pod, value in (utilization or {}).items()}
    return Cycle(
        snapshot=Snapshot(time=float(number), signals={GPU_UTIL: PodSamples(samples)}),
        autoscalers={},
    )


def fleet_of(
    *members: Member,
    decide_every: int = 1,
    quiet_every: int = 1,
    monotonic: Callable[[], float] = time.monotonic,
) -> Fleet[Member]:
    """A fleet of `members` on a clock whose cycles the test publishes, an hour's period."""
    clock = CycleClock(never_fetched, period_seconds=3600, monotonic=monotonic)
    fleet: Fleet[Member] = Fleet(clock, decide_every=decide_every, quiet_every=quiet_every)
    for member in members:
        fleet.join(member)
    return fleet


@contextlib.asynccontextmanager
async def running(fleet: Fleet[Member], turns: Turns) -> AsyncIterator[None]:
    task = asyncio.create_task(fleet.run(turns.decide, turns.report))
    await steps_taken()
    try:
        yield
    finally:
        task.cancel()


async def passes(count: int = 20) -> None:
    """More passes of the loop than the turns asked for here take."""
    for _ in range(count):
        await steps_taken()


async def test_every_workload_takes_a_turn_on_each_cycle_once() -> None:
    fleet = fleet_of(Member("a"), Member("b"))
    turns = Turns()
    async with running(fleet, turns):
        for number in (1, 2, 3):
            fleet._clock.publish(cycle(number))
            await passes()
    assert sorted(turns.taken, key=lambda t: (t[1], t[0])) == [
        (name, float(n)) for n in (1, 2, 3) for name in ("a", "b")
    ]


async def test_a_workload_that_did_not_change_decides_once_per_sync_period() -> None:
    # three reads per sync period: the steady workload decides on the first cycle and every
    # third after it, the other also on the cycles in which its pod's reading moved
    moving_pod = ("ns", "moving-0")
    steady = Member("steady", pods=(("ns", "steady-0"),))
    moving = Member("moving", pods=(moving_pod,), has_changed=lambda c: moving_pod in c.moved)
    fleet = fleet_of(steady, moving, decide_every=3)
    turns = Turns()
    async with running(fleet, turns):
        for number in range(1, 9):
            load = 60.0 if number == 4 else 20.0  # it moves at 4, and back at 5
            fleet._clock.publish(cycle(number, {"steady-0": 50.0, "moving-0": load}))
            await passes()
    assert [t for n, t in turns.taken if n == "steady"] == [1.0, 4.0, 7.0]
    # a turn on a changed cycle starts the count again
    assert [t for n, t in turns.taken if n == "moving"] == [1.0, 4.0, 5.0, 8.0]
    # a waiting workload is asked whether it changed only of a cycle in which a pod it read
    # moved and its turn is not due anyway: the moving one, of cycle 5
    assert (steady.asked, moving.asked) == ([], [5.0])


async def test_an_event_of_its_object_has_the_next_cycle_ask_a_waiting_workload() -> None:
    spec_changed = False
    member = Member("w", has_changed=lambda _: spec_changed)
    fleet = fleet_of(member, decide_every=100)
    turns = Turns()
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await passes()
        spec_changed = True
        fleet._clock.publish(cycle(2))  # nothing said its object changed: not asked
        fleet.touch(("ns", "other"))
        fleet._clock.publish(cycle(3))
        await passes()
        assert turns.taken == [("w", 1.0)]
        fleet.touch(member.key)
        fleet._clock.publish(cycle(4))
        await passes()
        assert turns.taken[1:] == [("w", 4.0)]
        spec_changed = False
        fleet.touch(member.key)  # an event that changed nothing it decides on (its status)
        fleet._clock.publish(cycle(5))
        await passes()
    assert turns.taken == [("w", 1.0), ("w", 4.0)]
    assert member.asked == [4.0, 5.0]


async def test_a_workload_on_the_kv_cache_waits_for_a_cycle_whose_read_asked_for_it() -> None:
    kv = frozenset({KV_CACHE})
    fleet = fleet_of(Member("plain"), Member("on-kv", optional_reads=kv), decide_every=100)
    turns = Turns()
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))  # read before the workload on the KV cache came
        await passes()
        assert turns.taken == [("plain", 1.0)]
        with_kv = cycle(2)
        with_kv.snapshot.errors[KV_CACHE] = Problem(Reason.QUERY_ERROR, "bad_data")  # asked
        fleet._clock.publish(with_kv)
        await passes()
    assert turns.taken == [("plain", 1.0), ("on-kv", 2.0)]


def test_the_reads_ask_for_what_some_workload_in_the_fleet_decides_on() -> None:
    kv = frozenset({KV_CACHE})
    fleet = fleet_of(Member("a"), Member("b"))
    assert fleet.optional_reads() == frozenset()
    fleet.join(Member("c", optional_reads=kv))
    assert fleet.optional_reads() == kv
    fleet.leave(("ns", "c"))
    assert fleet.optional_reads() == frozenset()


POD = ("ns", "w-0")


def quiet_one(**kw: Any) -> Member:
    """A workload whose every turn finds nothing that time alone could change."""
    return Member("w", pods=(POD,), target=("ns", "Deployment", "w"), quiet=True, **kw)


async def turns_on(
    fleet: Fleet[Member],
    cycles: range,
    load: Callable[[int], float] = lambda _: 50.0,
    before: Callable[[int], None] = lambda _: None,
) -> list[float]:
    """The cycles on which its turns came: `before(n)` runs just before cycle n comes."""
    turns = Turns()
    async with running(fleet, turns):
        for number in cycles:
            before(number)
            fleet._clock.publish(cycle(number, {"w-0": load(number)}))
            await passes()
    return [t for _, t in turns.taken]


async def test_a_quiet_workload_waits_its_sync_periods_and_a_busy_one_does_not() -> None:
    quiet = fleet_of(quiet_one(), decide_every=2, quiet_every=3)
    # the first to join has phase 0: its quiet turns come on the multiples of the wait (6)
    assert await turns_on(quiet, range(1, 15)) == [1.0, 6.0, 12.0]
    busy = fleet_of(Member("w", pods=(POD,)), decide_every=2, quiet_every=3)
    assert await turns_on(busy, range(1, 8)) == [1.0, 3.0, 5.0, 7.0]


async def test_quiet_workloads_that_went_quiet_together_take_their_turns_spread() -> None:
    """After a restart every workload takes its first turn on one cycle: their quiet turns are
    dealt over the cycles of the wait instead of coming all together on every eighth."""
    members = [Member(f"w{i}", pods=(("ns", f"w{i}-0"),), quiet=True) for i in range(16)]
    fleet = fleet_of(*members, decide_every=2, quiet_every=4)
    turns = Turns()
    load = {f"w{i}-0": 50.0 for i in range(16)}
    async with running(fleet, turns):
        for number in range(1, 26):
            fleet._clock.publish(cycle(number, load))
            await passes()
    per_cycle = [sum(1 for _, t in turns.taken if t == number) for number in range(1, 26)]
    assert per_cycle[0] == 16
    assert per_cycle[1:] == [2] * 24  # each cycle of the wait, two of the sixteen
    for member in members:
        cycles = [t for name, t in turns.taken if name == member.name]
        waits = [later - earlier for earlier, later in itertools.pairwise(cycles)]
        assert max(waits) <= 8
        assert waits[1:] == [8.0, 8.0]  # after the first, on its phase: a whole wait


@pytest.mark.parametrize(
    "event",
    [
        lambda fleet: fleet.touch(("ns", "w")),
        lambda fleet: fleet.touch_pod(POD),
        lambda fleet: fleet.touch_target(("ns", "Deployment", "w")),
    ],
    ids=["its object", "a pod it read", "its target"],
)
async def test_an_event_ends_the_wait_and_the_turn_comes_as_it_would_have(
    event: Callable[[Fleet[Member]], None],
) -> None:
    member = quiet_one()
    fleet = fleet_of(member, decide_every=2, quiet_every=4)

    def event_after_4(number: int) -> None:
        if number == 5:
            event(fleet)

    # without the event: 1 and 8 (its phase); with it, after cycle 4, its sync period (3) being
    # over: 5, and quiet again, on its phase: 8
    assert await turns_on(fleet, range(1, 14), before=event_after_4) == [1.0, 5.0, 8.0]
    assert member.unchanged == [4.0, 7.0]  # its turn on 5 closes its running decision there


@pytest.mark.parametrize(
    "event",
    [
        lambda fleet: fleet.touch(("ns", "other")),
        lambda fleet: fleet.touch_pod(("ns", "other-0")),
        lambda fleet: fleet.touch_target(("ns", "Deployment", "other")),
        lambda fleet: fleet.touch_target(("ns", "StatefulSet", "w")),
    ],
    ids=["another object", "another pod", "another target", "another kind"],
)
async def test_an_event_of_something_it_does_not_read_leaves_it_waiting(
    event: Callable[[Fleet[Member]], None],
) -> None:
    member = quiet_one()
    fleet = fleet_of(member, decide_every=2, quiet_every=4)
    assert await turns_on(fleet, range(1, 10), before=lambda _: event(fleet)) == [1.0, 8.0]
    assert member.unchanged == [7.0]


@pytest.mark.parametrize(
    "shared",
    [
        {"autoscalers": {("ns", "Deployment", "w"): "HorizontalPodAutoscaler w"}},
        {"error": "listing HPAs and ScaledObjects failed: 503"},
        {
            "prometheus": PrometheusState(
                Outage(Problem(Reason.PROMETHEUS_UNREACHABLE, "down"), 5.0)
            )
        },
    ],
    ids=["another autoscaler", "the list failing", "Prometheus out"],
)
async def test_a_change_of_what_every_workload_reads_ends_the_wait(shared: dict[str, Any]) -> None:
    member = quiet_one()
    fleet = fleet_of(member, decide_every=2, quiet_every=4)
    turns = Turns()
    async with running(fleet, turns):
        for number in range(1, 6):
            changed = shared if number >= 5 else {}
            fleet._clock.publish(replace(cycle(number, {"w-0": 50.0}), **changed))
            await passes()
    assert [t for _, t in turns.taken] == [1.0, 5.0]
    assert member.unchanged == [4.0]


async def test_a_drift_too_slow_to_move_at_one_read_ends_the_wait_at_a_full_read() -> None:
    member = quiet_one()
    fleet = fleet_of(member, decide_every=1, quiet_every=10)
    load = {1: 50.0, 2: 52.0, 3: 54.0, 4: 54.0}.__getitem__  # under 5 % a read, 8 % in all
    assert await turns_on(fleet, range(1, 5), load) == [1.0, 3.0]
    assert member.unchanged == [2.0]


async def test_a_drift_between_full_reads_waits_for_the_next() -> None:
    member = quiet_one()
    fleet = fleet_of(member, decide_every=1, quiet_every=10)
    turns = Turns()
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1, {"w-0": 50.0}))
        await passes()
        moved_read = cycle(2, {"w-0": 52.0})
        moved_read.snapshot.full = False
        fleet._clock.publish(moved_read)
        await passes()
        assert [t for _, t in turns.taken] == [1.0]
        fleet._clock.publish(cycle(3, {"w-0": 54.0}))
        await passes()
    assert [t for _, t in turns.taken] == [1.0, 3.0]


async def test_a_workload_busy_while_it_changed_decides_on_the_newest_cycle() -> None:
    # cycle 2 moved its readings, cycle 3 (compared with 2) did not: both came while it was
    # still writing what it decided on cycle 1
    pod = ("ns", "w-0")
    fleet = fleet_of(
        Member("w", pods=(pod,), has_changed=lambda c: pod in c.moved), decide_every=10
    )
    turns = Turns()
    turns.release = asyncio.Event()
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1, {"w-0": 10.0}))
        await asyncio.wait_for(turns.reporting.wait(), timeout=10)
        fleet._clock.publish(cycle(2, {"w-0": 90.0}))
        fleet._clock.publish(cycle(3, {"w-0": 90.0}))
        turns.release.set()
        await passes()
    assert turns.taken == [("w", 1.0), ("w", 3.0)]


async def test_a_newcomer_does_not_decide_on_a_cycle_older_than_a_period() -> None:
    now = [1000.0]
    fleet = fleet_of(monotonic=lambda: now[0])
    fleet._clock.publish(cycle(0))
    now[0] += 4000  # cycle 0 is more than a period (an hour here) old: what a pause does
    fleet.join(Member("new"))
    turns = Turns()
    async with running(fleet, turns):
        await passes()
        assert turns.taken == []
        fleet._clock.publish(cycle(1))
        await passes()
    assert turns.taken == [("new", 1.0)]


async def test_a_newcomer_decides_at_once_on_a_fresh_cycle() -> None:
    fleet = fleet_of()
    fleet._clock.publish(cycle(1))
    fleet.join(Member("new"))
    turns = Turns()
    async with running(fleet, turns):
        await passes()
    assert turns.taken == [("new", 1.0)]


async def test_the_clock_fetches_for_as_many_workloads_as_the_fleet_holds() -> None:
    fleet = fleet_of(Member("a"), Member("b"))
    assert fleet._clock.listeners == 2
    fleet.leave(("ns", "a"))
    fleet.leave(("ns", "a"))  # twice: no harm
    assert fleet._clock.listeners == 1 == len(fleet)


async def test_no_cycle_is_kept_while_a_status_is_written_or_turns_wait() -> None:
    # at 5,000 workloads a snapshot is megabytes; turns waiting for their status writes, or
    # for the next cycle, each kept the one they had decided on
    fleet = fleet_of(Member("a"), Member("b"))
    turns = Turns()
    turns.release = asyncio.Event()
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await asyncio.wait_for(turns.reporting.wait(), timeout=10)
        latest = fleet._clock.latest
        assert latest is not None
        first = weakref.ref(latest)
        del latest
        fleet._clock.publish(cycle(2))
        gc.collect()
        assert first() is None
        turns.release.set()
        await passes()


def hold_the_loop(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_turns_take_turns_with_the_rest_of_the_loop() -> None:
    # 100 workloads whose turns never wait, 2 ms each: 200 ms of one loop pass unpaced
    fleet = fleet_of(*(Member(str(n)) for n in range(100)))
    turns = Turns()
    loop = asyncio.get_running_loop()
    passes_while_deciding = 0
    all_decided = asyncio.Event()

    def other_work() -> None:  # a watch event, the event poster, the next read: a pass each
        nonlocal passes_while_deciding
        if not all_decided.is_set():
            passes_while_deciding += 1
            loop.call_soon(other_work)

    def decided(_member: Member, _cycle: Cycle) -> None:
        if len(turns.taken) == 1:
            other_work()
        hold_the_loop(0.002)  # a turn's CPU
        if len(turns.taken) == 100:
            all_decided.set()

    turns.on_decide = decided
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await asyncio.wait_for(all_decided.wait(), timeout=30)
    # a pass per turn; unpaced it would be one pass in all
    assert passes_while_deciding >= 99
    assert sorted(turns.names(), key=int) == [str(n) for n in range(100)]


async def test_a_workload_that_left_while_waiting_for_its_turn_takes_none() -> None:
    fleet = fleet_of(Member("a"), Member("b"), Member("c"))
    fleet._clock.publish(cycle(1))
    fleet.leave(("ns", "b"))
    turns = Turns()
    async with running(fleet, turns):
        await passes()
    assert turns.names() == ["a", "c"]


async def test_urgent_workloads_take_their_turns_ahead_of_the_rest() -> None:
    members = [Member(str(n), is_urgent=lambda _, n=n: n % 10 == 9) for n in range(30)]
    fleet = fleet_of(*members)
    turns = Turns()
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await passes(60)
    assert turns.names()[:3] == ["9", "19", "29"]
    assert sorted(turns.names(), key=int) == [str(n) for n in range(30)]


async def test_a_workload_still_waiting_moves_up_when_a_new_cycle_is_urgent_to_it() -> None:
    members = [
        Member(str(n), is_urgent=lambda c, n=n: n == 29 and c.snapshot.time == 2.0)
        for n in range(30)
    ]
    fleet = fleet_of(*members)
    turns = Turns()

    def second_cycle_comes(_member: Member, _cycle: Cycle) -> None:
        if len(turns.taken) == 1:  # while the 29 others wait
            fleet._clock.publish(cycle(2))

    turns.on_decide = second_cycle_comes
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await passes(80)
    assert turns.names()[:2] == ["0", "29"]
    # a turn is on the newest cycle; 0 decides again, on 2, after the others
    assert {t for _, t in turns.taken[1:]} == {2.0}
    assert turns.names()[-1] == "0" and len(turns.taken) == 31


async def test_a_nudge_gives_a_turn_at_once_on_the_latest_cycle() -> None:
    """The activator's push: the workload decides again on the cycle it already decided on,
    without waiting for the next one (the period here is an hour)."""
    fleet = fleet_of(Member("w"), Member("other"))
    turns = Turns()
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await passes()
        fleet.nudge(("ns", "w"))
        await passes()
        assert turns.taken[2:] == [("w", 1.0)], "one nudge, one turn, for that one only"
        fleet.nudge(("ns", "unknown"))
        await passes()
    assert len(turns.taken) == 3


async def test_a_nudge_on_a_cycle_older_than_a_period_is_a_turn_on_the_next() -> None:
    """A replica that takes over read nothing while its peer was in charge: every workload
    is nudged, and decides on the first cycle it reads, not on one from before."""
    now = [1000.0]
    fleet = fleet_of(Member("w"), decide_every=100, monotonic=lambda: now[0])
    turns = Turns()
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await passes()
        now[0] += 4000
        fleet.nudge(("ns", "w"))
        await passes()
        assert turns.taken == [("w", 1.0)]
        fleet._clock.publish(cycle(2))
        await passes()
    assert turns.taken == [("w", 1.0), ("w", 2.0)]


async def test_a_nudge_before_a_turn_is_that_turn() -> None:
    fleet = fleet_of(Member("w"))
    fleet.nudge(("ns", "w"))
    turns = Turns()
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await passes()
    assert turns.taken == [("w", 1.0)], "the turn on cycle 1 read what the nudge was for"


async def test_a_nudge_while_its_turn_runs_is_another_turn_after_it() -> None:
    fleet = fleet_of(Member("w"), decide_every=100)
    turns = Turns()
    turns.release = asyncio.Event()
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await asyncio.wait_for(turns.reporting.wait(), timeout=10)
        fleet.nudge(("ns", "w"))
        turns.release.set()
        await passes()
    assert turns.taken == [("w", 1.0), ("w", 1.0)]


async def test_a_replica_not_in_charge_takes_no_turn_and_keeps_the_beat() -> None:
    fleet = fleet_of(Member("w"), decide_every=2)
    in_charge = False
    fleet._clock.in_charge = lambda: in_charge
    turns = Turns()
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await passes()
        assert turns.taken == []
        in_charge = True
        fleet._clock.publish(cycle(2))
        await passes()
        assert turns.taken == [], "cycle 1 counted as its turn: the next is due on 3"
        fleet._clock.publish(cycle(3))
        await passes()
    assert turns.taken == [("w", 3.0)]


async def test_no_turn_starts_while_held() -> None:
    fleet = fleet_of(Member("w"))
    fleet.held = True
    turns = Turns()
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await passes()
        assert turns.taken == []
        fleet.release()
        await passes()
    assert turns.taken == [("w", 1.0)]


async def test_a_workload_found_gone_takes_no_more_turns(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpusizer.fleet")
    fleet = fleet_of(Member("gone"), Member("kept"))
    turns = Turns()
    turns.gone = {"gone"}
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await passes()
        fleet._clock.publish(cycle(2))
        await passes()
    assert turns.taken == [("gone", 1.0), ("kept", 1.0), ("kept", 2.0)]
    assert fleet._clock.listeners == 1 and fleet._by_pod == {}
    assert "ns/gone was deleted: it takes no more turns" in caplog.text


async def test_a_turn_that_fails_is_said_and_the_next_comes_as_usual(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = fleet_of(Member("w"))
    turns = Turns()

    def fails_once(_member: Member, each: Cycle) -> None:
        if each.snapshot.time == 1.0:
            raise RuntimeError("a bug")

    turns.on_decide = fails_once
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await passes()
        fleet._clock.publish(cycle(2))
        await passes()
    assert turns.taken == [("w", 1.0), ("w", 2.0)]
    assert "the turn of ns/w failed" in caplog.text


async def test_a_workload_that_left_during_its_turn_is_not_indexed_again() -> None:
    fleet = fleet_of(Member("w", pods=(("ns", "w-0"),)))
    turns = Turns()
    turns.on_decide = lambda member, _: fleet.leave(member.key)
    async with running(fleet, turns):
        fleet._clock.publish(cycle(1))
        await passes()
        fleet._clock.publish(cycle(2, {"w-0": 50.0}))
        await passes()
    assert turns.taken == [("w", 1.0)]
    assert (fleet._by_pod, fleet._due, len(fleet)) == ({}, {}, 0)


async def test_one_created_again_under_its_name_replaces_the_old() -> None:
    old, new = Member("w", uid="u1"), Member("w", uid="u2")
    fleet = fleet_of(old)
    fleet.join(new)
    assert fleet.get(("ns", "w")) is new and len(fleet) == 1


async def test_confirming_drops_those_the_list_lacks_and_keeps_newcomers() -> None:
    kept, deleted = Member("kept", uid="u1"), Member("deleted", uid="u2")
    fleet = fleet_of(kept, deleted)
    members = list(fleet)  # taken before the list began
    newcomer = Member("new", uid="u3")  # created while it ran: not in the list
    fleet.join(newcomer)
    assert fleet.confirm(members, listed={"u1"}) == 1
    assert sorted(m.name for m in fleet) == ["kept", "new"]
