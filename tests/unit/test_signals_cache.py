"""The shared per-period reads: one fetch per key and period, however many callers."""

from __future__ import annotations

import asyncio

import pytest
from gpusizer.signals.cache import PeriodicCache


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
