"""What the operator builds once at start-up from its settings: the ports, the shared reads,
the cycle clock and its own metrics server. The kopf handlers get all of it from here."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client as k8s
from prometheus_client import disable_created_metrics

from gpusizer import allocator
from gpusizer.actuate.routes import Routes
from gpusizer.actuate.targets import Targets
from gpusizer.api.v1alpha1 import Server
from gpusizer.catalog import load_catalog
from gpusizer.charge import Charge, LeaseRecord
from gpusizer.clock import CycleClock, FailingSince, fetch_cycle
from gpusizer.cluster import ClusterView
from gpusizer.compact import compact_dict
from gpusizer.fleet import Fleet
from gpusizer.kube import WORKER_THREADS, api_client
from gpusizer.lease import KubeLease, keep_charge, replica_identity
from gpusizer.measurement import Measurer
from gpusizer.memory import Memory
from gpusizer.peering import PeeringView
from gpusizer.ports import StatusSink
from gpusizer.reconcile import Services
from gpusizer.report import metrics, scrape
from gpusizer.report.turn import OutageDamping
from gpusizer.report.writer import StatusWriter
from gpusizer.rightsizing import RightSizer
from gpusizer.settings import OperatorSettings
from gpusizer.signals.autoscalers import AutoscalerLister, TargetKey
from gpusizer.signals.cache import PeriodicCache
from gpusizer.signals.discovery import OfferCache
from gpusizer.signals.health import PrometheusHealth
from gpusizer.signals.prometheus import WINDOW_QUERY_THREADS, PrometheusSource
from gpusizer.signals.reader import HistoryCache, LedgerCache, SnapshotReader
from gpusizer.sweep import Lister, PodSweep, pod_uids, workload_uids
from gpusizer.workload import Turns, Workload

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """Everything a workload's turn needs that outlives the turn."""

    services: Services
    memory: Memory
    status_writer: StatusSink
    clock: CycleClock
    executor: ThreadPoolExecutor
    decide_every: int = 1  # reads per sync period
    quiet_every: int = 1  # sync periods between a quiet workload's turns (fleet.py)
    pod_sweep: PodSweep = field(default_factory=PodSweep)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    watching: threading.Event = field(default_factory=threading.Event)  # set: watches stop
    # the uids of the WorkloadSizings the API server has now, in these namespaces (blocking)
    list_workloads: Lister | None = None
    turns: Turns | None = None  # what the fleet's turns go through, once the first event came
    fleet: Fleet[Workload] = field(init=False)
    turning: bool = field(init=False, default=False)
    confirming: asyncio.Task[None] | None = field(init=False, default=None)  # `took_over`

    def __post_init__(self) -> None:
        self.fleet = Fleet(self.clock, self.decide_every, self.quiet_every)

    def saw(self, namespace: str, name: str, body: kopf.Body, logger: kopf.Logger) -> None:
        """An event of a WorkloadSizing that exists: the fleet decides it from now on with
        this body, and asks it at the next read whether it changed. The turns start from the
        first event's handler: kopf posts Events through a queue it hands to its handlers
        alone (a context variable), and every turn runs in a copy of this one's context."""
        if self.turns is not None and not self.turning:
            self.turning = True
            turns = self.turns
            self.tasks.append(asyncio.create_task(self.fleet.run(turns.decide, turns.report)))
        workload = self.fleet.get((namespace, name))
        if workload is None or workload.uid != str(body.meta.uid or ""):
            workload = Workload(namespace, name, compact_dict(body), logger)
            workload.activator_pushed(body.meta.annotations)  # its first turn reads them
            self.fleet.join(workload)
            return
        workload.body, workload.logger = compact_dict(body), logger
        self.fleet.touch(workload.key)
        if workload.activator_pushed(body.meta.annotations):
            self.fleet.nudge(workload.key)

    def departed(self, namespace: str, name: str, uid: str) -> None:
        workload = self.fleet.get((namespace, name))
        if workload is not None and workload.uid == uid:
            self.fleet.leave(workload.key)

    def stop(self) -> None:
        """Reads and writes still queued for a worker thread are dropped (every decision is
        made again by the next process): asyncio would otherwise run all of them before
        exiting, past a pod's grace period at thousands of workloads. And the process exits
        within EXIT_GRACE_SECONDS, whatever kopf still waits for (`exit_watchdog`)."""
        for task in self.tasks:
            task.cancel()
        self.watching.set()
        self.executor.shutdown(wait=False, cancel_futures=True)
        exit_watchdog(EXIT_GRACE_SECONDS)

    def took_over(self, health: PrometheusHealth, predecessor: LeaseRecord | None) -> None:
        """Every workload decides at once (their turns while the peer was in charge were
        skipped), knowing the outages of Prometheus the predecessor saw, once the fleet holds
        only WorkloadSizings that exist (`confirm_fleet`). The latest cycle, read before, is
        restated with those outages: on the cycle as read, a loss the predecessor wrote
        quietly in an outage this replica did not see was taken for the workload's own, and
        its end posted MetricsRecovered (the soak, seed 38: bench/README.md)."""
        if predecessor is not None and predecessor.prometheus_outages:
            holder = predecessor.holder or "that freed the Lease"  # a release keeps them
            health.inherit(predecessor.prometheus_outages, holder)
            self.clock.restate(health.state)
        self.fleet.held = True
        self.confirming = asyncio.create_task(self.confirm_fleet())
        self.clock.wake()

    async def confirm_fleet(self) -> None:
        """kopf paused this replica's watches while its peer was in charge, and lists again
        when it resumes without ever saying what the new list lacks: a WorkloadSizing deleted
        meanwhile would take a turn, and write its target, before its status write found it
        gone. Those the API server no longer has leave the fleet before any turn starts; then
        every workload takes one."""
        try:
            if self.list_workloads is not None:
                members = list(self.fleet)
                namespaces = sorted({m.namespace for m in members})
                listed = await asyncio.to_thread(self.list_workloads, namespaces)
                left = self.fleet.confirm(members, listed)
                if left:
                    log.warning(
                        "%d WorkloadSizing(s) deleted while this replica was not in charge "
                        "left the fleet",
                        left,
                    )
        except Exception as exc:  # the API server is down: the turns' writes find out
            log.warning("listing WorkloadSizings on taking over failed: %s", exc)
        finally:
            self.fleet.release()
            self.fleet.nudge_all()

    def activator_replicas_changed(self) -> None:
        """The routes name the activator's replicas: the workloads routed to it rewrite theirs
        at once."""
        for workload in self.fleet:
            if workload.routed_to_activator():
                self.fleet.nudge(workload.key)


def lead(
    config: OperatorSettings,
    client: k8s.ApiClient,
    priority: int,
    runtime: Runtime,
    health: PrometheusHealth,
) -> Coroutine[Any, Any, None]:
    """With a peering, this replica acts only while it holds the operator's Lease: a replica
    that takes over knows the outages of Prometheus its predecessor saw, and decides every
    workload at once."""
    assert config.peering is not None and config.lease is not None  # the command line's
    charge = Charge(replica_identity())
    runtime.clock.in_charge = lambda: charge.held(time.monotonic())
    peering = PeeringView(client, config.peering, config.peering_namespace, priority)

    namespace, name = config.lease
    return keep_charge(
        charge,
        KubeLease(client, namespace, name),
        peering.leads,
        lambda: health.state.spans(),
        lambda predecessor: runtime.took_over(health, predecessor),
    )


# Once the operator stops, the process exits within this long. kopf, stopping by itself after
# an API request it gave up on, waited for ever for a re-authentication its stopped tasks could
# no longer give: the process lived on, deciding nothing (the soak, bench/README.md).
EXIT_GRACE_SECONDS = 90.0


def exit_watchdog(seconds: float, exit_now: Callable[[int], object] = os._exit) -> threading.Timer:
    """Ends the process in `seconds` unless it has ended by then (a daemon thread)."""

    def hung() -> None:
        log.error("the operator stopped %.0fs ago and has not exited: exiting now", seconds)
        logging.shutdown()
        exit_now(1)

    timer = threading.Timer(seconds, hung)
    timer.daemon = True
    timer.start()
    return timer


def start(
    config: OperatorSettings, peering_priority: int, view: ClusterView, sweep: PodSweep
) -> Runtime:
    """Builds the runtime, its turns over `view`, and starts the cycle clock, the `sweep` of
    the pods `view` holds, the metrics server and, with a peering, the report of which
    replica is in charge."""
    executor = ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="gpusizer")
    asyncio.get_running_loop().set_default_executor(executor)
    client = api_client()
    prometheus = PrometheusSource(config.prometheus)
    windows = PrometheusSource(config.prometheus, threads=WINDOW_QUERY_THREADS)
    catalog = load_catalog(Path(config.catalog_file) if config.catalog_file else None)
    targets = Targets(client)
    runtime: Runtime | None = None

    def activator_replicas_changed() -> None:
        if runtime is not None:
            runtime.activator_replicas_changed()

    routes = Routes(client, config.activator_service, activator_replicas_changed)
    history = HistoryCache(windows, config.rightsizing_period_seconds)
    services = Services(
        metrics=prometheus,
        targets=targets,
        routes=routes,
        right_sizer=RightSizer(
            catalog,
            history,
            OfferCache(catalog, config.sync_period_seconds),
            targets,
            reshape_deadline_seconds=config.reshape_deadline_seconds,
            min_reshape_interval_seconds=config.min_reshape_interval_seconds,
            measurer=Measurer(
                catalog,
                history,
                LedgerCache(windows, config.ledger_period_seconds),
                max_gap_seconds=config.max_accounted_gap_seconds,
            ),
            surprise_share=config.prediction_tolerance,
        ),
        tenancy=config.tenancy,
        damping=OutageDamping(config.outage_grace_seconds, config.outage_spread_seconds),
    )
    # the HPAs and ScaledObjects are listed once per sync period, not at every read: that
    # check is no more urgent than the decisions of workloads that did not change
    lister = AutoscalerLister(client)
    autoscalers: PeriodicCache[None, Mapping[TargetKey, str]] = PeriodicCache(
        lambda _: lister.list(), config.once_per_sync_period
    )
    # every signal for every pod once per sync period (memory once per right-sizing period, on
    # a lane no read waits for); in between, the pods that moved
    reader = SnapshotReader(
        prometheus,
        Server,
        config.once_per_sync_period,
        slow_every_seconds=config.rightsizing_period_seconds,
    )
    health = PrometheusHealth()
    clock = CycleClock(
        functools.partial(
            fetch_cycle,
            reader,
            health,
            functools.partial(autoscalers.get, None),
            FailingSince(),
        ),
        config.read_period,
    )
    memory, writer = Memory(), StatusWriter(client)
    runtime = Runtime(
        services,
        memory,
        writer,
        clock,
        executor,
        decide_every=config.decide_every,
        quiet_every=config.quiet_every,
        pod_sweep=sweep,
        list_workloads=functools.partial(workload_uids, client),
        turns=Turns(view, services, memory, writer),
    )
    reader.optional = runtime.fleet.optional_reads
    routes.start(runtime.watching)
    runtime.tasks.append(asyncio.create_task(clock.run()))
    runtime.tasks.append(
        asyncio.create_task(sweep.run(view.pods_by_namespace, functools.partial(pod_uids, client)))
    )
    runtime.tasks.append(asyncio.create_task(allocator.give_back_every()))
    if config.peering:
        runtime.tasks.append(
            asyncio.create_task(lead(config, client, peering_priority, runtime, health))
        )
    else:
        metrics.IN_CHARGE.set(1)
    # no `_created` twin for a counter, as the per-workload counters have none: they were a
    # tenth of the series, and writing /metrics a large share of the CPU (bench/README.md)
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream
    scrape.serve(config.metrics_port)
    log.info(
        "gpusizer started: prometheus %s, sync every %ss, metrics read every %ss",
        config.prometheus.url,
        config.sync_period_seconds,
        config.read_period,
    )
    return runtime
