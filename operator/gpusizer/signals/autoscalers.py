"""Other autoscalers that own a target: the operator stands back from those.

Listed once per cycle for the whole cluster, so the cost does not grow with workloads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

TargetKey = tuple[str, str, str]  # (namespace, kind, name)


def owners_by_target(
    hpas: Iterable[Mapping[str, Any]], scaled_objects: Iterable[Mapping[str, Any]]
) -> dict[TargetKey, str]:
    """Which HPA or KEDA ScaledObject scales each target, as a phrase for the user."""
    owners: dict[TargetKey, str] = {}
    for hpa in hpas:
        meta, spec = hpa.get("metadata") or {}, hpa.get("spec") or {}
        ref = spec.get("scaleTargetRef") or spec.get("scale_target_ref") or {}
        namespace, name = meta.get("namespace"), ref.get("name")
        if namespace and name:
            owners[(namespace, ref.get("kind") or "Deployment", name)] = (
                f"HorizontalPodAutoscaler {meta.get('name')}"
            )
    for so in scaled_objects:
        meta, spec = so.get("metadata") or {}, so.get("spec") or {}
        ref = spec.get("scaleTargetRef") or {}
        namespace, name = meta.get("namespace"), ref.get("name")
        if namespace and name:
            owners[(namespace, ref.get("kind") or "Deployment", name)] = (
                f"KEDA ScaledObject {meta.get('name')}"
            )
    return owners


class AutoscalerLister:
    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._hpa = k8s.AutoscalingV2Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._api_client = api_client
        # a thread of its own: in the shared pool the cycle's list waited behind thousands of
        # queued status writes, and every workload waited for the cycle (bench/README.md)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autoscalers")

    def _list(self) -> dict[TargetKey, str]:
        hpas = self._api_client.sanitize_for_serialization(
            self._hpa.list_horizontal_pod_autoscaler_for_all_namespaces().items
        )
        try:
            scaled = self._custom.list_cluster_custom_object(
                "keda.sh", "v1alpha1", "scaledobjects"
            ).get("items", [])
        except ApiException as exc:
            if exc.status != 404:
                raise
            scaled = []  # KEDA is not installed
        return owners_by_target(hpas, scaled)

    async def list(self) -> dict[TargetKey, str]:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._list)
