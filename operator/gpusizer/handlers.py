"""Kopf registrations only: every decision lives in reconcile and below.

Registered by `register()` when the operator starts, so the sync period comes from settings
rather than from import time, and dependencies arrive through kopf's memo.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import random
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import kopf
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prometheus_client import disable_created_metrics, start_http_server

from gpusizer.actuate.targets import Targets, TargetView, target_view
from gpusizer.api.v1alpha1 import GROUP, PLURAL, VERSION, Server
from gpusizer.catalog import load_catalog
from gpusizer.cli import read_period_seconds
from gpusizer.reconcile import (
    ClusterView,
    Cycle,
    CycleClock,
    Dependencies,
    Outcome,
    PodLabelKey,
    fetch_cycle,
    reconcile,
)
from gpusizer.report import metrics
from gpusizer.report.status import StatusOverlay
from gpusizer.report.writer import StatusNotWritten, StatusWriter
from gpusizer.rightsizing import RightSizingSettings
from gpusizer.signals.autoscalers import AutoscalerLister, TargetKey
from gpusizer.signals.cache import PeriodicCache
from gpusizer.signals.discovery import NodeInfo, OfferCache, node_info
from gpusizer.signals.history import HistoryCache
from gpusizer.signals.parse import PodKey
from gpusizer.signals.pods import PodInfo, pod_info, requests_gpu
from gpusizer.signals.promql import Tenancy
from gpusizer.signals.source import PrometheusSettings, PrometheusSource, SnapshotReader

log = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")

WORKER_THREADS = 32
DECISION_GRACE_SECONDS = 30.0  # a decision under way when kopf stops its daemon
# The kubernetes client waits forever by default. A request cut off mid-way by a restarted or
# partitioned API server then held its decision, and its worker thread kept the process from
# exiting on SIGTERM (e2e/tests/test_faults.py). Each attempt now gives up after this long
# (urllib3 tries reads and PUTs up to four times) unless the request sets its own limit.
API_TIMEOUT_SECONDS = 10.0
# kopf's own requests (finalizers, peering) in flight at once; its watches are not counted.
KOPF_REQUESTS_AT_ONCE = 16


@dataclass(frozen=True)
class OperatorSettings:
    prometheus: PrometheusSettings
    tenancy: Tenancy = field(default_factory=Tenancy)
    sync_period_seconds: float = 15.0
    read_period_seconds: float | None = None  # at most the sync period; None: the default
    metrics_port: int = 8080
    peering: str | None = None  # a kopf peering name; None runs standalone
    catalog_file: str | None = None
    rightsizing_period_seconds: float = 60.0
    reshape_deadline_seconds: float = 600.0
    min_reshape_interval_seconds: float = 3600.0

    @property
    def read_period(self) -> float:
        return read_period_seconds(self.read_period_seconds, self.sync_period_seconds)


def api_client(timeout_seconds: float = API_TIMEOUT_SECONDS) -> k8s.ApiClient:
    """Kubernetes access the usual way: in-cluster, else KUBECONFIG."""
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    configuration = k8s.Configuration.get_default_copy()
    # one connection per worker thread; urllib3 otherwise opens (TLS) and drops extra ones
    configuration.connection_pool_maxsize = WORKER_THREADS
    client = k8s.ApiClient(configuration)
    instrument(client, timeout_seconds)
    return client


def instrument(client: k8s.ApiClient, timeout_seconds: float) -> None:
    """Every request of this client counts in gpusizer_kube_api_requests_total and gives up
    after `timeout_seconds` unless it sets its own limit."""
    rest = client.rest_client
    send = rest.request

    def instrumented(
        method: str, url: str, *args: Any, _request_timeout: Any = None, **kwargs: Any
    ) -> Any:
        metrics.KUBE_API_REQUESTS.labels(verb=method.upper()).inc()
        timeout = timeout_seconds if _request_timeout is None else _request_timeout
        return send(method, url, *args, _request_timeout=timeout, **kwargs)

    rest.request = instrumented


def one_connection_per_request_slot(at_once: int) -> aiohttp.ClientMiddlewareType:
    """At most `at_once` requests in flight, each read to its end before its slot frees, so
    its connection goes back to the pool for the next: kopf's pool is unbounded, and adding
    the finalizers of thousands of new WorkloadSizings at once opened a TLS connection for
    each, with a 256 KiB read buffer apiece (27 MiB of the operator's peak at 1,000,
    bench/README.md). Watches stream for hours and pass ungated."""
    slots = asyncio.Semaphore(at_once)

    async def gated(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        if request.url.query.get("watch") == "true":
            return await handler(request)
        async with slots:
            response = await handler(request)
            await response.read()
            return response

    return gated


async def kopf_login(**kwargs: Any) -> kopf.AiohttpSession | None:
    """kopf's own login through the kubernetes client's configuration, on a session whose
    requests share `KOPF_REQUESTS_AT_ONCE` connections."""
    info = kopf.login_via_client(**kwargs)
    if info is None:
        return None
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
        middlewares=(one_connection_per_request_slot(KOPF_REQUESTS_AT_ONCE),),
    )
    return kopf.AiohttpSession(
        aiohttp_session=session,
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
    )


def peering_priority(started: float, tiebreak: int | None = None) -> int:
    """The older replica wins: kopf pauses every replica when peers share a priority (then
    none acts), and a replica that starts later (a rolling update) waits for the one in charge
    to leave instead of taking over mid-cycle."""
    tiebreak = random.randrange(1000) if tiebreak is None else tiebreak
    return -int(started * 1000) * 1000 + tiebreak


def peers_ahead(status: Mapping[str, Any], priority: int, now: datetime.datetime) -> list[str]:
    """The live replicas of a kopf peering object's status with a higher priority than ours."""
    ahead = []
    for identity, peer in status.items():
        if not isinstance(peer, Mapping) or int(peer.get("priority") or 0) <= priority:
            continue
        try:
            seen = datetime.datetime.fromisoformat(str(peer.get("lastseen")))
        except ValueError:
            continue
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=datetime.UTC)
        if seen + datetime.timedelta(seconds=float(peer.get("lifetime") or 60)) > now:
            ahead.append(str(identity))
    return ahead


async def report_peering(
    client: k8s.ApiClient, name: str, priority: int, period_seconds: float
) -> None:
    """kopf says nothing when a replica starts paused behind another: log when this replica is
    paused and when it takes over, from the ClusterKopfPeering's status."""
    api = k8s.CustomObjectsApi(client)
    paused: bool | None = None
    while True:
        try:
            obj = await asyncio.to_thread(
                api.get_cluster_custom_object, "kopf.dev", "v1", "clusterkopfpeerings", name
            )
        except Exception as exc:  # namespaced peering, or no access: kopf still does its job
            log.debug("not reporting the peering state of %s: %s", name, exc)
            return
        ahead = peers_ahead(obj.get("status") or {}, priority, datetime.datetime.now(datetime.UTC))
        if bool(ahead) != paused:
            paused = bool(ahead)
            if paused:
                log.info("paused: %s of peering %s is in charge", ", ".join(ahead), name)
            else:
                log.info("active: this replica is in charge for peering %s", name)
        await asyncio.sleep(period_seconds)


def drop_managed_fields(event: Mapping[str, Any]) -> None:
    """Removes metadata.managedFields from a watch event's object, in place.

    kopf keeps each WorkloadSizing's latest body for its daemon: the very dict of the event its
    handlers receive (kopf 1.45, processing.py). managedFields was half of it, 9.9 of 20 KB
    (bench/README.md), and nothing reads it. controller-runtime's caches drop it the same way
    (TransformStripManagedFields)."""
    obj = event.get("object")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)


class OnePerKey(Mapping[K, V]):
    """A kopf index holding one value per key, read as a plain mapping without copying it:
    copying the GPU nodes for every workload every cycle was 7 % of the operator's time at
    1,000 workloads (bench/scale.py)."""

    def __init__(self, index: kopf.Index[K, V]) -> None:
        self._index = index

    def __getitem__(self, key: K) -> V:
        for value in self._index.get(key, ()):
            return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[K]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


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
        deps: Dependencies,
        writer: StatusWriter,
    ) -> None:
        """Decides on every cycle until `until` is done. A cycle is let go once decided on,
        before the status is written: while 5,000 workloads first start, thousands of status
        writes queue for the worker threads, and each decision waiting for its own kept a
        cycle's snapshot alive (bench/README.md)."""
        with clock.listening():
            async for cycle in clock.cycles(until=until, urgent=self.urgent, changed=self.changed):
                outcome = await self.decide(cycle, view, deps)
                del cycle  # nor kept while waiting for the next (CycleClock.cycles)
                if outcome is not None:
                    await self.report(outcome, writer)

    async def decide(self, cycle: Cycle, view: ClusterView, deps: Dependencies) -> Outcome | None:
        """The decision on `cycle`, scale writes included; None when it failed (logged)."""
        metrics.DECISION_LAG_SECONDS.observe(time.time() - cycle.snapshot.time)
        started = time.monotonic()
        self.generation = self.body.meta.get("generation")
        try:
            outcome = await reconcile(
                self.namespace,
                self.name,
                dict(self.body.spec),
                self.status.current(self.body.status),
                dict(self.body.meta.annotations),
                self.generation,
                view,
                cycle,
                deps,
            )
        except Exception:  # a bug: say so under the object's name, and decide again next cycle
            metrics.WORKLOADS.reconcile_failed(self.namespace, self.name)
            self.logger.exception("sizing failed; it is tried again within a sync period")
            return None
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
        self.pods = outcome.pods
        return outcome

    async def report(self, outcome: Outcome, writer: StatusWriter) -> None:
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

    async def _write(self, patch: Mapping[str, Any], writer: StatusWriter) -> None:
        outgoing = self.status.outgoing(patch)
        try:
            written = await writer.write(self.namespace, self.name, outgoing)
        except StatusNotWritten as exc:
            self.status.failed(outgoing)
            self.logger.warning(
                "writing the status failed; it goes out with the next cycle's: %s", exc
            )
            return
        self.status.wrote(written)
        for status_field in outgoing:
            metrics.STATUS_WRITES.labels(field=status_field).inc()


def register(settings: OperatorSettings) -> None:
    @kopf.on.startup()
    async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        config: OperatorSettings = memo.config
        settings.posting.level = logging.CRITICAL  # log lines are not Events; we post our own
        if config.peering:
            settings.peering.name = config.peering
            settings.peering.standalone = False
            settings.peering.mandatory = True
            settings.peering.priority = peering_priority(time.time())
        else:
            settings.peering.standalone = True
        # Every workload's target read, scale write and Prometheus query runs in a worker
        # thread; asyncio's default pool has min(32, CPUs + 4) threads, 6 on two cores, which
        # held 1,000 workloads to a 28 s cycle waiting for threads (bench/scale.py).
        memo.executor = ThreadPoolExecutor(
            max_workers=WORKER_THREADS, thread_name_prefix="gpusizer"
        )
        asyncio.get_running_loop().set_default_executor(memo.executor)
        client = api_client()
        prometheus = PrometheusSource(config.prometheus)
        catalog = load_catalog(Path(config.catalog_file) if config.catalog_file else None)
        memo.deps = Dependencies(
            prometheus=prometheus,
            targets=Targets(client),
            rightsizing=RightSizingSettings(
                catalog=catalog,
                history=HistoryCache(prometheus, config.rightsizing_period_seconds),
                offers=OfferCache(catalog, config.sync_period_seconds),
                reshape_deadline_seconds=config.reshape_deadline_seconds,
                min_reshape_interval_seconds=config.min_reshape_interval_seconds,
            ),
            tenancy=config.tenancy,
        )
        memo.status_writer = StatusWriter(client)
        # what is done once per sync period is done at the read nearest its end
        once_per_sync_period = config.sync_period_seconds - config.read_period / 2
        # the HPAs and ScaledObjects are listed once per sync period, not at every read:
        # that check is no more urgent than the decisions of workloads that did not change
        lister = AutoscalerLister(client)
        autoscalers: PeriodicCache[None, Mapping[TargetKey, str]] = PeriodicCache(
            lambda _: lister.list(), once_per_sync_period
        )
        # every signal for every pod once per sync period; in between, the pods that moved
        reader = SnapshotReader(prometheus, Server, once_per_sync_period)
        memo.clock = CycleClock(
            functools.partial(fetch_cycle, reader, functools.partial(autoscalers.get, None)),
            config.read_period,
            decide_every=int(config.sync_period_seconds // config.read_period),
        )
        memo.clock_task = asyncio.create_task(memo.clock.run())
        # no `_created` twin for each workload's counters: 3,700 series of 34,000 at 5,000
        # workloads, and rendering /metrics was a fifth of the operator's CPU there
        disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream
        start_http_server(config.metrics_port)
        if config.peering:
            memo.peering_report = asyncio.create_task(
                report_peering(
                    client,
                    config.peering,
                    settings.peering.priority,
                    max(5.0, config.sync_period_seconds),
                )
            )
        log.info(
            "gpusizer started: prometheus %s, sync every %ss, metrics read every %ss",
            config.prometheus.url,
            config.sync_period_seconds,
            config.read_period,
        )

    kopf.on.login(id="login")(kopf_login)

    @kopf.on.cleanup()
    async def drop_queued_work(memo: kopf.Memo, **_: Any) -> None:
        """On SIGTERM, reads and writes still queued for a worker thread are dropped (every
        decision is made again by the next process): asyncio would otherwise run all of them
        before exiting, over 30 s at 1,000 workloads, past a pod's grace period."""
        memo.clock_task.cancel()
        memo.executor.shutdown(wait=False, cancel_futures=True)

    @kopf.on.probe(id="prometheus")
    async def prometheus_url(memo: kopf.Memo, **_: Any) -> str:
        config: OperatorSettings = memo.config
        return config.prometheus.url

    @kopf.index("", "v1", "pods", id="pods_by_namespace")
    async def pods_by_namespace(
        *, namespace: str | None, body: kopf.Body, **_: Any
    ) -> dict[str, PodInfo]:
        return {namespace or "": pod_info(body)}

    @kopf.index("", "v1", "pods", id="pods_by_label")
    async def pods_by_label(
        *, namespace: str | None, body: kopf.Body, **_: Any
    ) -> dict[PodLabelKey, PodInfo]:
        info = pod_info(body)
        return {(namespace or "", key, value): info for key, value in info.labels.items()}

    # Targets from a watch rather than a GET per workload per cycle: at 1,000 workloads the GETs
    # and their JSON were a fifth of the operator's CPU (bench/scale.py). Only GPU workloads are
    # kept, so the cache grows with them and not with the cluster; any other target is read
    # with a GET, as before.
    @kopf.index("apps", "v1", "deployments", id="deployments")
    @kopf.index("apps", "v1", "statefulsets", id="statefulsets")
    async def gpu_targets(
        *, namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> dict[tuple[str, str], TargetView] | None:
        view = target_view(body)
        return {(namespace or "", name): view} if requests_gpu(view.pod_spec) else None

    @kopf.index("", "v1", "nodes", id="gpu_nodes")
    async def gpu_nodes(*, name: str, body: kopf.Body, **_: Any) -> dict[str, NodeInfo] | None:
        info = node_info(body)
        return {name: info} if info.allocatable else None

    # One daemon per WorkloadSizing, woken by the shared cycle clock rather than a timer of its
    # own: kopf starts it once its indexes are filled and stops it when the object goes or
    # when peering pauses this replica, so the clock only ever drives objects this replica
    # may act on. A decision under way when it is stopped finishes (`cancellation_backoff`);
    # one that fails unexpectedly is retried at the next period (`backoff`).
    @kopf.daemon(
        GROUP,
        VERSION,
        PLURAL,
        id="size_workload",
        backoff=settings.sync_period_seconds,
        cancellation_backoff=DECISION_GRACE_SECONDS,
        cancellation_timeout=DECISION_GRACE_SECONDS,
    )
    async def size_workload(
        *,
        name: str,
        namespace: str | None,
        body: kopf.Body,
        stopped: kopf.DaemonStopped,
        memo: kopf.Memo,
        logger: kopf.Logger,
        **kwargs: Any,
    ) -> None:
        assert namespace is not None  # WorkloadSizing is namespaced
        pods_by_namespace: kopf.Index[str, PodInfo] = kwargs["pods_by_namespace"]
        nodes_index: kopf.Index[str, NodeInfo] = kwargs["gpu_nodes"]
        view = ClusterView(
            pods_by_namespace=pods_by_namespace,
            nodes=OnePerKey(nodes_index),
            pods_by_label=kwargs["pods_by_label"],
            targets={
                "Deployment": OnePerKey(kwargs["deployments"]),
                "StatefulSet": OnePerKey(kwargs["statefulsets"]),
            },
        )
        workload = Workload(namespace, name, body, logger)
        stop = asyncio.ensure_future(stopped.wait())
        try:
            await workload.follow(memo.clock, stop, view, memo.deps, memo.status_writer)
        finally:
            stop.cancel()

    @kopf.on.event(GROUP, VERSION, PLURAL)
    async def workload_event(
        *,
        type: str,
        name: str,
        namespace: str | None,
        event: kopf.RawEvent,
        memo: kopf.Memo,
        **_: Any,
    ) -> None:
        """Every event of a WorkloadSizing: its body loses what kopf need not keep, and a
        deleted one's series and cached state go."""
        drop_managed_fields(event)
        if type == "DELETED" and namespace:
            metrics.WORKLOADS.forget(namespace, name)
            memo.deps.forget(namespace, name)
