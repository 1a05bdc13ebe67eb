"""Reads shared by every workload of a period: the first caller fetches, the rest reuse it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class PeriodicCache(Generic[K, V]):
    """Single-flight per key, reused for `fresh_seconds`: this is what keeps Prometheus
    queries and list calls per period constant, whatever the number of workloads."""

    def __init__(
        self,
        fetch: Callable[[K], Awaitable[V]],
        fresh_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._fresh = fresh_seconds
        self._clock = clock
        self._latest: dict[K, tuple[float, V]] = {}
        self._inflight: dict[K, asyncio.Task[V]] = {}

    async def get(self, key: K) -> V:
        cached = self._latest.get(key)
        if cached is not None and self._clock() - cached[0] < self._fresh:
            return cached[1]
        task = self._inflight.get(key)
        if task is None:
            task = self._inflight[key] = asyncio.ensure_future(self._fetch(key))
        try:
            value = await asyncio.shield(task)
        finally:
            if self._inflight.get(key) is task and task.done():
                del self._inflight[key]
        self._latest[key] = (self._clock(), value)
        return value
