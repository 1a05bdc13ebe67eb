"""One WorkloadSizing's life in this process: wait for a cycle, take a turn, post its events,
write its status. The kopf daemon that runs it (handlers.py) only starts and stops it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from gpusizer.api.annotations import HELD_PREFIX
from gpusizer.api.v1alpha1 import Routing
from gpusizer.clock import Cycle, CycleClock, Nudge
from gpusizer.cluster import ClusterView, WorkloadObject
from gpusizer.memory import Memory
from gpusizer.ports import StatusSink
from gpusizer.reconcile import Services, reconcile
from gpusizer.report import metrics
from gpusizer.report.status import StatusOverlay
from gpusizer.report.turn import Outcome
from gpusizer.report.writer import StatusNotWritten, WorkloadGone
from gpusizer.signals.parse import PodKey


class Departures:
    """WorkloadSizings deleted while their daemons run. kopf stops a daemon before its object
    goes only through a finalizer, which WorkloadSizings do not carry (handlers.py): their
    DELETED event ends their turns instead."""

    # deleted before their daemon first ran (created and deleted at once): remembered, the
    # latest few, so that the daemon does not take a turn on a deleted object
    EARLY_DEPARTURES = 1000

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[None]] = {}
        self._early: dict[str, None] = {}

    def watch(self, uid: str) -> asyncio.Future[None]:
        """Done when the object with this uid is deleted."""
        gone = self._waiting.get(uid)
        if gone is None:
            gone = self._waiting[uid] = asyncio.get_running_loop().create_future()
            if uid in self._early:
                del self._early[uid]
                gone.set_result(None)
        return gone

    def departed(self, uid: str) -> None:
        gone = self._waiting.pop(uid, None)
        if gone is None:
            self._early[uid] = None
            if len(self._early) > self.EARLY_DEPARTURES:
                del self._early[next(iter(self._early))]
        elif not gone.done():
            gone.set_result(None)

    def release(self, uid: str, gone: asyncio.Future[None]) -> None:
        """The daemon that watched with `gone` stopped for another reason (paused behind a
        peer, exiting)."""
        if self._waiting.get(uid) is gone:
            del self._waiting[uid]


@dataclass
class Workload:
    """One WorkloadSizing as its daemon sees it: the body kopf keeps current from the watch,
    and the status this process wrote since."""

    namespace: str
    name: str
    body: kopf.Body
    logger: kopf.Logger
    status: StatusOverlay = field(default_factory=StatusOverlay)
    pods: tuple[PodKey, ...] = ()  # the ones its last decision read
    generation: int | None = None  # of the spec its last decision read
    nudge: Nudge = field(default_factory=Nudge)
    held: dict[str, str] = field(default_factory=dict)  # the activator's records last seen

    def activator_pushed(self, annotations: Mapping[str, str]) -> None:
        """A turn at once when an activator replica's record changed: it holds requests for
        this workload (the wake must not wait for a cycle), or no longer does."""
        records = {k: v for k, v in annotations.items() if k.startswith(HELD_PREFIX)}
        if records != self.held:
            self.held = records
            self.nudge()

    def routed_to_activator(self) -> bool:
        """Its Service's traffic goes to the activator, as its last status says."""
        activator = self.status.current(self.body.status).get("activator") or {}
        return bool(activator.get("routing") == Routing.ACTIVATOR.value)

    @property
    def key(self) -> tuple[str, str]:
        """What `CycleClock.touch` names it by when an event of its object comes."""
        return self.namespace, self.name

    def urgent(self, cycle: Cycle) -> bool:
        """Decided ahead of the others in `cycle`: one of its pods' readings moved, or it has
        none the shared snapshot shows (not decided yet, or scaled to zero and waiting on its
        own wake query)."""
        return not self.pods or self.moved(cycle)

    def moved(self, cycle: Cycle) -> bool:
        return not cycle.moved.isdisjoint(self.pods)

    def changed(self, cycle: Cycle) -> bool:
        """Decided on `cycle` even between sync periods: one of its pods' readings moved, or
        its spec changed since its last decision."""
        return self.moved(cycle) or self.body.meta.get("generation") != self.generation

    async def follow(
        self,
        clock: CycleClock,
        until: asyncio.Future[Any],
        view: ClusterView,
        services: Services,
        memory: Memory,
        writer: StatusSink,
    ) -> None:
        """Decides on every cycle until `until` is done, or the object is found gone. A cycle
        is let go once decided on, before the status is written: while thousands of workloads
        first start, their status writes queue for the worker threads, and each decision
        waiting for its own kept a cycle's snapshot alive (bench/README.md)."""
        with clock.listening():
            cycles = clock.cycles(
                until=until,
                urgent=self.urgent,
                changed=self.changed,
                pods=lambda: self.pods,
                key=self.key,
                nudge=self.nudge,
            )
            async for cycle in cycles:
                if not clock.in_charge():
                    continue  # a replica not in charge writes nothing, not even a status
                outcome = await self.decide(cycle, view, services, memory)
                del cycle  # nor kept while waiting for the next (CycleClock.cycles)
                if outcome is None:
                    continue
                try:
                    await self.report(outcome, writer)
                except WorkloadGone:
                    self.logger.info("deleted: it takes no more turns")
                    return

    async def decide(
        self, cycle: Cycle, view: ClusterView, services: Services, memory: Memory
    ) -> Outcome | None:
        """The turn on `cycle`, scale writes included; None when it failed (logged)."""
        metrics.DECISION_LAG_SECONDS.observe(time.time() - cycle.snapshot.time)
        started = time.monotonic()
        self.generation = self.body.meta.get("generation")
        obj = WorkloadObject(
            namespace=self.namespace,
            name=self.name,
            spec=dict(self.body.spec),
            status=self.status.current(self.body.status),
            annotations=dict(self.body.meta.annotations),
            generation=self.generation,
            uid=str(self.body.meta.uid or ""),
        )
        try:
            outcome = await reconcile(obj, view, cycle, services, memory, time.time())
        except Exception:  # a bug: say so under the object's name, and decide again next cycle
            metrics.WORKLOADS.reconcile_failed(self.namespace, self.name)
            self.logger.exception("sizing failed; it is tried again within a sync period")
            return None
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
        self.pods = outcome.pods
        return outcome

    async def report(self, outcome: Outcome, writer: StatusSink) -> None:
        """The decision's events, then its status."""
        for event in outcome.events:
            kopf.event(self.body, type=event.type, reason=event.reason.value, message=event.message)
            # the same line in the operator's log, under the object's name, for whoever reads
            # logs rather than Events (Events expire after an hour)
            self.logger.log(
                logging.WARNING if event.type == "Warning" else logging.INFO,
                "%s: %s",
                event.reason.value,
                event.message,
            )
            metrics.KUBE_API_REQUESTS.labels(verb="POST").inc()  # kopf posts it
        if outcome.status_patch:
            await self._write(outcome.status_patch, writer)

    async def _write(self, patch: Mapping[str, Any], writer: StatusSink) -> None:
        outgoing = self.status.outgoing(patch)
        try:
            written = await writer.write(self.namespace, self.name, outgoing)
        except WorkloadGone:
            raise
        except StatusNotWritten as exc:
            self.status.failed(outgoing)
            self.logger.warning(
                "writing the status failed; it goes out with the next cycle's: %s", exc
            )
            return
        self.status.wrote(written)
        for status_field in outgoing:
            metrics.STATUS_WRITES.labels(field=status_field).inc()
