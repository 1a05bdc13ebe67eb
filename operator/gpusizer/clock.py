"""The cycle clock: one read of every workload's signals per read period, handed to the
fleet the moment it arrives, each workload it concerns deciding in its turn.

A read is shared: the batched Prometheus snapshot and the list of other autoscalers cost the
same whatever the number of workloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace

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
    other autoscalers, for every workload. The list (two API calls, once per sync period) is
    taken while the snapshot is read: after it, it stood between the read and the turns of
    the workloads whose pods moved."""
    snapshot, (owners, error) = await asyncio.gather(
        _read(reader, health), _other_autoscalers(list_autoscalers)
    )
    return Cycle(
        snapshot=snapshot,
        autoscalers=owners,
        error=error,
        # read after the awaits: a replica that took over meanwhile knows its predecessor's
        # outages too (startup.Runtime.took_over)
        prometheus=health.state,
        error_since=listing.observe(error is not None, time.time()),
    )


async def _read(reader: SnapshotReader, health: PrometheusHealth) -> Snapshot:
    started = time.monotonic()
    snapshot = await reader.read()
    health.observe(snapshot)
    metrics.CYCLE_SECONDS.labels(read="full" if snapshot.full else "moved").observe(
        time.monotonic() - started
    )
    return snapshot


async def _other_autoscalers(
    list_autoscalers: Callable[[], Awaitable[Mapping[TargetKey, str]]],
) -> tuple[Mapping[TargetKey, str], str | None]:
    try:
        return await list_autoscalers(), None
    except Exception as exc:  # the API server is down or refusing: say so, act on nothing
        log.warning("listing HPAs and ScaledObjects failed: %s", exc)
        return {}, f"listing HPAs and ScaledObjects failed: {exc}"


class CycleClock:
    """One read of every workload's signals per read period, handed to the fleet
    (`on_cycle`) the moment it arrives: the workloads it concerns take their turns on it
    (fleet.py). Nothing is fetched while no workload listens or this replica is not in
    charge."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[Cycle]],
        period_seconds: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        # whether this replica acts now: always alone, else while it holds the operator's
        # Lease (startup.lead); a turn while it does not is skipped (fleet.Fleet.run)
        self.in_charge: Callable[[], bool] = lambda: True
        self.on_cycle: Callable[[Cycle], None] = lambda _: None
        self._period = period_seconds
        self._monotonic = monotonic  # for a cycle's age
        self._listeners = 0
        self.number = 0  # of the latest cycle
        self.latest: Cycle | None = None
        self._published_at = 0.0
        self._wanted = asyncio.Event()

    @property
    def listeners(self) -> int:
        """How many workloads decide on the next cycle."""
        return self._listeners

    @listeners.setter
    def listeners(self, count: int) -> None:
        self._listeners = count
        if count:
            self._wanted.set()

    async def run(self) -> None:
        """Fetch at every period while a workload listens and this replica is in charge;
        runs until cancelled. A standby reads nothing: its peer does, and hands the outages of
        Prometheus it saw over with the Lease (startup.Runtime.took_over)."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._listeners or not self.in_charge():
                self._wanted.clear()
                # in charge is asked again every period; a listener or `wake` comes at once
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wanted.wait(), self._period)
                continue
            started = loop.time()
            try:
                self.publish(await self._fetch())
            except Exception:  # a bug, not an outage (fetch reports those): keep the beat
                log.exception("fetching the cycle's metrics failed")
            # the beat itself: the next period starts one period after this one did
            await asyncio.sleep(max(0.0, self._period - (loop.time() - started)))

    def publish(self, cycle: Cycle) -> None:
        before = self.latest.snapshot if self.latest is not None else None
        self.latest = replace(
            cycle, workloads=self._listeners, moved=moved_pods(before, cycle.snapshot)
        )
        self._published_at = self._monotonic()
        self.number += 1
        self.on_cycle(self.latest)

    def wake(self) -> None:
        """Fetch now if it waits: this replica just came into charge."""
        self._wanted.set()

    def restate(self, prometheus: PrometheusState) -> None:
        """The latest cycle, as it reads with what is now known of Prometheus: a replica that
        takes over learns its predecessor's outages after the cycle was read, and the turns it
        then gives every workload at once are on that cycle (startup.Runtime.took_over)."""
        if self.latest is not None:
            self.latest = replace(self.latest, prometheus=prometheus)

    def fresh(self) -> bool:
        """The latest cycle is at most a period old."""
        return self.latest is not None and self._monotonic() - self._published_at <= self._period
