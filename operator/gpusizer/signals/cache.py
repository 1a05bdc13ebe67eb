"""Reads shared by every workload of a period: the first caller fetches, the rest reuse it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

log = logging.getLogger(__name__)


class PeriodicCache(Generic[K, V]):
    """Single-flight per key, reused for `fresh_seconds`: this is what keeps Prometheus
    queries and list calls per period constant, whatever the number of workloads.

    With `serve_stale`, a reading past its period is still returned while its refresh runs,
    and only a key never read waits for its fetch. A window read over every pod took seconds
    at thousands of workloads, and every turn that came during it waited for it
    (bench/README.md, "the turns that waited").

    `fresh_seconds` is one period for every key, or each key's own."""

    def __init__(
        self,
        fetch: Callable[[K], Awaitable[V]],
        fresh_seconds: float | Callable[[K], float],
        clock: Callable[[], float] = time.monotonic,
        serve_stale: bool = False,
        what: str = "a shared reading",
    ) -> None:
        self._fetch = fetch
        if callable(fresh_seconds):
            self._fresh: Callable[[K], float] = fresh_seconds
        else:
            period = fresh_seconds
            self._fresh = lambda _: period
        self._clock = clock
        self._serve_stale = serve_stale
        self._what = what  # for the log line of a refresh that failed
        self._latest: dict[K, tuple[float, V]] = {}
        self._inflight: dict[K, asyncio.Task[V]] = {}

    async def get(self, key: K) -> V:
        cached = self._latest.get(key)
        if cached is not None and self._clock() - cached[0] < self._fresh(key):
            return cached[1]
        task = self._inflight.get(key)
        if task is None:
            task = self._inflight[key] = asyncio.ensure_future(self._fetch(key))
            task.add_done_callback(lambda done: self._landed(key, done))
        if cached is not None and self._serve_stale:
            return cached[1]
        return await asyncio.shield(task)

    def _landed(self, key: K, task: asyncio.Task[V]) -> None:
        """Keeps what a fetch returned; a fetch that failed is fetched again by the next get.
        Runs before any caller awaiting the fetch resumes."""
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if task.cancelled():
            return
        failure = task.exception()
        if failure is None:
            self._latest[key] = (self._clock(), task.result())
        elif self._serve_stale and key in self._latest:  # no caller hears of it: say it here
            log.error(
                "refreshing %s (%r) failed; the reading from before goes on being used",
                self._what,
                key,
                exc_info=failure,
            )
