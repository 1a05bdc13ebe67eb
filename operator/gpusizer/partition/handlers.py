"""Kopf registrations of GPU partitioning only: the watches it reads (every node, GPU pods,
WorkloadSizings waiting for slices, every GPUPartitioning's selector) and one timer per
GPUPartitioning that takes its turn (`partition.turn`). Called by `gpusizer.handlers.register`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf

from gpusizer.actuate.target_view import TargetView
from gpusizer.api.partitioning import PLURAL
from gpusizer.api.v1alpha1 import GROUP, VERSION
from gpusizer.api.v1alpha1 import PLURAL as SIZINGS
from gpusizer.catalog import load_catalog
from gpusizer.kube import IndexedPods, OnePerKey, api_client
from gpusizer.partition.kube import KubeNodes
from gpusizer.partition.objects import (
    ConfigMapRef,
    GpuNode,
    GpuPod,
    SizingDemand,
    gpu_node,
    gpu_pod,
    present_pods,
    sizing_demand,
)
from gpusizer.partition.turn import (
    PartitioningObject,
    PartitionServices,
    PartitionView,
    partition_turn,
)
from gpusizer.report.writer import PartitioningStatusWriter, StatusNotWritten
from gpusizer.settings import OperatorSettings


@dataclass(frozen=True)
class Partitioner:
    services: PartitionServices
    status: PartitioningStatusWriter


def _template(
    targets: Mapping[str, Mapping[tuple[str, str], TargetView]],
) -> Any:
    def lookup(namespace: str, kind: str, name: str) -> Mapping[str, Any] | None:
        found = targets.get(kind, {}).get((namespace, name))
        return found.pod_spec if found is not None else None

    return lookup


def register(settings: OperatorSettings, indexed_pod: IndexedPods) -> None:
    """Nothing when the operator watches only some namespaces: a drain evicts pods of every
    namespace, and the demand counts them all."""
    if not settings.partitioning:
        return

    @kopf.on.startup(id="partitioning")
    async def build(memo: kopf.Memo, **_: Any) -> None:
        config: OperatorSettings = memo.config
        client = api_client()
        catalog = load_catalog(Path(config.catalog_file) if config.catalog_file else None)
        services = PartitionServices(
            catalog,
            KubeNodes(client),
            ConfigMapRef.parse(config.mig_config_map),
            config_settle_seconds=config.mig_config_settle_seconds,
        )
        memo.partitioner = Partitioner(services, PartitioningStatusWriter(client))

    @kopf.index("", "v1", "nodes", id="partition_nodes")
    async def nodes(*, name: str, body: kopf.Body, **_: Any) -> dict[str, GpuNode]:
        return {name: gpu_node(body)}

    @kopf.index("", "v1", "pods", id="gpu_pods")
    async def pods(*, body: kopf.Body, **_: Any) -> dict[str, GpuPod] | None:
        pod = gpu_pod(body, indexed_pod(body))
        return {pod.key: pod} if pod is not None else None

    @kopf.index(GROUP, VERSION, SIZINGS, id="sizings_waiting")
    async def sizings(
        *, namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> dict[tuple[str, str], SizingDemand] | None:
        found = sizing_demand(body)
        return {(namespace or "", name): found} if found is not None else None

    @kopf.index(GROUP, VERSION, PLURAL, id="partitioning_selectors")
    async def selectors(*, name: str, spec: kopf.Spec, **_: Any) -> dict[str, dict[str, str]]:
        selector = spec.get("nodeSelector") or {}
        return {name: {str(k): str(v) for k, v in selector.items()}}

    @kopf.timer(GROUP, VERSION, PLURAL, id="partition", interval=settings.sync_period_seconds)
    async def partition(
        *, name: str, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **kwargs: Any
    ) -> None:
        if not memo.runtime.clock.in_charge():
            return  # another replica holds the operator's Lease (startup.lead)
        partitioner: Partitioner = memo.partitioner
        view = PartitionView(
            nodes=OnePerKey(kwargs["partition_nodes"]),
            pods=present_pods(kwargs["gpu_pods"], memo.runtime.pod_sweep.gone),
            sizings=list(OnePerKey(kwargs["sizings_waiting"]).values()),
            template=_template(
                {
                    "Deployment": OnePerKey(kwargs["deployments"]),
                    "StatefulSet": OnePerKey(kwargs["statefulsets"]),
                }
            ),
            selectors=OnePerKey(kwargs["partitioning_selectors"]),
        )
        obj = PartitioningObject(
            name=name,
            spec=dict(body.spec),
            status=dict(body.status),
            generation=body.meta.get("generation"),
        )
        outcome = await partition_turn(obj, view, partitioner.services, time.time())
        for event in outcome.events:
            kopf.event(body, type=event.type, reason=event.reason.value, message=event.message)
            logger.log(
                logging.WARNING if event.type == "Warning" else logging.INFO,
                "%s: %s",
                event.reason.value,
                event.message,
            )
        if outcome.status_patch:
            try:
                await partitioner.status.write(name, outcome.status_patch)
            except StatusNotWritten as exc:
                logger.warning("writing the status failed; written again next turn: %s", exc)
