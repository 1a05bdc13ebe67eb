"""The cycle clock: one fetch per period, handed to every listening workload at once."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from gpusizer.clock import Cycle, CycleClock, Nudge
from gpusizer.signals.parse import PodSamples, Sample
from gpusizer.signals.queries import GPU_UTIL
from gpusizer.signals.snapshot import Snapshot


class Fetches:
    """A fetch that counts, each cycle's snapshot stamped with its number, and records how
    many workloads listened when it ran."""

    def __init__(self) -> None:
        self.count = 0
        self.done = asyncio.Event()
        self.clock: CycleClock | None = None
        self.listeners_seen: list[int] = []

    async def __call__(self) -> Cycle:
        self.count += 1
        if self.clock is not None:
            self.listeners_seen.append(self.clock._listeners)
        self.done.set()
        return Cycle(snapshot=Snapshot(time=float(self.count)), autoscalers={})


async def steps_taken() -> None:
    """Returns once every task created or woken before the call has taken its next step: a
    point in the loop's order (a callback queued after theirs), not a wait of some duration."""
    taken = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(taken.set_result, None)
    await taken


@contextlib.asynccontextmanager
async def running(clock: CycleClock) -> AsyncIterator[None]:
    """The clock's own loop, entered once it (and every task created before it) has taken its
    first step. Listener tasks created together all run, and wait for a cycle, in the loop
    pass in which the first of them wakes the clock; it fetches in the next."""
    task = asyncio.create_task(clock.run())
    await steps_taken()
    try:
        yield
    finally:
        task.cancel()


def cycle(number: int) -> Cycle:
    return Cycle(snapshot=Snapshot(time=float(number)), autoscalers={})


async def decide_until(
    clock: CycleClock,
    listen: Callable[[int], Awaitable[None]],
    listeners: int,
    all_decided: asyncio.Event,
    stop: asyncio.Future[None],
) -> None:
    """Run `listen(0)`..`listen(listeners - 1)` on the clock until `all_decided`, then stop
    them."""
    tasks = [asyncio.create_task(listen(n)) for n in range(listeners)]
    async with running(clock):
        await asyncio.wait_for(all_decided.wait(), timeout=30)
    stop.set_result(None)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)


@pytest.fixture
async def stop() -> AsyncIterator[asyncio.Future[None]]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    yield future
    if not future.done():
        future.set_result(None)


async def test_nothing_is_fetched_until_a_workload_listens_then_at_once() -> None:
    fetches = Fetches()
    clock = fetches.clock = CycleClock(fetches, period_seconds=3600)
    async with running(clock):
        with clock.listening():
            # the first listener does not wait out the hour-long period
            await asyncio.wait_for(fetches.done.wait(), timeout=10)
    # the one fetch so far came once someone listened, not when the clock started
    assert fetches.listeners_seen == [1]


async def test_every_listener_gets_each_cycle_once(stop: asyncio.Future[None]) -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    decided: asyncio.Queue[tuple[str, float]] = asyncio.Queue()

    async def listen(name: str) -> None:
        with clock.listening():
            async for each in clock.cycles(until=stop):
                decided.put_nowait((name, each.snapshot.time))

    listeners = [asyncio.create_task(listen(name)) for name in ("a", "b")]
    got = []
    for number in (1, 2, 3):
        clock.publish(cycle(number))
        got += sorted([await decided.get(), await decided.get()])
    stop.set_result(None)
    await asyncio.wait_for(asyncio.gather(*listeners), timeout=10)
    assert got == [(name, float(n)) for n in (1, 2, 3) for name in ("a", "b")]
    assert decided.empty()


def cycle_with(utilization: dict[str, float], number: int = 0) -> Cycle:
    """A cycle whose snapshot has these pods' GPU utilisation (pods of namespace "ns")."""
    samples = {("ns", pod): Sample(value, 0.0) for pod, value in utilization.items()}
    return Cycle(
        snapshot=Snapshot(time=float(number), signals={GPU_UTIL: PodSamples(samples)}),
        autoscalers={},
    )


async def test_a_workload_that_did_not_change_decides_once_per_sync_period(
    stop: asyncio.Future[None],
) -> None:
    # three reads per sync period: the steady workload decides on the first cycle and every
    # third after it, the other also on the cycles in which its pod's reading moved
    clock = CycleClock(Fetches(), period_seconds=3600, decide_every=3)
    moving_pod = ("ns", "moving-0")
    decided: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    asked: list[str] = []

    async def listen(name: str) -> None:
        def changed(each: Cycle) -> bool:
            asked.append(name)
            return moving_pod in each.moved

        with clock.listening():
            cycles = clock.cycles(
                until=stop, changed=changed, pods=lambda: (("ns", f"{name}-0"),), key=name
            )
            async for each in cycles:
                decided.put_nowait((name, each.snapshot.time))

    listeners = [asyncio.create_task(listen(name)) for name in ("steady", "moving")]
    for number in range(1, 9):
        moving = 60.0 if number == 4 else 20.0  # it moves at 4, and back at 5
        clock.publish(cycle_with({"steady-0": 50.0, "moving-0": moving}, number))
        await steps_taken()
        await steps_taken()  # the second's turn comes a pass after the first's
    stop.set_result(None)
    await asyncio.wait_for(asyncio.gather(*listeners), timeout=10)
    got: dict[str, list[float]] = {"steady": [], "moving": []}
    while not decided.empty():
        name, number = decided.get_nowait()
        got[name].append(number)
    assert got["steady"] == [1.0, 4.0, 7.0]
    # a decision on a changed cycle starts the count again
    assert got["moving"] == [1.0, 4.0, 5.0, 8.0]
    # a waiting workload is asked whether it changed only of a cycle in which a pod it read
    # moved and its turn is not due anyway: the moving one, of cycle 5
    assert asked == ["moving"]


async def test_an_event_of_its_object_has_the_next_cycle_ask_a_waiting_workload(
    stop: asyncio.Future[None],
) -> None:
    clock = CycleClock(Fetches(), period_seconds=3600, decide_every=100)
    spec_changed = False
    decided: asyncio.Queue[float] = asyncio.Queue()

    async def listen() -> None:
        with clock.listening():
            async for each in clock.cycles(until=stop, changed=lambda _: spec_changed, key="w"):
                decided.put_nowait(each.snapshot.time)

    task = asyncio.create_task(listen())
    clock.publish(cycle(1))
    assert await asyncio.wait_for(decided.get(), timeout=10) == 1.0
    spec_changed = True
    clock.publish(cycle(2))  # nothing said its object changed: not asked
    clock.touch("other")
    clock.publish(cycle(3))
    await steps_taken()
    assert decided.empty()
    clock.touch("w")
    clock.publish(cycle(4))
    assert await asyncio.wait_for(decided.get(), timeout=10) == 4.0
    spec_changed = False
    clock.touch("w")  # an event that changed nothing it decides on (its own status write)
    clock.publish(cycle(5))
    await steps_taken()
    await steps_taken()
    assert decided.empty()
    stop.set_result(None)
    await asyncio.wait_for(task, timeout=10)


async def test_a_workload_busy_while_it_changed_decides_on_the_newest_cycle(
    stop: asyncio.Future[None],
) -> None:
    # cycle 2 moved its readings, cycle 3 (compared with 2) did not: both came while it was
    # still deciding on cycle 1
    clock = CycleClock(Fetches(), period_seconds=3600, decide_every=10)
    clock.publish(cycle(1))
    cycles = clock.cycles(until=stop, changed=lambda c: c.snapshot.time == 2.0)
    assert (await anext(cycles)).snapshot.time == 1.0
    clock.publish(cycle(2))
    clock.publish(cycle(3))
    assert (await asyncio.wait_for(anext(cycles), timeout=10)).snapshot.time == 3.0


async def test_a_cycle_says_how_many_workloads_decide_on_it(stop: asyncio.Future[None]) -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    with clock.listening(), clock.listening():
        clock.publish(cycle(1))
        assert (await anext(clock.cycles(until=stop))).workloads == 2


async def test_a_busy_listener_skips_to_the_newest_cycle(stop: asyncio.Future[None]) -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    clock.publish(cycle(1))
    cycles = clock.cycles(until=stop)
    assert (await anext(cycles)).snapshot.time == 1.0
    clock.publish(cycle(2))  # while the listener is still busy with cycle 1
    clock.publish(cycle(3))
    assert (await anext(cycles)).snapshot.time == 3.0


async def test_a_newcomer_does_not_decide_on_a_cycle_older_than_a_period(
    stop: asyncio.Future[None],
) -> None:
    now = [1000.0]
    fetches = Fetches()
    clock = CycleClock(fetches, period_seconds=5, monotonic=lambda: now[0])
    clock.publish(cycle(0))
    now[0] += 60  # cycle 0 is a minute old (what a pause does)

    async def first_decision() -> Cycle:
        with clock.listening():
            return await anext(clock.cycles(until=stop))

    async with running(clock):
        got = await asyncio.wait_for(first_decision(), timeout=10)
    assert got.snapshot.time == 1.0  # the clock's first fetch, not the old cycle


async def test_a_newcomer_decides_at_once_on_a_fresh_cycle(stop: asyncio.Future[None]) -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    clock.publish(cycle(1))
    assert (await anext(clock.cycles(until=stop))).snapshot.time == 1.0


async def test_a_cycle_is_freed_once_a_newer_one_is_out(stop: asyncio.Future[None]) -> None:
    # at 5,000 workloads a snapshot is megabytes; workloads waiting for their turn, or for the
    # next cycle, each kept the one they had last seen: seven alive in a first round at 1,000
    clock = CycleClock(Fetches(), period_seconds=3600)
    clock.publish(cycle(1))
    decided, waiting = clock.cycles(until=stop), clock.cycles(until=stop)
    first = asyncio.create_task(anext(decided))
    second = asyncio.create_task(anext(waiting))
    await steps_taken()  # the first decides on cycle 1, the second waits its turn
    assert first.done() and not second.done()
    cycle_1 = weakref.ref(first.result())
    del first
    clock.publish(cycle(2))
    gc.collect()  # neither the listener that decided nor the one waiting may keep cycle 1
    assert cycle_1() is None
    next_for_decided = asyncio.create_task(anext(decided))  # back for the next one
    assert (await asyncio.wait_for(second, timeout=10)).snapshot.time == 2.0
    assert (await asyncio.wait_for(next_for_decided, timeout=10)).snapshot.time == 2.0


async def test_listening_ends_when_told_to_stop(stop: asyncio.Future[None]) -> None:
    async def stop_and_hang() -> Cycle:  # the listener is waiting for a cycle by now
        stop.set_result(None)
        return await asyncio.get_running_loop().create_future()

    clock = CycleClock(stop_and_hang, period_seconds=3600)

    async def listen() -> Cycle:
        with clock.listening():
            return await anext(clock.cycles(until=stop))

    async with running(clock):
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(listen(), timeout=10)


async def test_a_fetch_that_raises_keeps_the_beat(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    async def flaky() -> Cycle:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        return cycle(calls)

    clock = CycleClock(flaky, period_seconds=0.01)
    running = asyncio.create_task(clock.run())
    try:
        with clock.listening():
            stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            got = await asyncio.wait_for(anext(clock.cycles(until=stop)), timeout=10)
        assert got.snapshot.time == 2.0
        assert "fetching the cycle's metrics failed" in caplog.text
    finally:
        running.cancel()


def hold_the_loop(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_decisions_take_turns_with_the_rest_of_the_loop(
    stop: asyncio.Future[None],
) -> None:
    # 100 workloads whose decisions never wait, 2 ms each: 200 ms of one loop pass unpaced
    clock = CycleClock(Fetches(), period_seconds=3600)
    decided: list[int] = []
    all_decided = asyncio.Event()
    loop = asyncio.get_running_loop()
    passes_while_deciding = 0

    def other_work() -> None:  # a watch event, the event poster, the next snapshot: a pass each
        nonlocal passes_while_deciding
        if not all_decided.is_set():
            passes_while_deciding += 1
            loop.call_soon(other_work)

    async def listen(number: int) -> None:
        with clock.listening():
            async for _ in clock.cycles(until=stop):
                if not decided:
                    other_work()
                hold_the_loop(0.002)  # a decision's CPU
                decided.append(number)
                if len(decided) == 100:
                    all_decided.set()

    await decide_until(clock, listen, 100, all_decided, stop)
    # a pass per decision; unpaced it would be one pass in all
    assert passes_while_deciding >= 99
    assert sorted(decided) == list(range(100))


async def test_a_workload_stopped_or_cancelled_while_waiting_for_its_turn_does_not_decide() -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    decided: list[str] = []
    loop = asyncio.get_running_loop()
    stops = {name: loop.create_future() for name in "abc"}

    def stop_b_and_cancel_c() -> None:
        stops["b"].set_result(None)
        tasks["c"].cancel()  # kopf's last resort

    async def listen(name: str) -> None:
        with clock.listening():
            async for _ in clock.cycles(until=stops[name]):
                decided.append(name)
                stops[name].set_result(None)  # one decision each is enough here
                # b and c queue behind a in this pass; the turn is handed to b at the start
                # of the next, and b resumes in the one after: stop it and c in between
                loop.call_soon(stop_b_and_cancel_c)

    tasks = {name: asyncio.create_task(listen(name)) for name in "abc"}
    async with running(clock):
        await asyncio.wait_for(asyncio.gather(tasks["a"], tasks["b"]), timeout=10)
    assert decided == ["a"]
    assert tasks["c"].cancelled()
    # the turn is not left with b or c
    await asyncio.wait_for(clock._turn(urgent=lambda _: False), timeout=10)


async def test_urgent_workloads_take_their_turns_ahead_of_the_rest(
    stop: asyncio.Future[None],
) -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    decided: list[int] = []
    all_decided = asyncio.Event()

    async def listen(number: int) -> None:
        with clock.listening():
            async for _ in clock.cycles(until=stop, urgent=lambda _: number % 10 == 9):
                decided.append(number)
                if len(decided) == 30:
                    all_decided.set()

    await decide_until(clock, listen, 30, all_decided, stop)
    # the first awake takes the free turn; the urgent three queue ahead of the 26 others
    assert decided[1:4] == [9, 19, 29]
    assert sorted(decided) == list(range(30))


async def test_a_workload_still_waiting_moves_up_when_a_new_cycle_is_urgent_to_it(
    stop: asyncio.Future[None],
) -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    decided: list[tuple[int, float]] = []
    all_decided = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def listen(number: int) -> None:
        def urgent(cycle: Cycle) -> bool:
            return number == 29 and cycle.snapshot.time == 2.0

        with clock.listening():
            async for each in clock.cycles(until=stop, urgent=urgent):
                if not decided:  # cycle 2 comes in the next pass, once the others queued
                    loop.call_soon(clock.publish, cycle(2))
                decided.append((number, each.snapshot.time))
                if len(decided) == 30:
                    all_decided.set()

    await decide_until(clock, listen, 30, all_decided, stop)
    # 1 got the turn in the pass in which cycle 2 came; 29, queued last for cycle 1, is next
    assert [n for n, _ in decided[:3]] == [0, 1, 29]
    assert {t for _, t in decided[1:]} == {2.0}  # a workload decides on the newest cycle


async def test_a_cycle_names_the_pods_whose_readings_moved_since_the_last() -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    clock.publish(cycle_with({"steady": 50.0, "jumped": 20.0}))
    assert clock._latest is not None and clock._latest.moved == {("ns", "steady"), ("ns", "jumped")}
    clock.publish(cycle_with({"steady": 51.0, "jumped": 60.0}))
    assert clock._latest.moved == {("ns", "jumped")}


def nudged_listener(
    clock: CycleClock, stop: asyncio.Future[None], nudge: Nudge
) -> tuple[asyncio.Task[None], asyncio.Queue[float]]:
    """A workload listening with a nudge: the queue gets the time of each cycle it decides on."""
    decided: asyncio.Queue[float] = asyncio.Queue()

    async def listen() -> None:
        with clock.listening():
            async for each in clock.cycles(until=stop, nudge=nudge):
                decided.put_nowait(each.snapshot.time)

    return asyncio.create_task(listen()), decided


async def test_a_nudge_gives_a_turn_at_once_on_the_latest_cycle(stop: asyncio.Future[None]) -> None:
    """The activator's push: the workload decides again on the cycle it already decided on,
    without waiting for the next one (the period here is an hour)."""
    clock = CycleClock(Fetches(), period_seconds=3600)
    nudge = Nudge()
    task, decided = nudged_listener(clock, stop, nudge)
    clock.publish(cycle(1))
    assert await asyncio.wait_for(decided.get(), timeout=10) == 1.0
    await steps_taken()
    assert decided.empty()
    nudge()
    assert await asyncio.wait_for(decided.get(), timeout=10) == 1.0
    await steps_taken()
    assert decided.empty(), "one nudge, one turn"
    stop.set_result(None)
    await asyncio.wait_for(task, timeout=10)


async def test_a_nudge_before_a_turn_is_that_turn(stop: asyncio.Future[None]) -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    nudge = Nudge()
    nudge()
    task, decided = nudged_listener(clock, stop, nudge)
    clock.publish(cycle(1))
    assert await asyncio.wait_for(decided.get(), timeout=10) == 1.0
    for _ in range(3):
        await steps_taken()
    assert decided.empty(), "the turn on cycle 1 read what the nudge was for"
    stop.set_result(None)
    await asyncio.wait_for(task, timeout=10)
