"""Writes a WorkloadSizing's or a GPUPartitioning's status: the decisions run outside kopf's
handlers, so they patch the status subresource themselves."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpusizer.api import partitioning
from gpusizer.api.v1alpha1 import GROUP, PLURAL, VERSION
from gpusizer.kube import UNANSWERED


class StatusNotWritten(Exception):
    """The API server refused the status patch or could not be reached; the message is one
    line (an ApiException's text carries every response header)."""


async def _patched(call: Any, *args: Any) -> dict[str, Any]:
    """One status patch through the custom objects API: the status as the API server keeps it."""
    try:
        written = await asyncio.to_thread(call, *args)
    except ApiException as exc:
        missing = WorkloadGone if exc.status == 404 else StatusNotWritten
        raise missing(f"HTTP {exc.status} {exc.reason}") from exc
    except UNANSWERED as exc:
        raise StatusNotWritten(str(exc)) from exc
    status = written.get("status") if isinstance(written, Mapping) else None
    return dict(status) if isinstance(status, Mapping) else {}


class WorkloadGone(StatusNotWritten):
    """The object no longer exists (404): its deletion was missed, during a watch's outage."""


class StatusWriter:
    def __init__(self, client: k8s.ApiClient) -> None:
        self._api = k8s.CustomObjectsApi(client)

    async def write(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of the status; returns the status as the API server keeps it."""
        return await _patched(
            self._api.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": dict(patch)},
        )


class PartitioningStatusWriter:
    """The same for the cluster-scoped GPUPartitioning."""

    def __init__(self, client: k8s.ApiClient) -> None:
        self._api = k8s.CustomObjectsApi(client)

    async def write(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return await _patched(
            self._api.patch_cluster_custom_object_status,
            GROUP,
            VERSION,
            partitioning.PLURAL,
            name,
            {"status": dict(patch)},
        )
