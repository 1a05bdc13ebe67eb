"""Kopf registrations only: every decision lives in reconcile and below, everything built at
start-up in `startup`.

Registered by `register()` when the operator starts, so the sync period comes from settings
rather than from import time, and the runtime arrives through kopf's memo.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import kopf

from gpusizer import startup
from gpusizer.actuate.target_view import TargetView, target_view
from gpusizer.api.v1alpha1 import GROUP, PLURAL, VERSION
from gpusizer.cluster import ClusterView, PodLabelKey
from gpusizer.kube import IndexedPods, OnePerKey, drop_managed_fields, kopf_login
from gpusizer.partition import handlers as partitioning
from gpusizer.peering import peering_priority
from gpusizer.report import metrics
from gpusizer.settings import OperatorSettings
from gpusizer.signals.discovery import NodeInfo, node_info
from gpusizer.signals.pods import PodInfo, requests_gpu
from gpusizer.sweep import PodSweep

log = logging.getLogger(__name__)

# kopf retries a failed API request with these pauses, then gives up, and a peering or watch
# request that gives up stops the operator. kopf's own (1, 1, 2, 3, 5, 8, 13, 21: 54 s) did not
# outlast a graceful restart of the API server, and the soak lost both replicas to one; these
# outlast about five minutes (bench/README.md, the soak).
API_RETRY_BACKOFFS = (1, 1, 2, 3, 5, 8, 13, 21, *(30,) * 9)
# the kinds of the targets watched, by the resource's plural (the one kopf's events name)
TARGET_KINDS = {"deployments": "Deployment", "statefulsets": "StatefulSet"}
# kopf lists a kind in one response unless given a page size; page by page, the pods of one
# page are indexed and let go of while the next is fetched (indexing_gate.py). client-go's
# pager asks for 500.
LIST_PAGE_SIZE = 500


def register(settings: OperatorSettings) -> None:
    """The handlers below keep copies of what they read, never kopf's body or its views: the
    body of an event is emptied once its handlers return (indexing_gate.py)."""
    indexed_pod = IndexedPods()  # every pod index's, the partitioner's too

    @kopf.on.startup()
    async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
        config: OperatorSettings = memo.config
        settings.posting.level = logging.CRITICAL  # log lines are not Events; we post our own
        settings.networking.error_backoffs = API_RETRY_BACKOFFS
        settings.watching.chunk_size = LIST_PAGE_SIZE
        if config.peering:
            settings.peering.name = config.peering
            settings.peering.standalone = False
            settings.peering.mandatory = True
            settings.peering.priority = peering_priority(time.time())
        else:
            settings.peering.standalone = True
        # the indexes are filled later: every turn and the pod sweep read them live
        sweep = PodSweep()
        view = ClusterView(
            pods_by_namespace=kwargs["pods_by_namespace"],
            nodes=OnePerKey(kwargs["gpu_nodes"]),
            pods_by_label=kwargs["pods_by_label"],
            targets={kind: OnePerKey(kwargs[plural]) for plural, kind in TARGET_KINDS.items()},
            activator_ports=kwargs["activator_ports"],
            gone=sweep.gone,
        )
        memo.runtime = startup.start(config, settings.peering.priority, view, sweep)

    kopf.on.login(id="login")(kopf_login)

    @kopf.on.cleanup()
    async def drop_queued_work(memo: kopf.Memo, **_: Any) -> None:
        memo.runtime.stop()

    @kopf.on.probe(id="prometheus")
    async def prometheus_url(memo: kopf.Memo, **_: Any) -> str:
        config: OperatorSettings = memo.config
        return config.prometheus.url

    # The pods' and the targets' indexes see each of their events first: a quiet workload
    # that read the pod or scales the target is quiet no more (fleet.py).
    @kopf.index("", "v1", "pods", id="pods_by_namespace")
    async def pods_by_namespace(
        *, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
    ) -> dict[str, PodInfo]:
        runtime: startup.Runtime = memo.runtime
        runtime.fleet.touch_pod((namespace or "", name))
        return {namespace or "": indexed_pod(body)}

    @kopf.index("", "v1", "pods", id="pods_by_label")
    async def pods_by_label(
        *, namespace: str | None, body: kopf.Body, **_: Any
    ) -> dict[PodLabelKey, PodInfo]:
        info = indexed_pod(body)
        return {(namespace or "", key, value): info for key, value in info.labels.items()}

    # Targets from a watch rather than a GET per workload per cycle (bench/README.md). Only
    # GPU workloads are kept, so the cache grows with them and not with the cluster; any other
    # target is read with a GET.
    @kopf.index("apps", "v1", "deployments", id="deployments")
    @kopf.index("apps", "v1", "statefulsets", id="statefulsets")
    async def gpu_targets(
        *,
        namespace: str | None,
        name: str,
        body: kopf.Body,
        resource: kopf.Resource,
        memo: kopf.Memo,
        **_: Any,
    ) -> dict[tuple[str, str], TargetView] | None:
        runtime: startup.Runtime = memo.runtime
        runtime.fleet.touch_target((namespace or "", TARGET_KINDS[resource.plural], name))
        view = target_view(body)
        return {(namespace or "", name): view} if requests_gpu(view.pod_spec) else None

    # The port each workload's status records for the activator, so a new one gets a free one.
    @kopf.index(GROUP, VERSION, PLURAL, id="activator_ports")
    async def activator_ports(
        *, namespace: str | None, name: str, status: kopf.Status, **_: Any
    ) -> dict[int, tuple[str, str]] | None:
        port = (status.get("activator") or {}).get("port")
        return {port: (namespace or "", name)} if isinstance(port, int) else None

    @kopf.index("", "v1", "nodes", id="gpu_nodes")
    async def gpu_nodes(*, name: str, body: kopf.Body, **_: Any) -> dict[str, NodeInfo] | None:
        info = node_info(body)
        return {name: info} if info.allocatable else None

    @kopf.on.event(GROUP, VERSION, PLURAL)
    async def workload_event(
        *,
        type: str,
        name: str,
        namespace: str | None,
        body: kopf.Body,
        event: kopf.RawEvent,
        memo: kopf.Memo,
        logger: kopf.Logger,
        **_: Any,
    ) -> None:
        """Every event of a WorkloadSizing: its body loses what need not be kept, and the
        fleet decides it from then on with that body; a deleted one takes no more turns, and
        its series and remembered state go. kopf calls no handler but the indexes' until
        every index is filled, so no turn reads a half-filled one."""
        drop_managed_fields(event)
        if not namespace:
            return
        runtime: startup.Runtime = memo.runtime
        if type == "DELETED":
            runtime.departed(namespace, name, str(body.meta.uid or ""))
            metrics.WORKLOADS.forget(namespace, name)
            runtime.memory.forget(namespace, name)
        else:
            runtime.saw(namespace, name, body, logger)

    partitioning.register(settings, indexed_pod)
