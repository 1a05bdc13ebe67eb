"""The cycle clock: one fetch per period, handed to every listening workload at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from gpusizer.reconcile import Cycle, CycleClock
from gpusizer.signals.source import Snapshot


class Fetches:
    """A fetch that counts, each cycle's snapshot stamped with its number."""

    def __init__(self) -> None:
        self.count = 0
        self.done = asyncio.Event()

    async def __call__(self) -> Cycle:
        self.count += 1
        self.done.set()
        return Cycle(snapshot=Snapshot(time=float(self.count)), autoscalers={})


def cycle(number: int) -> Cycle:
    return Cycle(snapshot=Snapshot(time=float(number)), autoscalers={})


@pytest.fixture
async def stop() -> AsyncIterator[asyncio.Future[None]]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    yield future
    if not future.done():
        future.set_result(None)


async def test_nothing_is_fetched_until_a_workload_listens_then_at_once() -> None:
    fetches = Fetches()
    clock = CycleClock(fetches, period_seconds=3600)
    running = asyncio.create_task(clock.run())
    try:
        for _ in range(20):  # the clock gets every chance to fetch, and must not
            await asyncio.sleep(0)
        assert fetches.count == 0
        with clock.listening():
            # the first listener does not wait out the hour-long period
            await asyncio.wait_for(fetches.done.wait(), timeout=10)
        assert fetches.count == 1
    finally:
        running.cancel()


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
    clock = CycleClock(Fetches(), period_seconds=0.01)
    clock.publish(cycle(1))
    await asyncio.sleep(0.05)  # cycle 1 ages past a period (what a pause does)
    cycles = clock.cycles(until=stop)
    first = asyncio.create_task(anext(cycles))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not first.done()
    clock.publish(cycle(2))
    assert (await asyncio.wait_for(first, timeout=10)).snapshot.time == 2.0


async def test_a_newcomer_decides_at_once_on_a_fresh_cycle(stop: asyncio.Future[None]) -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    clock.publish(cycle(1))
    assert (await anext(clock.cycles(until=stop))).snapshot.time == 1.0


async def test_listening_ends_when_told_to_stop(stop: asyncio.Future[None]) -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    waiting = asyncio.create_task(anext(clock.cycles(until=stop)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done()
    stop.set_result(None)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, timeout=10)


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
    decided: asyncio.Queue[int] = asyncio.Queue()
    passes_while_deciding = 0

    async def listen(number: int) -> None:
        async for _ in clock.cycles(until=stop):
            hold_the_loop(0.002)  # a decision's CPU
            decided.put_nowait(number)

    async def other_work() -> None:  # a watch event, the event poster, the next snapshot
        nonlocal passes_while_deciding
        while decided.qsize() < 100:
            passes_while_deciding += 1
            await asyncio.sleep(0)

    listeners = [asyncio.create_task(listen(n)) for n in range(100)]
    for _ in range(5):
        await asyncio.sleep(0)  # every listener is waiting for a cycle
    clock.publish(cycle(1))
    await asyncio.wait_for(other_work(), timeout=30)
    # a pass per decision; unpaced it would be one pass in all
    assert passes_while_deciding >= 100
    assert sorted([decided.get_nowait() for _ in range(100)]) == list(range(100))
    stop.set_result(None)
    await asyncio.wait_for(asyncio.gather(*listeners), timeout=10)


async def test_a_workload_stopped_or_cancelled_while_waiting_for_its_turn_does_not_decide() -> None:
    clock = CycleClock(Fetches(), period_seconds=3600)
    decided: list[str] = []
    stops = {name: asyncio.get_running_loop().create_future() for name in "abc"}

    async def listen(name: str) -> None:
        async for _ in clock.cycles(until=stops[name]):
            decided.append(name)
            stops[name].set_result(None)  # one decision each is enough here

    tasks = {name: asyncio.create_task(listen(name)) for name in "abc"}
    for _ in range(5):
        await asyncio.sleep(0)  # all three wait for a cycle
    await clock._turn()  # the test holds this pass's turn: a, b and c will queue behind it
    clock.publish(cycle(1))
    for _ in range(3):
        await asyncio.sleep(0)
    stops["b"].set_result(None)  # stopped while it waits for its turn
    tasks["c"].cancel()  # cancelled while it waits (kopf's last resort)
    await asyncio.wait_for(asyncio.gather(tasks["a"], tasks["b"]), timeout=10)
    assert decided == ["a"]
    assert tasks["c"].cancelled()
    # the turn is not left with b or c
    await asyncio.wait_for(clock._turn(), timeout=10)
