"""Reading and scaling targets through their /scale subresource, so any scalable kind works.

The operator's one implementation of `gpusizer.ports.TargetClient`. The kubernetes client is
blocking; every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import (
    ConflictError,
    NotFoundError,
    ResourceNotFoundError,
)

from gpusizer.actuate.target_view import (
    SCALE_IN_SPEC,
    ScaleConflict,
    SliceChange,
    TargetNotFound,
    TargetNotScalable,
    TargetProblem,
    TargetUnanswered,
    TargetView,
    target_view,
)
from gpusizer.api.v1alpha1 import TargetRef
from gpusizer.catalog.models import PRODUCT_LABEL
from gpusizer.kube import UNANSWERED


@contextmanager
def _answered(what: str) -> Iterator[None]:
    """A request the API server never answered (connection refused or reset, a read timeout,
    urllib3's retries spent) is a TargetUnanswered: whether a write it carried landed is
    unknown, and the next turn reads the target again instead of deciding from its copy."""
    try:
        yield
    except UNANSWERED as exc:
        raise TargetUnanswered(
            f"{what}: the API server did not answer ({exc}); the target is read again next cycle"
        ) from exc


class Targets:
    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._api_client = api_client
        self._dynamic: DynamicClient | None = None

    def _resource(self, ref: TargetRef) -> Any:
        if self._dynamic is None:
            self._dynamic = DynamicClient(self._api_client)
        try:
            resource = self._dynamic.resources.get(api_version=ref.api_version, kind=ref.kind)
        except ResourceNotFoundError as exc:
            raise TargetNotScalable(
                f"spec.targetRef: the API server has no kind {ref.kind} in {ref.api_version}"
            ) from exc
        scale = resource.subresources.get("scale")
        if scale is None:
            raise TargetNotScalable(
                f"spec.targetRef: {ref.kind} {ref.api_version} has no /scale subresource"
            )
        return resource, scale

    def _read(self, namespace: str, ref: TargetRef) -> TargetView:
        resource, scale_resource = self._resource(ref)
        try:
            # raw JSON: the dynamic client's ResourceInstance wrapping costs more CPU than the
            # request itself, and this runs for every workload every cycle
            obj = json.loads(resource.get(name=ref.name, namespace=namespace, serialize=False).data)
            scale = None  # the object already says what /scale would
            if (ref.api_version, ref.kind) not in SCALE_IN_SPEC:
                scale = json.loads(
                    scale_resource.get(name=ref.name, namespace=namespace, serialize=False).data
                )
        except NotFoundError as exc:
            raise TargetNotFound(
                f"spec.targetRef: {ref.kind} {namespace}/{ref.name} does not exist"
            ) from exc
        return target_view(obj, scale)

    async def read(self, namespace: str, ref: TargetRef) -> TargetView:
        return await asyncio.to_thread(self._read, namespace, ref)

    def _write(self, namespace: str, ref: TargetRef, expected: int, replicas: int) -> None:
        with _answered(f"scaling {ref.kind} {namespace}/{ref.name} to {replicas}"):
            _, scale_resource = self._resource(ref)
            try:
                scale = scale_resource.get(name=ref.name, namespace=namespace).to_dict()
            except NotFoundError as exc:
                raise TargetNotFound(f"{ref.kind} {namespace}/{ref.name} disappeared") from exc
            now = int((scale.get("spec") or {}).get("replicas") or 0)
            if now != expected:
                raise ScaleConflict(
                    f"{ref.kind} {namespace}/{ref.name} changed to {now} replicas since it was "
                    f"read ({expected}); deciding again next cycle"
                )
            body = {
                "apiVersion": scale.get("apiVersion"),
                "kind": scale.get("kind"),
                "metadata": {
                    "name": ref.name,
                    "namespace": namespace,
                    "resourceVersion": (scale.get("metadata") or {}).get("resourceVersion"),
                },
                "spec": {"replicas": replicas},
            }
            try:
                scale_resource.replace(body=body, name=ref.name, namespace=namespace)
            except ConflictError as exc:
                raise ScaleConflict(
                    f"{ref.kind} {namespace}/{ref.name} changed while being scaled (409); "
                    "deciding again next cycle"
                ) from exc
            except ApiException as exc:
                raise TargetProblem(
                    f"scaling {ref.kind} {namespace}/{ref.name}: {exc.reason}"
                ) from exc

    async def write(self, namespace: str, ref: TargetRef, expected: int, replicas: int) -> None:
        """Set replicas, re-reading first: a change made since our read wins over our decision."""
        await asyncio.to_thread(self._write, namespace, ref, expected, replicas)

    def _reshape(self, namespace: str, ref: TargetRef, change: SliceChange) -> None:
        with _answered(f"changing the slice of {ref.kind} {namespace}/{ref.name}"):
            resource, _ = self._resource(ref)
            limits: dict[str, Any] = {change.new_resource: change.count}
            if change.old_resource != change.new_resource:
                limits[change.old_resource] = None  # strategic merge: null deletes the key
            body = {
                "metadata": {"annotations": dict(change.annotations)},
                "spec": {
                    "replicas": change.replicas,
                    "template": {
                        "spec": {
                            "nodeSelector": {PRODUCT_LABEL: change.product_label},
                            "containers": [
                                {
                                    "name": change.container,
                                    "resources": {"limits": limits, "requests": limits},
                                }
                            ],
                        }
                    },
                },
            }
            try:
                resource.patch(
                    body=body,
                    name=ref.name,
                    namespace=namespace,
                    content_type="application/strategic-merge-patch+json",
                )
            except NotFoundError as exc:
                raise TargetNotFound(f"{ref.kind} {namespace}/{ref.name} disappeared") from exc
            except ApiException as exc:
                raise TargetProblem(
                    f"changing the slice of {ref.kind} {namespace}/{ref.name}: {exc.reason}"
                ) from exc

    async def reshape(self, namespace: str, ref: TargetRef, change: SliceChange) -> None:
        """Move the pod template to another slice and set replicas for it, in one change."""
        await asyncio.to_thread(self._reshape, namespace, ref, change)

    def _annotate(self, namespace: str, ref: TargetRef, annotations: Mapping[str, str]) -> None:
        resource, _ = self._resource(ref)
        resource.patch(
            body={"metadata": {"annotations": dict(annotations)}},
            name=ref.name,
            namespace=namespace,
            content_type="application/merge-patch+json",
        )

    async def annotate(
        self, namespace: str, ref: TargetRef, annotations: Mapping[str, str]
    ) -> None:
        await asyncio.to_thread(self._annotate, namespace, ref, annotations)
