"""One WorkloadSizing in this process: what its turn reads, the turn itself, its events and its
status. The fleet (fleet.py) says when it takes a turn; its object's events keep it current."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from gpusizer.api.annotations import HELD_PREFIX
from gpusizer.api.v1alpha1 import Routing, TargetRef
from gpusizer.clock import Cycle
from gpusizer.cluster import ClusterView, WorkloadObject
from gpusizer.memory import Memory
from gpusizer.ports import StatusSink
from gpusizer.reconcile import Services, reconcile
from gpusizer.report import metrics
from gpusizer.report.status import StatusOverlay
from gpusizer.report.turn import Outcome
from gpusizer.report.writer import StatusNotWritten, WorkloadGone
from gpusizer.signals.autoscalers import TargetKey
from gpusizer.signals.parse import PodKey
from gpusizer.signals.queries import KV_CACHE

DEFAULT_TARGET_KIND = TargetRef.model_fields["kind"].default  # as the CRD defaults it
KV_CACHE_READ, NO_READS = frozenset({KV_CACHE}), frozenset[str]()


@dataclass(slots=True)
class Workload:
    """One WorkloadSizing as the fleet decides it: the body of its latest event, and the
    status this process wrote since.

    The body is a plain dict, never kopf's Body: that is a cycle (the body and its views of
    metadata, spec and status), and one kept from an event to the next outlives the young
    collections, so once let go it waited with every dict it held for a full collection. At
    10,000 workloads that was hundreds of MiB (bench/README.md, "Issue 29: what the bursts
    leave resident")."""

    namespace: str
    name: str
    body: dict[str, Any]
    logger: kopf.Logger
    status: StatusOverlay = field(default_factory=StatusOverlay)
    pods: tuple[PodKey, ...] = ()  # the ones its last decision read
    generation: int | None = None  # of the spec its last decision read
    held: dict[str, str] = field(default_factory=dict)  # the activator's records last seen
    quiet: bool = False  # what its last decision found: see fleet.Member.quiet
    unchanged_until: float | None = None  # see fleet.Member.saw_unchanged

    def activator_pushed(self, annotations: Mapping[str, str]) -> bool:
        """Whether an activator replica's record changed: it holds requests for this workload
        (the wake must not wait for a cycle), or no longer does. A turn at once if so."""
        records = {k: v for k, v in annotations.items() if k.startswith(HELD_PREFIX)}
        if records == self.held:
            return False
        self.held = records
        return True

    def routed_to_activator(self) -> bool:
        """Its Service's traffic goes to the activator, as its last status says."""
        activator = self.status.current(self._part("status")).get("activator") or {}
        return bool(activator.get("routing") == Routing.ACTIVATOR.value)

    def _part(self, name: str) -> Mapping[str, Any]:
        return self.body.get(name) or {}

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def uid(self) -> str:
        return str(self._part("metadata").get("uid") or "")

    @property
    def target(self) -> TargetKey | None:
        ref = self._part("spec").get("targetRef") or {}
        kind, name = ref.get("kind", DEFAULT_TARGET_KIND), ref.get("name")
        return (
            (self.namespace, kind, name)
            if isinstance(kind, str) and isinstance(name, str)
            else None
        )

    @property
    def optional_reads(self) -> frozenset[str]:
        replicas = self._part("spec").get("replicas")
        wanted = isinstance(replicas, dict) and replicas.get("targetKVCacheUsage") is not None
        return KV_CACHE_READ if wanted else NO_READS

    def saw_unchanged(self, until: float) -> None:
        self.unchanged_until = until

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
        return self.moved(cycle) or self._part("metadata").get("generation") != self.generation

    async def decide(
        self, cycle: Cycle, view: ClusterView, services: Services, memory: Memory
    ) -> Outcome | None:
        """The turn on `cycle`, scale writes included; None when it failed (logged)."""
        metrics.DECISION_LAG_SECONDS.observe(time.time() - cycle.snapshot.time)
        started = time.monotonic()
        meta = self._part("metadata")
        self.generation = meta.get("generation")
        obj = WorkloadObject(
            namespace=self.namespace,
            name=self.name,
            spec=dict(self._part("spec")),
            status=self.status.current(self._part("status")),
            annotations=dict(meta.get("annotations") or {}),
            generation=self.generation,
            uid=self.uid,
        )
        unchanged_until, self.unchanged_until, self.quiet = self.unchanged_until, None, False
        try:
            outcome = await reconcile(
                obj, view, cycle, services, memory, time.time(), unchanged_until
            )
        except Exception:  # a bug: say so under the object's name, and decide again next cycle
            metrics.WORKLOADS.reconcile_failed(self.namespace, self.name)
            self.logger.exception("sizing failed; it is tried again within a sync period")
            return None
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
        self.pods, self.quiet = outcome.pods, outcome.quiet
        return outcome

    async def report(self, outcome: Outcome, writer: StatusSink) -> None:
        """The decision's events, then its status."""
        for event in outcome.events:
            kopf.event(
                kopf.Body(cast(kopf.RawBody, self.body)),
                type=event.type,
                reason=event.reason.value,
                message=event.message,
            )
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


@dataclass(frozen=True)
class Turns:
    """What every workload's turn reads and writes through (fleet.Fleet.run)."""

    view: ClusterView
    services: Services
    memory: Memory
    writer: StatusSink

    async def decide(self, workload: Workload, cycle: Cycle) -> Outcome | None:
        return await workload.decide(cycle, self.view, self.services, self.memory)

    async def report(self, workload: Workload, outcome: Outcome) -> None:
        await workload.report(outcome, self.writer)
