"""The shared per-period reads: one fetch per key and period, however many callers."""

from __future__ import annotations

import asyncio

import pytest
from gpusizer.signals.cache import PeriodicCache

from tests.fakes import steps_taken


async def test_concurrent_callers_share_one_fetch_until_it_goes_stale() -> None:
    clock = [0.0]
    calls: list[str] = []
    release = asyncio.Event()
    last_caller_in = asyncio.Event()

    async def fetch(key: str) -> str:
        calls.append(key)
        if key == "b":  # created last: every "a" caller has reached the cache before it
            last_caller_in.set()
        await release.wait()
        return f"{key}@{clock[0]}"

    cache: PeriodicCache[str, str] = PeriodicCache(fetch, 10.0, clock=lambda: clock[0])
    waiting = [asyncio.create_task(cache.get("a")) for _ in range(50)]
    other = asyncio.create_task(cache.get("b"))
    await last_caller_in.wait()
    release.set()
    assert {await t for t in waiting} == {"a@0.0"} and await other == "b@0.0"
    assert calls == ["a", "b"]

    clock[0] = 9.0
    assert await cache.get("a") == "a@0.0" and calls == ["a", "b"]
    clock[0] = 10.5
    assert await cache.get("a") == "a@10.5" and calls == ["a", "b", "a"]


async def test_a_failed_fetch_is_not_cached() -> None:
    attempts = 0

    async def fetch(key: None) -> int:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise RuntimeError("prometheus went away")
        return attempts

    cache: PeriodicCache[None, int] = PeriodicCache(fetch, 10.0, clock=lambda: 0.0)
    with pytest.raises(RuntimeError):
        await cache.get(None)
    assert await cache.get(None) == 2


async def serves(cache: PeriodicCache[None, str], reading: str) -> None:
    """Returns once `cache` serves `reading`: its refresh has landed. Fails, rather than
    hangs, if it never does."""
    async with asyncio.timeout(5):
        while await cache.get(None) != reading:
            await steps_taken()


async def test_a_stale_reading_is_served_while_its_refresh_runs() -> None:
    clock = [0.0]
    calls = 0
    release = asyncio.Event()

    async def fetch(key: None) -> str:
        nonlocal calls
        calls += 1
        if calls > 1:
            await release.wait()
        return f"read at {clock[0]}"

    cache: PeriodicCache[None, str] = PeriodicCache(
        fetch, 10.0, clock=lambda: clock[0], serve_stale=True
    )
    assert await cache.get(None) == "read at 0.0"  # the first reading is waited for
    clock[0] = 12.0
    served = [asyncio.create_task(cache.get(None)) for _ in range(20)]
    await steps_taken()  # every get has run; the refresh blocks
    assert all(t.done() for t in served)
    assert {t.result() for t in served} == {"read at 0.0"}
    release.set()
    await serves(cache, "read at 12.0")
    assert calls == 2


async def test_a_refresh_that_fails_keeps_the_reading_says_so_and_is_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [0.0]
    outcomes: list[str | None] = ["first", None, "third"]  # None: the fetch raises

    async def fetch(key: None) -> str:
        outcome = outcomes.pop(0)
        if outcome is None:
            raise RuntimeError("prometheus went away")
        return outcome

    cache: PeriodicCache[None, str] = PeriodicCache(
        fetch, 10.0, clock=lambda: clock[0], serve_stale=True, what="the ledger"
    )
    assert await cache.get(None) == "first"
    clock[0] = 11.0
    assert await cache.get(None) == "first"  # starts the refresh that fails
    async with asyncio.timeout(5):
        while not caplog.records:
            await steps_taken()
    assert "refreshing the ledger" in caplog.text and "prometheus went away" in caplog.text
    assert await cache.get(None) == "first"  # starts the next refresh
    await serves(cache, "third")
    assert not outcomes


async def test_without_serve_stale_a_caller_past_the_period_waits_for_the_refresh() -> None:
    clock = [0.0]
    release = asyncio.Event()
    reads = iter(["old", "new"])

    async def fetch(key: None) -> str:
        value = next(reads)
        if value == "new":
            await release.wait()
        return value

    cache: PeriodicCache[None, str] = PeriodicCache(fetch, 10.0, clock=lambda: clock[0])
    assert await cache.get(None) == "old"
    clock[0] = 11.0
    waiting = asyncio.create_task(cache.get(None))
    await steps_taken()
    assert not waiting.done()
    release.set()
    assert await waiting == "new"


async def test_each_key_goes_stale_after_its_own_period() -> None:
    clock = [0.0]
    calls: list[int] = []

    async def fetch(key: int) -> str:
        calls.append(key)
        return f"{key}@{clock[0]}"

    cache: PeriodicCache[int, str] = PeriodicCache(fetch, lambda key: key, clock=lambda: clock[0])
    assert await cache.get(10) == "10@0.0" and await cache.get(30) == "30@0.0"
    clock[0] = 20.0
    assert await cache.get(10) == "10@20.0"
    assert await cache.get(30) == "30@0.0"
    clock[0] = 31.0
    assert await cache.get(30) == "30@31.0"
    assert calls == [10, 30, 10, 30]
