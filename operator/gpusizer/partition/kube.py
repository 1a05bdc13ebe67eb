"""The Kubernetes side of re-partitioning (`ports.NodeClient`): node patches, evictions through
the Eviction API, and the mig-parted ConfigMap."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpusizer.catalog.migparted import CONFIG_KEY
from gpusizer.kube import UNANSWERED
from gpusizer.partition.objects import ConfigMapRef, PartitionProblem

MERGE_PATCH = "application/merge-patch+json"


def _reason(exc: ApiException) -> str:
    """The API server's own words: its Status message and the causes under it."""
    try:
        status = json.loads(exc.body or "{}")
    except ValueError:
        status = {}
    parts = [str(status.get("message") or f"HTTP {exc.status} {exc.reason}")]
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("message"):
            parts.append(str(cause["message"]))
    return ": ".join(parts)


class KubeNodes:
    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._core = k8s.CoreV1Api(api_client)

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as exc:
            raise PartitionProblem(f"{what}: {_reason(exc)}") from exc
        except UNANSWERED as exc:
            raise PartitionProblem(f"{what}: {exc}") from exc

    async def patch_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        unschedulable: bool | None = None,
    ) -> None:
        metadata: dict[str, Any] = {}
        if labels:
            metadata["labels"] = dict(labels)
        if annotations:
            metadata["annotations"] = dict(annotations)
        body: dict[str, Any] = {"metadata": metadata}
        if unschedulable is not None:
            body["spec"] = {"unschedulable": unschedulable}
        await self._call(
            f"patching node {name}", self._core.patch_node, name, body, _content_type=MERGE_PATCH
        )

    async def evict(self, namespace: str, name: str) -> str | None:
        eviction = k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=name, namespace=namespace))
        try:
            await asyncio.to_thread(
                self._core.create_namespaced_pod_eviction, name, namespace, eviction
            )
        except ApiException as exc:
            if exc.status == 404:
                return None  # gone already
            if exc.status == 429:  # a PodDisruptionBudget says not now
                return _reason(exc)
            raise PartitionProblem(f"evicting pod {namespace}/{name}: {_reason(exc)}") from exc
        except UNANSWERED as exc:
            raise PartitionProblem(f"evicting pod {namespace}/{name}: {exc}") from exc
        return None

    async def read_config(self, ref: ConfigMapRef) -> tuple[str | None, str]:
        found = await self._call(
            "reading", self._core.read_namespaced_config_map, ref.name, ref.namespace
        )
        data = found.data or {}
        return data.get(CONFIG_KEY), str(found.metadata.resource_version or "")

    async def write_config(self, ref: ConfigMapRef, text: str, resource_version: str) -> str:
        body = {"metadata": {"resourceVersion": resource_version}, "data": {CONFIG_KEY: text}}
        written = await self._call(
            "writing",
            self._core.patch_namespaced_config_map,
            ref.name,
            ref.namespace,
            body,
            _content_type=MERGE_PATCH,
        )
        return str(written.metadata.resource_version or "")
