"""The push to the operator: each activator replica says on the WorkloadSizing how many
requests it holds for it, in an annotation of its own (gpusizer.api.annotations).

At once when the first request arrives (the wake) or the last one leaves (the route can come
out), at most once a second in between, and every HELD_REFRESH_SECONDS while any are held: a
replica that stops rewriting is gone, and the operator stops counting its requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from gpusizer.api.annotations import HELD_REFRESH_SECONDS, HeldRecord, held_key
from gpusizer.timefmt import iso_millis

log = logging.getLogger(__name__)

WorkloadKey = tuple[str, str]
# merge-patches a WorkloadSizing's annotations (None deletes one); raises Gone when it is
Patch = Callable[[str, str, dict[str, str | None]], Awaitable[None]]
MIN_INTERVAL_SECONDS = 1.0  # between two writes of one count that only moved
RETRY_SECONDS = 1.0


class Gone(Exception):
    """The WorkloadSizing does not exist (any more)."""


@dataclass
class _State:
    pending: int = 0
    since: float | None = None
    sent: int = 0  # the count the annotation says
    sent_at: float = 0.0
    task: asyncio.Task[None] | None = None


class Pusher:
    def __init__(
        self,
        replica: str,
        patch: Patch,
        clock: Callable[[], float] = time.time,
        min_interval: float = MIN_INTERVAL_SECONDS,
        refresh: float = HELD_REFRESH_SECONDS,
    ) -> None:
        self.key = held_key(replica)
        self._patch = patch
        self._clock = clock
        self._min_interval = min_interval
        self._refresh = refresh
        self._states: dict[WorkloadKey, _State] = {}
        self._news: dict[WorkloadKey, asyncio.Event] = {}
        self._swept: set[tuple[WorkloadKey, str]] = set()
        self._sweeps: set[asyncio.Task[bool]] = set()  # kept until done (the loop keeps none)

    def held(self, workload: WorkloadKey, pending: int, since: float | None) -> None:
        """What this replica holds for `workload` now; the writes follow on their own."""
        state = self._states.setdefault(workload, _State())
        state.pending, state.since = pending, since
        self._news.setdefault(workload, asyncio.Event()).set()
        if state.task is None or state.task.done():
            state.task = asyncio.create_task(self._follow(workload, state))

    def sweep(self, workload: WorkloadKey, stale: Iterable[str]) -> None:
        """Removes the records of replicas that stopped rewriting theirs (killed, gone): no
        one else would, and each replica that ever held a request left one."""
        keys = [k for k in stale if k != self.key and (workload, k) not in self._swept]
        if keys:
            self._swept.update((workload, k) for k in keys)
            task = asyncio.create_task(self._send(workload, dict.fromkeys(keys)))
            self._sweeps.add(task)
            task.add_done_callback(self._sweeps.discard)

    async def _follow(self, workload: WorkloadKey, state: _State) -> None:
        news = self._news[workload]
        while state.pending or state.sent:
            news.clear()
            now = self._clock()
            edge = bool(state.pending) != bool(state.sent)
            if edge:
                due = now
            elif state.pending != state.sent:
                due = state.sent_at + self._min_interval
            else:
                due = state.sent_at + self._refresh
            if due > now:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(due - now):
                        await news.wait()  # news may make it due sooner
                if due > self._clock():
                    continue
            pending, since = state.pending, state.since
            value = None
            if pending:
                record = HeldRecord(
                    pending=pending, since=iso_millis(since or now), at=iso_millis(self._clock())
                )
                value = record.annotation()
            if await self._send(workload, {self.key: value}):
                state.sent, state.sent_at = pending, self._clock()
            else:
                await asyncio.sleep(RETRY_SECONDS)
        del self._states[workload]
        del self._news[workload]

    async def _send(self, workload: WorkloadKey, annotations: dict[str, str | None]) -> bool:
        namespace, name = workload
        try:
            await self._patch(namespace, name, annotations)
        except Gone:
            return True  # nothing to tell: its requests were answered when it went
        except Exception as exc:  # the API server down or refusing: tried again
            log.warning("telling %s/%s what this activator holds: %s", namespace, name, exc)
            return False
        return True

    async def clear(self) -> None:
        """At exit: this replica holds nothing any more."""
        held = [w for w, s in self._states.items() if s.sent]
        await asyncio.gather(*(self._send(w, {self.key: None}) for w in held))
